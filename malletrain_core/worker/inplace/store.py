"""The epoch's store and its port: where the members of an epoch meet before its group forms.

Rank 0 of each epoch hosts the store (:class:`StoreHost`) on the port the daemon handed out
(:class:`PortCycle` for whatever stands in for the daemon), listening on its own address
(:func:`listen_on`); every call to a store that may belong to a stopped process goes through
:class:`_StoreCalls`, so that a re-form can give up on it.
"""

from __future__ import annotations

import datetime as dt
import os
import queue
import socket
import threading
from collections.abc import Callable
from typing import Any

from ..control import Membership


class _GaveUp(Exception):
    """A store call given up on: the epoch it served was replaced or found lost."""


class _StoreCalls:
    """The main thread's store calls while it forms a group, each waited for only as long as
    its epoch is still wanted (``give_up()`` false). A call to the store of a stopped process
    never returns: torch's TCPStore client has no timeout on ``check`` nor on connecting
    (measured: both still blocked after 6 s, with a 2-s store timeout; the kernel accepts the
    connection for the stopped process), so the members of an epoch whose rank 0 was stopped
    while they met at its store waited there for the whole stop. One worker thread makes the
    calls in turn; one left in a hung call is replaced by a new one."""

    NAP_S = 0.01

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[Any] | None = None

    def call(self, fn: Callable[[], Any], give_up: Callable[[], bool]) -> Any:
        if self._jobs is None:
            self._jobs = queue.SimpleQueue()
            threading.Thread(target=self._serve, args=(self._jobs,), daemon=True,
                             name="malletrain-store-calls").start()
        done = threading.Event()
        box: list[tuple[Any, BaseException | None]] = []
        self._jobs.put((fn, box, done))
        while not done.wait(self.NAP_S):
            if give_up():
                self._jobs.put(None)  # that worker ends when its call returns, if ever
                self._jobs = None
                raise _GaveUp
        value, error = box[0]
        if error is not None:
            raise error
        return value

    @staticmethod
    def _serve(jobs: queue.SimpleQueue[Any]) -> None:
        while (job := jobs.get()) is not None:
            fn, box, done = job
            try:
                box.append((fn(), None))
            except BaseException as exc:  # noqa: BLE001 - raised in the caller's thread
                box.append((None, exc))
            done.set()
            del job, fn, box, done


class PortCycle:
    """Master ports handed out in turn from ``lo``-``hi``, as the daemon hands them out from
    ``[epochs] port_min-port_max``, skipping any that cannot be bound on ``host`` now: for
    whatever stands in for the daemon (the benches, the tests). Keep the range below Linux's
    ephemeral range (``net.ipv4.ip_local_port_range``, 32768- by default): a port bound to 0
    and let go can be taken by a connection's local end, and its TIME_WAIT then keeps the
    group's store from listening for up to 60 s."""

    def __init__(self, lo: int, hi: int, start: int | None = None,
                 host: str = "127.0.0.1") -> None:
        self.lo, self.hi, self.host = lo, hi, host
        self._next = lo if start is None else lo + (start - lo) % (hi - lo + 1)

    def __call__(self) -> int:
        span = self.hi - self.lo + 1
        for _ in range(span):
            port, self._next = self._next, self.lo + (self._next - self.lo + 1) % span
            with socket.socket() as s:
                try:
                    s.bind((self.host, port))
                except OSError:
                    continue
            return port
        raise RuntimeError(f"no port of {self.lo}-{self.hi} can be bound on {self.host}")


def listen_on(master: str, port: int) -> int | None:
    """A socket listening on ``master``'s own address (its first, as it resolves) at ``port``,
    for the epoch's store to serve on (its file descriptor, which the store then owns); None
    where that cannot be bound, and the store listens as it does by default.

    By default the store listens on a dual-stack socket on every interface, where an IPv4
    member's address reads as ``::ffff:a.b.c.d``; the store's thread formats each member's
    address with a reverse name lookup, which for that form misses ``/etc/hosts``' IPv4 lines
    and goes to DNS. A resolver that does not answer then held the store for 5 s, and its
    destructor, which joins that thread with the GIL held, stopped the whole process (its peers
    found rank 0 silent): measured on this project's test machine,
    a store freed while two clients kept connecting, 40 times: 5 of 40 took over 1 s (5.1 s
    at most) on the default socket, none (1 ms at most) on one bound here. Members reach the
    store at ``master`` anyway, so nothing else need listen."""
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(master, port,
                                                          type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
    except OSError:
        return None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the store's own
        sock.bind(addr)
        sock.listen(socket.SOMAXCONN)
    except OSError:
        sock.close()
        return None
    return sock.detach()


def _one_line(exc: BaseException) -> str:
    """An exception's last line of text (c10d's errors run over several)."""
    lines = str(exc).strip().splitlines()
    return lines[-1] if lines else type(exc).__name__


def _accepts(host: str, port: int) -> bool:
    """Whether something listens on ``host:port`` (a store's host, before c10d connects)."""
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


class StoreHost:
    """The store this process hosts as rank 0 of an epoch, at most one at a time: made by the
    heartbeat as soon as the epoch is told, or by the re-form, whichever comes first, and let
    go when its group is, or when its epoch was given up unformed."""

    def __init__(self) -> None:
        self._hosted: tuple[int, Any] | None = None  # (epoch, store)
        self._lock = threading.Lock()

    def host(self, m: Membership, timeout_s: float) -> Any:
        """The store of ``m``'s epoch, made once."""
        import torch.distributed as dist

        with self._lock:
            if self._hosted is not None and self._hosted[0] == m.epoch:
                return self._hosted[1]
            if self._hosted is not None and self._hosted[0] > m.epoch:
                raise RuntimeError(f"epoch {m.epoch} was replaced by epoch {self._hosted[0]}")
            fd = listen_on(m.master, m.port)
            try:
                store = dist.TCPStore(m.master, m.port, m.world, is_master=True,
                                      timeout=dt.timedelta(seconds=timeout_s),
                                      wait_for_workers=False, master_listen_fd=fd)
            except BaseException:
                if fd is not None:
                    os.close(fd)
                raise
            self._hosted = (m.epoch, store)  # an older one not formed is let go
            return store

    def let_go(self, store: Any) -> None:
        """Stop hosting ``store`` (its group's new owner keeps it, or nobody)."""
        with self._lock:
            if self._hosted is not None and self._hosted[1] is store:
                self._hosted = None

    def let_go_before(self, epoch: int) -> None:
        """Stop hosting the store of an epoch before ``epoch`` that was given up unformed:
        left listening, it would hold its port, which the daemon hands out again later."""
        with self._lock:
            if self._hosted is not None and self._hosted[0] < epoch:
                self._hosted = None
