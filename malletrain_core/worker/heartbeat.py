"""In place: the survivors find a dead or hung peer themselves, without an order.

Each training process of an epoch (world > 1) beats every :data:`PERIOD_S` into the epoch's
store (the TCPStore that rank 0's process hosts for the group), over a client connection of its
own: ``add(malletrain/<epoch>/hb/<rank>, 1)``. Each rank watches the next one round the ring
(its counter must move) and the store itself (its calls must succeed). A peer whose counter
has not moved for ``timeout_s`` (a process killed, a node gone, a process stopped), or a
store that has not answered for as long (rank 0 gone), is lost: the rank that saw it says so in
the store (``malletrain/<epoch>/lost``, read by every rank at each beat), and each survivor
abandons the epoch's operations at once and tells its launcher which nodes went silent (the
control folder's ``peers_lost``), which tells the daemon at its next check-in.

Three calls per beat, rank and epoch watched, so rank 0's store serves ``3 × world / PERIOD_S``
calls a second. The beat runs on a Python thread: a process whose main thread holds the GIL
longer than ``timeout_s`` looks hung; ``MALLETRAIN_PEER_TIMEOUT_S`` raises the bound.

The store calls run on a thread of their own (one per epoch watched, for as long as it is
watched: :class:`_Caller`), waited for at most :data:`IO_WAIT_S` per beat: a
client's call to a store whose process hangs (SIGSTOP, a process stuck in the kernel) never
returns — torch's TCPStore client has no timeout on ``add``, and the kernel still accepts
connections for a stopped process — so a beat that made the calls itself hung with it and the
survivors of a hung rank 0 never found it.

A process may be in two epochs at once: the one its group was formed for, and, from the moment
it is told, the one it re-forms into (its main thread may still be in a step of the first). The
beat watches each on its own, in its own store (:mod:`.inplace` hosts the new epoch's store on
its rank 0 as soon as that process is told), so a peer that stops during a re-form — before
its main thread reaches the step boundary, while the members meet at the new store, or while
the new group is made — is found within the same bound as in training. A peer that never beats
in the new epoch (or a store that never answers) is silent from the moment the watcher was told
it once a loss was found in any epoch watched (a peer stopped as the epoch is told is found in
the epoch it trained in first: there the bound is always ``timeout_s``, even for a store or a
peer not yet heard by this watcher, as everyone formed that group, and the silence is counted
from the moment it formed), else after :data:`TOLD_WAIT_S`: the daemon hands an epoch's
orders to its launchers together, unless it dies between two of them.
"""

from __future__ import annotations

import datetime as dt
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .control import Membership

PERIOD_S = 0.2
PEER_TIMEOUT_S = 1.25
"""The default silence after which a peer is lost: with :data:`PERIOD_S`, found within
``PEER_TIMEOUT_S + PERIOD_S`` (1.45 s) of its last beat. A store held 5 s by its own reverse
name lookup once looked like a silent rank 0: see :func:`.inplace.listen_on`."""
ENV_PEER_TIMEOUT = "MALLETRAIN_PEER_TIMEOUT_S"
TOLD_WAIT_S = 10.0
"""How long a peer that has not beaten at all in a newly told epoch (or a store nothing listens
on yet) is waited for while every epoch this process watches is sound: the daemon tells an
epoch's launchers together, but if it dies between two of them the others are told only once it
is back. A peer stopped as the epoch is told is found in the epoch it trained in first, and then
the normal bound applies here too; a store that listens was told (its host listens only once
told), so one that accepts connections but never answers gets the normal bound from its first
accepted connection. An epoch whose group this process let go to re-form is no longer watched
(:meth:`.inplace.watch.ControlWatch._formed`): its store was shut down on purpose."""
IO_WAIT_S = PERIOD_S
"""How long a beat waits for its store calls; a call that returns later still counts (at the
next beat, as answered when it returned)."""


