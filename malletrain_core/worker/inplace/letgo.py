"""Letting go of old groups: shut down, aborted or forgotten beside the next one.

A re-form never waits for the group it replaces: torch.distributed forgets that group at once
and a thread of its own shuts it down (:class:`_Retiring`); an abandoned NCCL operation is
aborted the same way; an abandoned gloo group cannot be, so it is kept referenced
(:class:`_Abandoned`) until its operations end, and the process then leaves with ``os._exit``.
:class:`OldGroups` keeps those of one process and whether it still holds one.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .. import training


@dataclass(eq=False)
class _Abandoned:
    """A group left with an operation pending (see :meth:`.group.GroupMember._teardown`): kept
    referenced, so that no destructor waits for that operation, until :meth:`ended`."""

    group: Any
    store: Any
    net: Any
    works: list[Any]

    def ended(self) -> bool:
        """Whether every operation issued on the group has ended (done, failed by a lost
        peer, or timed out): shutting it down then waits for nothing."""
        return all(w.is_completed() for w in self.works)


class _Retiring:
    """The previous epoch's group, let go in a thread of its own while the next one trains.

    Shutting an NCCL communicator down takes 0.45-0.50 s and aborting one 1.0 s on an H100
    whatever the settings; a group formed beside it trains at once (measured: a re-form in
    0.015-0.053 s, thousands of all-reduces on the new group during the old one's tear-down).
    The thread runs ``shutdown()`` (``abort()`` for an abandoned NCCL operation), then drops
    the old DDP, the group and its store, and only then the works they ran (a work freed
    before its group's threads are joined can need the GIL on a gloo thread, see
    :class:`.pending._Pending`)."""

    def __init__(self, kind: str, epoch: int | None, backend: str, parts: list[Any],
                 works: list[Any]) -> None:
        self.kind, self.epoch, self.backend = kind, epoch, backend
        self.started = time.monotonic()
        self.seconds: float | None = None
        self.error: str | None = None
        self.done = threading.Event()
        self._parts, self._works = parts, works   # [old net, group, store]
        self.thread = threading.Thread(target=self._run, name=f"malletrain-{kind}",
                                       daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            let_go = _abort_group if self.kind == "abort" else _shutdown_group
            if self._parts[1] is not None:
                let_go(self._parts[1])
        except BaseException as exc:  # noqa: BLE001 - reported by OldGroups.retired_within
            # kept as text: the exception's traceback would hold the group (its frames) and
            # this object (a cycle that only a full garbage collection frees), and with the
            # group its sockets and its gloo thread
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            self._parts.clear()   # frees the old DDP, the group and its store
            self._works.clear()   # then the works its threads ran
            self.seconds = time.monotonic() - self.started
            self.done.set()

    def summary(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "kind": self.kind,
                "seconds": round(self.seconds or 0.0, 4), "error": self.error}


def _shutdown_group(group: Any) -> None:
    """Shut a forgotten group down (what ``destroy_process_group`` does to it)."""
    group.shutdown()


def _abort_group(group: Any) -> None:
    """Abort a forgotten group's communicators, which ends the operations they hold (NCCL)."""
    group.abort()


def abandon_action(backend: str) -> str:
    """How a group holding an abandoned operation is let go, by its backend's name:
    ``"abort"`` for NCCL (its communicators can be aborted, which ends the operations they
    hold), ``"forget"`` for gloo and anything else (an abandoned gloo operation cannot be
    aborted: the group is forgotten, kept referenced, and the process leaves with
    ``os._exit``)."""
    return "abort" if "nccl" in str(backend).lower() else "forget"


ABORT_BOUND_S = 15.0
"""How long letting go of an old group (its shut-down, or the abort of an abandoned NCCL
operation) may take before the process gives up on it (an abort can itself hang on a
communicator stuck in the driver): on an H100 a shut-down takes 0.5 s and an abort 1.0 s; past
the bound the node's processes leave and are started again (the restart path). A shut-down
may also wait for the collective timeout (see :meth:`OldGroups.bound`); a process can set one
bound for both, :attr:`.elastic.Elastic.retire_bound_s`."""
EXIT_ABORT_HUNG = training.RESTART_EXIT_CODE
"""The exit code of a process whose NCCL abort did not return within :data:`ABORT_BOUND_S`:
``malletrain-run --inplace`` starts the node's processes again at once, and the new ones join
the membership file's epoch, taking the state from its members (the restart path)."""


def _abort_default_group() -> None:
    """Abort every communicator of this process's groups and clear torch.distributed's
    records of them: ``torch.distributed.distributed_c10d._abort_process_group`` (torch 2.13;
    experimental there, NCCL only); measured on one H100 by ``python -m bench.gpu``
    (BENCHMARKS.md, section GPU: 1.0 s)."""
    from torch.distributed import distributed_c10d as c10d

    c10d._abort_process_group()


def _forget_default_group() -> None:
    """Clear torch.distributed's record of the default group without shutting it down
    (what ``destroy_process_group`` does, less the backend shutdown that would block on an
    abandoned operation). Uses torch's private bookkeeping, checked with torch 2.13."""
    from torch.distributed import distributed_c10d as c10d

    world = c10d._world
    c10d._update_default_pg(None)
    for table in (world.pg_map, world.pg_names, world.pg_group_ranks, world.pg_backend_config,
                  world.pg_to_tag, world.tags_to_pg, world.pg_coalesce_state):
        table.clear()
    c10d._unregister_all_process_groups()
    world.group_count = 0


class OldGroups:
    """The groups one process let go of: the last one being shut down or aborted in its
    thread (:attr:`retiring`, at most one at a time), the abandoned gloo groups kept
    referenced (:attr:`graveyard`), what letting go of each took (:attr:`retired`), and
    :attr:`held`: whether this process holds an abandoned operation or a group whose
    let-go did not return, so that it must leave with ``os._exit``. ``abandoned()`` says
    whether the current group's operations were abandoned."""

    def __init__(self, timeout_s: float, abandoned: Callable[[], bool]) -> None:
        self.timeout_s = timeout_s
        self.abandoned = abandoned
        self.bound_s: float | None = None  # None: bound(kind)
        self.graveyard: list[_Abandoned] = []
        self.retiring: _Retiring | None = None
        self.retired: list[dict[str, Any]] = []
        self.held = False
        self.exit_code = 0

    def forget(self, gone: _Abandoned) -> None:
        """Keep an abandoned gloo group referenced until its operations end (:meth:`reap`)."""
        if not self.held:
            self.held = True
            self._watch_for_crash()
        self.graveyard.append(gone)

    def retire(self, kind: str, epoch: int | None, backend: str, parts: list[Any],
               works: list[Any]) -> None:
        """Let ``parts`` ([old net, group, store]) go in a thread (see :class:`_Retiring`)."""
        self.retiring = _Retiring(kind, epoch, backend, parts, works)
        if kind == "abort":
            self.held = True  # until the abort returns (settle)

    def settle(self, wait: bool) -> str:
        """Forget the group let go in the background once its thread is done; ``wait``: wait
        for it, at most until its bound. Past the bound, why the process must leave for the
        restart path (:data:`EXIT_ABORT_HUNG`: it cannot be trusted with the device any
        more); "" otherwise."""
        r = self.retiring
        if r is None or self.retired_within(r, wait):
            return ""
        if r.started + self.bound(r.kind) > time.monotonic():
            return ""
        self.held = True  # leave with os._exit: nothing may wait on that group
        return (f"the {r.kind} of epoch {r.epoch}'s {r.backend} group did not return within "
                f"{self.bound(r.kind):g} s: this node's processes leave and are started again "
                "(the restart path)")

    def retired_within(self, r: _Retiring, wait: bool) -> bool:
        """Whether ``r`` is done (``wait``: waiting at most until its bound); once it is, it
        is forgotten and what it took recorded in :attr:`retired`."""
        left = r.started + self.bound(r.kind) - time.monotonic()
        if not r.done.wait(max(0.0, left) if wait else 0.0):
            return False
        self.retiring = None
        self.retired.append(r.summary())
        if r.error is not None:
            print(f"malletrain: letting go of epoch {r.epoch}'s {r.backend} group ({r.kind}) "
                  f"failed: {r.error}", file=sys.stderr, flush=True)
        self.held = bool(self.graveyard) or self.abandoned()
        return True

    def bound(self, kind: str) -> float:
        """How long letting go of an old group may take (:attr:`bound_s` when set): an abort
        :data:`ABORT_BOUND_S`; a shut-down as long too, or until the collective timeout has
        ended any operation still pending on it (a gloo group whose peer failed in a step can
        hold one; its shut-down then waits for it) and 5 s more."""
        if self.bound_s is not None:
            return self.bound_s
        return ABORT_BOUND_S if kind == "abort" else max(ABORT_BOUND_S, self.timeout_s + 5.0)

    def reap(self) -> None:
        """Shut down the abandoned groups whose operations have all ended (failed when their
        peer was lost, or timed out). Kept, such a group costs a CPU core: its peers' data for
        the operation it gave up stays unread in its sockets, and gloo's event loop wakes for
        it without pause (one thread used 38 CPU-s in 39 s in the demo, until its process was
        preempted). Freeing it closes those sockets and joins its threads, which are idle."""
        ended = [g for g in self.graveyard if g.ended()]
        if not ended:
            return
        self.graveyard = [g for g in self.graveyard if g not in ended]
        for g in ended:
            works, g.works = g.works, []
            g.group = g.store = g.net = None  # frees the group: joins its threads
            works.clear()                     # then the works they ran (see _Pending)
        self.held = bool(self.graveyard) or self.abandoned()

    def exit_if_held(self, code: int) -> None:
        """Leave at once (``os._exit``) when an operation or a group being let go could make
        the interpreter's exit wait or abort; the group of the last epoch is waited for, up to
        its bound (a daemon thread inside torch's C++ at exit aborts the process)."""
        r = self.retiring
        if r is not None and not self.retired_within(r, wait=True):
            self.held = True
        if self.held:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)

    def _watch_for_crash(self) -> None:
        """Remember an uncaught exception, so the forced exit keeps a failing exit code."""
        previous = sys.excepthook

        def hook(kind: Any, value: Any, tb: Any) -> None:
            self.exit_code = 1
            previous(kind, value, tb)

        sys.excepthook = hook
