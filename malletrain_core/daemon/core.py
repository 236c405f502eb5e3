"""The daemon's cycle: poll → journal → engine → backend, woken by hooks, fed by reports.

One cycle thread, one selector; the hook and report sockets are drained by reader threads
(:mod:`.intake`) into bounded queues whose pipes the selector watches, so the kernel's small
datagram queue does not fill while a cycle computes. Hook datagrams only wake the cycle
early (at once after a quiet spell, then at most one cycle per ``wake_delay_s`` while they
keep coming); the poll of the batch system is the truth. Every
batch of events is journalled before the engine sees it, so a restarted daemon replays the
journal into a fresh engine and then reconciles with the batch system. Batch-system command
failures skip one cycle (the next poll reconciles); only :class:`~malletrain_core.daemon.store.StateError` stops the
daemon.

The cycle, the recovery from the journal and the wake-ups share the daemon's lock, its journal
and its timers, so they are here; what the first poll after a restart means for the recovered
engine is :mod:`.reconcile`, the listeners are :mod:`.intake`, the wiring :mod:`.main`.
"""

from __future__ import annotations

import logging
import os
import selectors
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..engine.planner import Planner
from ..errors import CommandError
from ..events import Action, Event, Finish, Grow, Shrink, Tick
from ..interfaces import Backend
from . import snapshot as snapshots
from .drain import Drain
from .reconcile import after_restart, view_fixes
from .store import CorruptState, Store

log = logging.getLogger(__name__)

class Listener(Protocol):
    def fileno(self) -> int: ...