def peer_timeout_s(env: dict[str, str] | os._Environ[str] = os.environ) -> float:
    """``MALLETRAIN_PEER_TIMEOUT_S`` (seconds > 2 × :data:`PERIOD_S`), else the default."""
    text = env.get(ENV_PEER_TIMEOUT, "")
    if not text:
        return PEER_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 2 * PERIOD_S < value < float("inf"):
        raise ValueError(f"{ENV_PEER_TIMEOUT}={text!r}: give the seconds of silence after "
                         f"which a peer is lost (more than {2 * PERIOD_S:g}; default "
                         f"{PEER_TIMEOUT_S:g})")
    return value


@dataclass
class Lost:
    """What a beat found: the global ranks gone silent in ``epoch`` (empty: not known which,
    another rank saw it) and why."""

    epoch: int
    ranks: list[int]
    why: str


@dataclass
class _Exchange:
    """One beat's store calls: (the watched counter, the lost flag) and when they returned,
    once they have (``done`` set, whatever the outcome)."""

    result: tuple[int, int] | None = None
    done_at: float | None = None
    done: threading.Event = field(default_factory=threading.Event)


class _Caller:
    """The store calls of one watched epoch, on one thread for as long as the epoch is
    watched: :meth:`submit` hands it a beat's exchange unless the last one is still in flight
    (a hung store then holds this one thread; the beat judges the silence), :meth:`close`
    ends it once its call in flight, if any, returns. Before: a new thread per beat and epoch
    (five a second per rank)."""

    def __init__(self, calls: Callable[[_Exchange], None], name: str) -> None:
        self._calls = calls
        self._cv = threading.Condition()
        self._next: _Exchange | None = None
        self._busy = False
        self._closed = False
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def submit(self) -> _Exchange | None:
        """A new exchange, queued, or None while the previous one has not returned."""
        with self._cv:
            if self._busy or self._closed:
                return None
            self._next, self._busy = _Exchange(), True
            self._cv.notify()
            return self._next

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify()

    def _run(self) -> None:
        while True:
            with self._cv:
                while self._next is None and not self._closed:
                    self._cv.wait()
                if self._closed:
                    return
                io, self._next = self._next, None
            assert io is not None
            try:
                self._calls(io)
            except Exception:  # noqa: BLE001 - a failed call is a beat not answered
                pass
            finally:
                with self._cv:
                    self._busy = False
                io.done.set()


@dataclass
class _Watch:
    """What the beat knows of one epoch it watches."""

    m: Membership
    moved_at: float                    # the watched counter's last move (or the watch's start)
    answered_at: float                 # the store's last answer (or the watch's start)
    client: Any = None
    watched: int | None = None         # the next rank's counter, when it last moved
    done: bool = False                 # this epoch's loss was reported
    heard: bool = False                # the store answered once
    formed: bool = False               # the process formed its group here: all were told
    listening_at: float | None = None  # when the store first accepted a connection: its host
    #                                    was told (an untold host listens on nothing)
    io: _Exchange | None = None        # store calls in flight (or done, not yet read)
    caller: _Caller | None = None      # the thread that makes them


def _accepts(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=PERIOD_S):
            return True
    except OSError:
        return False


Current = Callable[[], "Membership | None | Sequence[Membership | None]"]


