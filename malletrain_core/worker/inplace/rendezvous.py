"""Meeting at an epoch's store, then forming its group: the rendezvous of one re-form.

Every rank first checks in at the store (rank 0 hosts it, from the moment it was told the
epoch: :meth:`.watch.ControlWatch.host_coming`) and waits, polling, until all ``m.world`` did,
or the epoch was given up; only then is the group made, which needs every rank.
"""

from __future__ import annotations

import datetime as dt
import sys
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from ..control import Membership
from .store import StoreHost, _accepts, _GaveUp, _one_line, _StoreCalls


class Rendezvous:
    """Forms each epoch's group for one process. ``replaced(m)`` says whether ``m`` was given
    up (a newer membership told, or a peer of its epoch found silent)."""

    def __init__(self, host: StoreHost, replaced: Callable[[Membership], bool],
                 timeout_s: float, poll_s: float) -> None:
        self.host = host
        self.replaced = replaced
        self.timeout_s = timeout_s
        self.poll_s = poll_s
        self._calls = _StoreCalls()
        self._torch_hook: tuple[Any, Any] = (None, None)  # (what it wrapped, torch's hook)

    def meet(self, m: Membership) -> Any:
        """The store of ``m``'s epoch once every rank checked in there; None when ``m`` was
        given up meanwhile (a member that was told a later epoch never comes to this one, so
        nobody waits for it; the daemon, told of a silent peer, names the next epoch without
        it).

        Connection attempts are probed with a plain socket first, so that a store not yet up
        costs no c10d retry back-off (16 s measured); the store calls are waited for only
        while ``m`` is wanted (:class:`_StoreCalls`: a stopped rank 0 never answers)."""
        import torch.distributed as dist

        timeout = dt.timedelta(seconds=self.timeout_s)
        deadline = time.monotonic() + self.timeout_s
        # keys of this epoch only: a restarted daemon may hand the same port to a new epoch
        keys = [f"malletrain/{m.epoch}/joined/{r}" for r in range(m.world)]
        store = None
        warned = False

        def call(fn: Callable[[], Any]) -> Any:
            return self._calls.call(fn, lambda: self.replaced(m))

        def connect() -> Any:
            if m.rank == 0:
                return self.host.host(m, self.timeout_s)
            return dist.TCPStore(m.master, m.port, m.world, is_master=False, timeout=timeout,
                                 wait_for_workers=False)

        while True:
            try:
                joined = store is not None and call(partial(self._joined, store, keys))
            except _GaveUp:
                return None
            if joined:
                break
            if joined is None:
                store = None  # its host moved on (a newer membership reaches us too)
            if self.replaced(m):
                return None
            if time.monotonic() > deadline:
                raise TimeoutError(f"epoch {m.epoch}: not every rank came to the group on "
                                   f"{m.master}:{m.port} within {self.timeout_s:g} s")
            try:
                if store is None and (m.rank == 0 or _accepts(m.master, m.port)):
                    store = call(connect)
                    call(partial(store.set, keys[m.rank], "1"))
                    continue  # look at once: alone (world 1), or the last to come, all are in
            except _GaveUp:
                return None
            except (RuntimeError, OSError) as exc:  # the store went away (its host moved on)
                store = None
                if m.rank == 0 and not warned and time.monotonic() > deadline - self.timeout_s + 5:
                    # rank 0 cannot make the store: its port is taken, often by a connection's
                    # TIME_WAIT (up to 60 s), which a master port in the ephemeral range risks
                    warned = True
                    print(f"malletrain: epoch {m.epoch}: the group's store cannot listen on "
                          f"port {m.port} for 5 s ({_one_line(exc)}); still trying until "
                          f"{self.timeout_s:g} s: keep [epochs] port_min-port_max below "
                          "net.ipv4.ip_local_port_range", file=sys.stderr, flush=True)
            time.sleep(self.poll_s / 4)
        assert store is not None
        return store

    def init_group(self, m: Membership, store: Any, backend: str, device: Any) -> None:
        """Form ``m``'s group (the default group) on ``store``, every rank having met there."""
        import torch.distributed as dist

        if sys.excepthook is self._torch_hook[1]:
            # torch wraps sys.excepthook at every init_process_group to prefix "[rankN]: ";
            # unwrapped, twenty re-forms would prefix a traceback's lines twenty times
            sys.excepthook = self._torch_hook[0]
        before = sys.excepthook
        # NCCL: the communicator is made now, bound to this process's GPU (a lazy one costs
        # the first all-reduce 0.39-0.62 s on an H100, an eager one 0.05 s).
        eager = {"device_id": device} if backend == "nccl" else {}
        dist.init_process_group(backend,
                                store=dist.PrefixStore(f"malletrain/{m.epoch}", store),
                                rank=m.rank, world_size=m.world,
                                timeout=dt.timedelta(seconds=self.timeout_s), **eager)
        self._torch_hook = (before, sys.excepthook)

    @staticmethod
    def _joined(store: Any, keys: list[str]) -> bool | None:
        """Whether every rank checked in at ``store``; None, not an error, when the store went
        away: its host (rank 0) moved on to a newer membership, which reaches this process
        too. Raised, that error killed this rank's processes: under real Slurm a restarted
        daemon that had lost its last epoch named a newer one, and each re-form that followed
        lost one node's processes ("Failed to recv"), 6 epochs and 30 s before a disk resume."""
        if store is None:
            return False
        try:
            return bool(store.check(keys))
        except (RuntimeError, OSError):
            return None