@dataclass
class Counters:
    """What the daemon has done, for ``malletrain status`` and the metrics endpoint."""

    cycles: int = 0
    events: int = 0
    actions: Counter[str] = field(default_factory=Counter)
    command_failures: int = 0
    view_fixes: int = 0  # polls after which the engine's nodes and the tasks differed
    last_cycle_ms: float = 0.0
    last_poll_time: float = 0.0
    # Milliseconds from a hook datagram's arrival to the batch-system command it led to
    # (the most recent ones; cycles woken by a hook that changed nothing are not counted).
    hook_to_action_ms: deque[float] = field(default_factory=lambda: deque(maxlen=1000))

    def hook_latency(self) -> dict[str, float | int]:
        """Count, median and p95 of :attr:`hook_to_action_ms`."""
        xs = sorted(self.hook_to_action_ms)
        if not xs:
            return {"count": 0}
        return {"count": len(xs), "median": xs[len(xs) // 2],
                "p95": xs[min(len(xs) - 1, int(0.95 * len(xs)))]}


class Daemon:
    """Drives one engine against one backend; see the module docstring."""

    def __init__(self, engine: Planner, backend: Backend, store: Store, *,
                 poll_interval_s: float = 5.0, wake_delay_s: float = 0.2,
                 wake_lead_s: float | None = None,
                 tick_interval_s: float = 5.0, idle_poll_interval_s: float | None = None,
                 clock: Callable[[], float] = time.time,
                 on_actions: Callable[[list[Action], float], None] | None = None,
                 journal_max_events: int | None = None) -> None:
        self.engine = engine
        self.backend = backend
        self.store = store
        self.poll_interval_s = poll_interval_s
        # Quiet polling: a cycle polls the batch system only when something may have changed
        # (a hook or API wake, the last poll's events or actions, work in flight in the
        # backend) or idle_poll_interval_s has passed; other cycles feed the engine reports
        # and ticks only. None or <= poll_interval_s: every cycle polls.
        self.idle_poll_interval_s = idle_poll_interval_s
        self._poke = True
        self._changed = True
        self._last_poll = float("-inf")
        self.polls = 0
        # The administrator's drain switch (:mod:`.drain`); None: never drained.
        self.drain: Drain | None = None
        # A wake runs the cycle wake_lead_s later (datagrams sent together are read by one
        # poll), but no sooner than wake_delay_s after the previous cycle: the first datagram
        # after a quiet spell is acted on at once (a node that fell idle is granted in tens of
        # milliseconds, not after a fixed delay), a burst costs one cycle per wake_delay_s.
        self.wake_delay_s = wake_delay_s
        self.wake_lead_s = backend.wake_lead_s if wake_lead_s is None else wake_lead_s
        self._last_cycle_end = float("-inf")
        self.tick_interval_s = tick_interval_s
        self._last_tick = float("-inf")
        self.clock = clock
        self.on_actions = on_actions
        # Compact the journal (engine snapshot + truncation) once it holds more events.
        self.journal_max_events = journal_max_events
        self.compactions = 0
        self._compact_after = 0
        # Called after every cycle (persisting state that is not in the journal).
        self.after_cycle: list[Callable[[], None]] = []
        self.counters = Counters()
        self.pending: list[Event] = []
        self.selector: selectors.BaseSelector = selectors.DefaultSelector()
        self._next_cycle = 0.0
        self._stopping = False
        self._hook_at: float | None = None
        self._recovered = False
        self._first_poll = True
        # Held by the cycle and by every API handler: the API server answers on its own
        # threads, the engine and the epoch coordinator are not thread-safe.
        self.lock = threading.RLock()
        # Other threads (API handlers) bring the next cycle forward through this pipe.
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self.selector.register(self._wake_r, selectors.EVENT_READ, (self._drain_wake, True))

    # -- recovery ---------------------------------------------------------------------------
    def recover(self) -> int:
        """Load the engine snapshot, if the journal was compacted, then replay the journal
        after it into the (fresh) engine; returns the number of batches replayed."""
        n = 0
        saved = self.store.snapshot()
        if saved is not None:
            try:
                snapshots.restore(self.engine, saved[1])
            except (snapshots.CorruptSnapshot, snapshots.UnknownFormat) as exc:
                raise CorruptState(f"{self.store.path}: the engine snapshot does not load "
                                   f"({exc})") from None
            log.info("recovered the engine snapshot at journal position %d", saved[0])
            self._recovered = True
        for batch in self.store.replay():
            self.engine.handle_many(batch)
            n += 1
        if n:
            log.info("recovered state from %d journalled batches", n)
        self._recovered = self._recovered or n > 0
        return n

    def compact(self, step: Callable[[str], None] | None = None) -> int:
        """Snapshot the engine and drop the journal it covers; returns the rows removed.
        Only between cycles: the engine must have consumed every journalled batch."""
        removed = self.store.compact(snapshots.snapshot(self.engine), step)
        self.compactions += 1
        self._compact_after = 0
        log.info("journal compacted: %d events replaced by an engine snapshot", removed)
        return removed

    def _maybe_compact(self) -> None:
        bound = self.journal_max_events
        if bound is None or self.store.rows <= max(bound, self._compact_after):
            return
        try:
            self.compact()
        except snapshots.SnapshotError as exc:
            # The journal still holds everything: keep going, try again a bound later.
            self._compact_after = self.store.rows + bound
            log.error("journal compaction failed, the journal keeps growing: %s", exc)

    def _after_recovery(self, events: list[Event], now: float, fresh: bool = False
                        ) -> list[Event]:
        """Reconcile the replayed engine with the first poll after a restart
        (:func:`.reconcile.after_restart`, ``fresh``: a daemon without state) and carry out
        again the shrinks that never reached the batch system."""
        self._recovered = False
        out, shrinks = after_restart(self.engine.node_map, events, now, fresh)
        if shrinks:
            try:
                out += self.backend.execute(shrinks, now)
            except CommandError as exc:
                self.counters.command_failures += 1
                log.warning("repeating %d shrinks failed: %s", len(shrinks), exc)
        return out

    # -- wiring -----------------------------------------------------------------------------
    def watch(self, listener: Listener, on_ready: Callable[[], list[Event] | None],
              wake: bool = False) -> None:
        """Call ``on_ready`` when ``listener`` is readable; its events join the next cycle,
        which is brought forward when ``wake`` is set (hooks)."""
        self.selector.register(listener, selectors.EVENT_READ, (on_ready, wake))

    def submit(self, events: list[Event]) -> None:
        """Queue events for the next cycle (reports, API-originated events)."""
        self.pending.extend(events)

    def notify(self) -> None:
        """Thread-safe :meth:`wake`: the selector returns and the cycle comes early."""
        try:
            os.write(self._wake_w, b"!")
        except (BlockingIOError, OSError):
            pass  # a wake-up is already pending (or the daemon is closing)

    def _drain_wake(self) -> None:
        try:
            while os.read(self._wake_r, 512):
                pass
        except (BlockingIOError, OSError):
            pass

    def close(self) -> None:
        """Release the selector and the wake-up pipe (the store is closed by its owner)."""
        self.selector.close()
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass

    def hook_wake(self) -> None:
        """A hook's datagram that calls for a poll, from a handler watched without ``wake``
        (one that wakes for some datagrams only)."""
        if self._hook_at is None:
            self._hook_at = time.perf_counter()
        self.wake()

    def wake(self) -> None:
        self._poke = True
        due = max(time.monotonic() + self.wake_lead_s, self._last_cycle_end + self.wake_delay_s)
        self._next_cycle = min(self._next_cycle, due)

    # -- the cycle --------------------------------------------------------------------------
    def poll_due(self) -> bool:
        """Whether this cycle must poll the batch system (see ``idle_poll_interval_s``)."""
        quiet = self.idle_poll_interval_s
        if quiet is None or quiet <= self.poll_interval_s or self._poke or self._changed:
            return True
        if self.backend.busy():
            return True
        return time.monotonic() - self._last_poll >= quiet

    def cycle(self) -> list[Action]:
        """One reconcile: poll, journal, decide, act. Returns the actions executed."""
        t0 = time.perf_counter()
        now = self.clock()
        events: list[Event] = []
        polled = self.poll_due()
        if polled:
            self._poke = False
            self._last_poll = time.monotonic()
            self.polls += 1
            try:
                events = self.backend.poll(now)
            except CommandError as exc:
                self.counters.command_failures += 1
                log.warning("poll failed, retrying next cycle: %s", exc)
                events = []
                self._poke = True
            else:
                self.counters.last_poll_time = now
                if self._recovered:
                    events = events + self._after_recovery(events, now)
                elif self._first_poll:
                    events = events + self._after_recovery(events, now, fresh=True)
                self._first_poll = False
        self._changed = bool(events)
        events = self.pending + events
        self.pending = []
        if now - self._last_tick >= self.tick_interval_s:
            # Time-based decisions (profiling windows) progress on ticks; journalled like any
            # event so that a replay decides exactly as the live daemon did.
            events.append(Tick(now))
            self._last_tick = now
        if self.drain is not None:
            events, forced = self.drain.filter(self.engine, events, now)
            if forced:
                self._changed = True
                for shrink in forced:
                    self.counters.actions[type(shrink).__name__] += 1
                    log.info("job %s: shrink %s (drained)", shrink.job_id,
                             ",".join(shrink.nodes))
                try:  # what comes back (a shrink refused: WorkerStarted) is filtered again
                    self.pending.extend(self.backend.execute(forced, now))
                except CommandError as exc:
                    self.counters.command_failures += 1
                    log.warning("drain: %d shrinks failed; the next poll reconciles: %s",
                                len(forced), exc)
        executed, events = self._decide(events, now)
        if polled and not events:
            fixes = self._fix_view(now)
            if fixes:
                more, events = self._decide(fixes, now)
                executed += more
        if events:
            # The last round's follow-ups (grows that failed at once): handled by the next
            # cycle, never dropped. Dropped, the engine kept nodes the backend had taken back
            # and waited for workers that would never start.
            self.pending.extend(events)
            self._poke = True
        self._hook_at = None
        self._maybe_compact()
        self.counters.cycles += 1
        self.counters.last_cycle_ms = (time.perf_counter() - t0) * 1e3
        for hook in self.after_cycle:
            hook()
        return executed

    def _decide(self, events: list[Event], now: float) -> tuple[list[Action], list[Event]]:
        """Journal ``events``, let the engine decide, carry its actions out; again with what
        the backend returns at once, three rounds at most. Returns the actions executed and
        the follow-up events left for the next cycle."""
        executed: list[Action] = []
        for _ in range(3):  # the backend's immediate follow-up events, bounded
            if not events:
                break
            self.store.append(events)
            self.counters.events += len(events)
            actions = self.engine.handle_many(events)
            events = []
            if not actions:
                break
            for action in actions:
                self.counters.actions[type(action).__name__] += 1
                if isinstance(action, (Grow, Shrink, Finish)):
                    log.info("job %s: %s %s", action.job_id, type(action).__name__.lower(),
                             ",".join(action.nodes) if not isinstance(action, Finish) else "")
            try:
                events = self.backend.execute(actions, now)
                if self._hook_at is not None:
                    self.counters.hook_to_action_ms.append(
                        (time.perf_counter() - self._hook_at) * 1e3)
                    self._hook_at = None
            except CommandError as exc:
                self.counters.command_failures += 1
                log.warning("executing %d actions failed; the next poll reconciles: %s",
                            len(actions), exc)
                events = []
            executed.extend(actions)
            self._changed = True
            if self.on_actions is not None:
                self.on_actions(actions, now)
        return executed, events

    def _fix_view(self, now: float) -> list[Event]:
        """After a poll: what corrects the engine where its nodes and the batch system's tasks
        differ (:func:`.reconcile.view_fixes`); the shrinks it needs are carried out here."""
        view = self.backend.view()
        if view is None:
            return []
        events, shrinks = view_fixes(self.engine.node_map, view, now)
        if events or shrinks:
            self.counters.view_fixes += 1
        try:
            events += self.backend.execute(shrinks, now) if shrinks else []
        except CommandError as exc:
            self.counters.command_failures += 1
            log.warning("%d shrinks failed; the next poll looks again: %s", len(shrinks), exc)
        return events

    def run_once(self, timeout_s: float | None = None) -> None:
        """Wait for input or the next cycle, then run whatever is due."""
        now = time.monotonic()
        wait = max(0.0, self._next_cycle - now)
        if timeout_s is not None:
            wait = min(wait, timeout_s)
        for key, _ in self.selector.select(wait):
            on_ready, wake = key.data
            try:
                events = on_ready()
            except Exception:  # noqa: BLE001 - one bad input never stops the daemon
                log.exception("input handler failed")
                continue
            if events:
                self.pending.extend(events)
            if wake:
                if self._hook_at is None and on_ready != self._drain_wake:
                    self._hook_at = time.perf_counter()
                self.wake()
        if time.monotonic() >= self._next_cycle:
            hooked = self._hook_at is not None
            with self.lock:
                executed = self.cycle()
            self._last_cycle_end = time.monotonic()
            self._next_cycle = self._last_cycle_end + self.poll_interval_s
            if hooked and not executed:
                # A datagram can come before the batch system shows its change (Slurm runs
                # the EpilogSlurmctld of a preempted task while the task still completes):
                # look again wake_delay_s later rather than a whole poll interval.
                self._poke = True
                self._next_cycle = min(self._next_cycle,
                                       self._last_cycle_end + self.wake_delay_s)

    def run(self) -> None:
        """Until :meth:`stop` (a signal handler calls it)."""
        while not self._stopping:
            self.run_once()

    def stop(self, *_: Any) -> None:
        self._stopping = True
        self._next_cycle = 0.0
        self.notify()