class Heartbeat:
    """One process's beat and watch, for the memberships ``current()`` returns: one (None:
    none formed, or alone) or several, each watched on its own: first the epoch whose group
    the process formed and trains in (None: none), then the one it re-forms into. A silence in
    the first is judged by ``timeout_s`` alone (its members were all told: they formed the
    group); ``on_lost`` is called once per epoch in which a peer went
    silent. ``host(m)``, if given, is called before the first store call of an epoch in which
    this process is rank 0: it makes the store listen (see :mod:`.inplace`, which hosts an
    epoch's store from the moment it is told). :meth:`beat` is one round (the thread calls it
    every :data:`PERIOD_S`; tests call it)."""

    def __init__(self, current: Current, on_lost: Callable[[Lost], None],
                 timeout_s: float = PEER_TIMEOUT_S, clock: Callable[[], float] = time.monotonic,
                 host: Callable[[Membership], None] | None = None) -> None:
        self.current = current
        self.on_lost = on_lost
        self.timeout_s = timeout_s
        self.clock = clock
        self.host = host
        self._watches: dict[int, _Watch] = {}  # by epoch
        self._loss_at = -float("inf")          # when a loss was last found, in any epoch
        self._poke = threading.Event()         # set: beat at once (:meth:`wake`)

    def wake(self) -> None:
        """Beat now instead of at the period's end (the process just formed a new group: the
        old epoch's watch and its thread go, the new one's starts)."""
        self._poke.set()

    def run(self, stop: threading.Event) -> None:
        try:
            while True:
                self._poke.wait(PERIOD_S)
                self._poke.clear()
                if stop.is_set():
                    break
                try:
                    self.beat()
                except Exception:  # noqa: BLE001 - the beat must never end the process
                    for w in self._watches.values():
                        w.client = None
        finally:
            self.close()

    def beat(self) -> None:
        got = self.current()
        listed = got if isinstance(got, Sequence) else [got]
        now = self.clock()
        live = {m.epoch: m for m in listed
                if m is not None and not m.leave and m.world > 1}
        for epoch in [e for e in self._watches if e not in live]:
            self._drop(self._watches.pop(epoch))  # a call stuck in its store is left behind
        todo = []
        first = listed[0] if listed else None
        formed = first.epoch if first is not None else None
        for epoch, m in sorted(live.items()):
            w = self._watches.get(epoch)
            if w is None or (w.m.rank, w.m.world) != (m.rank, m.world):
                if w is not None:
                    self._drop(w)
                w = self._watches[epoch] = _Watch(m, moved_at=now, answered_at=now)
            if epoch == formed and not w.formed:  # all met to form it: alive then
                w.formed = True
                w.moved_at, w.answered_at = max(w.moved_at, now), max(w.answered_at, now)
            if not w.done:
                todo.append(w)
        for w in todo:  # every epoch's calls in flight at once, then waited for together
            self._start(w)
        deadline = time.monotonic() + IO_WAIT_S
        for w in todo:
            if w.io is not None:
                w.io.done.wait(max(0.0, deadline - time.monotonic()))
        for w in todo:
            self._judge(w, now)

    def _judge(self, w: _Watch, now: float) -> None:
        m = w.m
        base = f"malletrain/{m.epoch}"
        watched = (m.rank + 1) % m.world
        value, flagged = w.watched, 0
        got = self._collect(w)
        if got is not None:
            (value, flagged), w.answered_at = got
            w.heard = True
        if value != w.watched:
            w.watched, w.moved_at = value, now
        # A store never heard, or a peer that never beat here, is most likely not told yet
        # while every epoch watched is sound (see TOLD_WAIT_S) - unless this process formed
        # the epoch's group: every member was told then, met at the store and connected.
        sound = now - self._loss_at > TOLD_WAIT_S

        def bound(heard: bool) -> float:
            if heard or w.formed or not sound:
                return self.timeout_s
            return max(self.timeout_s, TOLD_WAIT_S)

        listening = w.listening_at  # a store that listens was told (see TOLD_WAIT_S)
        store_since = w.answered_at if w.heard or listening is None \
            else max(w.answered_at, listening)
        store_bound = bound(w.heard or listening is not None)
        peer_bound = bound((w.watched or 0) > 0)
        if flagged:
            self._lost(w, Lost(m.epoch, self._named(w), f"epoch {m.epoch}: a peer went silent "
                               "(another rank found it)"))
        elif now - store_since > store_bound:
            self._lost(w, Lost(m.epoch, [0], f"epoch {m.epoch}: the store on rank 0 "
                               f"({m.master}:{m.port}) has not answered for "
                               f"{now - store_since:.1f} s"))
        elif now - w.moved_at > peer_bound:
            with_store = w.client
            if with_store is not None:
                try:  # the others abandon at their next beat
                    with_store.set(f"{base}/lost/{watched}", "1")
                    with_store.add(f"{base}/lost", 1)
                except (RuntimeError, OSError):
                    w.client = None
            self._lost(w, Lost(m.epoch, [watched], f"epoch {m.epoch}: rank {watched} has not "
                               f"beaten for {now - w.moved_at:.1f} s"))

    def _start(self, w: _Watch) -> None:
        """Hand this beat's store calls for ``w`` to its thread, unless the calls of an
        earlier beat are still in flight: a hung store holds one thread, not one per beat."""
        if w.caller is None:
            w.caller = _Caller(lambda io: self._calls(w, io),
                               name=f"malletrain-heartbeat-{w.m.epoch}")
        if w.io is None:
            w.io = w.caller.submit()

    @staticmethod
    def _collect(w: _Watch) -> tuple[tuple[int, int], float] | None:
        """This beat's answer: ((the watched counter, the lost flag), when it came), or None
        when the store has not answered (yet)."""
        io = w.io
        if io is None or not io.done.is_set():
            return None
        w.io = None
        if io.result is None or io.done_at is None:
            return None
        return io.result, io.done_at

    @staticmethod
    def _drop(w: _Watch) -> None:
        """An epoch no longer watched: its thread ends (once a call in flight returns)."""
        if w.caller is not None:
            w.caller.close()

    def close(self) -> None:
        """End every watch's thread (the process leaves, or stops beating): an idle one is
        waited for, one in a hung call for at most a beat's wait."""
        watches, self._watches = list(self._watches.values()), {}
        for w in watches:
            self._drop(w)
        for w in watches:
            if w.caller is not None:
                w.caller.thread.join(IO_WAIT_S)

    def _calls(self, w: _Watch, io: _Exchange) -> None:
        m = w.m
        base = f"malletrain/{m.epoch}"
        watched = (m.rank + 1) % m.world
        try:
            store = self._store(w)
            store.add(f"{base}/hb/{m.rank}", 1)
            result = (int(store.add(f"{base}/hb/{watched}", 0)),
                      int(store.add(f"{base}/lost", 0)))
        except (RuntimeError, OSError, ValueError):
            w.client = None  # made anew at the next beat
            return
        io.result, io.done_at = result, self.clock()

    def _store(self, w: _Watch) -> Any:
        if w.client is None:
            import torch.distributed as dist

            m = w.m
            if not self._watching(m.epoch):
                # no longer watched since this beat began (the process formed a newer epoch):
                # rank 0 shuts its store down; a connection made then is one more that the
                # store's thread looks up while its destructor waits (see inplace.listen_on)
                raise OSError(f"epoch {m.epoch} is no longer watched")
            if m.rank == 0 and self.host is not None:
                self.host(m)
            if not _accepts(m.master, m.port):
                raise OSError(f"nothing listens on {m.master}:{m.port}")
            if w.listening_at is None:
                w.listening_at = self.clock()
            w.client = dist.TCPStore(m.master, m.port, is_master=False,
                                     timeout=dt.timedelta(seconds=4 * PERIOD_S),
                                     wait_for_workers=False)
        return w.client

    def _watching(self, epoch: int) -> bool:
        """Whether ``current()`` still lists ``epoch`` (checked again before connecting)."""
        got = self.current()
        listed = got if isinstance(got, Sequence) else [got]
        return any(m is not None and m.epoch == epoch for m in listed)

    @staticmethod
    def _named(w: _Watch) -> list[int]:
        """The ranks another rank found silent (what it wrote in the store)."""
        found = []
        store, m = w.client, w.m
        if store is not None:
            for r in range(m.world):
                try:
                    if store.check([f"malletrain/{m.epoch}/lost/{r}"]):
                        found.append(r)
                except (RuntimeError, OSError):
                    break
        return found

    def _lost(self, w: _Watch, lost: Lost) -> None:
        w.done = True
        self._loss_at = self.clock()
        w.client = None
        self.on_lost(lost)
