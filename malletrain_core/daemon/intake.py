"""Event intake: hook datagrams (unix socket, sender uid checked) and signed progress reports.

Hooks only wake the daemon: the batch system's state, read by the reconciling poll, is the
truth, so a lost or dropped datagram delays a decision by at most one poll interval and never
corrupts state. Reports become :class:`~malletrain_core.events.ProgressReport` events when
their signature verifies under the job's per-launch key and their sequence number is new.
Everything dropped is counted and logged once per reason.

Each listener reads its socket on its own thread into a bounded in-memory queue, so the
kernel's queue (``net.unix.max_dgram_qlen``, 10 datagrams on many hosts) never fills while a
daemon cycle runs and a hook's non-blocking send is not refused. The daemon's selector watches
the queue (``fileno()`` is a pipe that is readable while datagrams wait); ``drain()`` on the
daemon's thread validates and returns them. Datagrams arriving at a full queue are dropped and
counted as ``"queue overflow"``.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import select
import socket
import sys
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any, Generic, TypeVar

from ..errors import MalleTrainError
from ..events import ProgressReport
from ..security import HOOK_SOCKET_GROUP, SOCKET_PRIVATE, restrict_socket
from ..wire import hooks as protocol
from ..wire import reports

log = logging.getLogger(__name__)

T = TypeVar("T")

MAX_DROP_REASONS = 32
"""Distinct drop reasons counted one by one; the rest are counted as "other" so that a flood
of varied garbage cannot grow the counters without bound."""

MAX_QUEUED = 8192
"""Datagrams held in memory between two drains (at most 4 KiB each: 32 MiB at worst)."""

GUARD_PRUNE_EVERY = 1000
"""Reports between two prunes of the replay guard (the jobs with no running launch leave it)."""

OVERFLOW = "queue overflow"
"""The drop reason of a datagram that arrived while the in-memory queue was full."""

READER_NICE = -10
"""Scheduling priority of the reader threads, where the daemon may raise it (root or
CAP_SYS_NICE, Linux): they only move datagrams into memory, and on a busy head node a reader
that waits for a CPU longer than the kernel's queue lasts (10 datagrams: 10 ms at 1000/s)
makes the hooks' non-blocking sends fail."""

_JOIN_TIMEOUT_S = 5.0

OTHER_SUBMIT = b'"elastic":false'
"""How job_submit.lua marks the datagram of a job it does not convert (a hint, looked for in
the raw bytes on the reader thread; the drain validates the datagram as usual)."""


def _raise_priority(what: str) -> None:
    """Best effort: :data:`READER_NICE` for the calling thread (Linux: per-thread nice)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), READER_NICE)
    except OSError as exc:
        log.debug("%s reader keeps its priority: %s", what, exc)


RECEIVE_BUFFER_BYTES = 8 << 20
"""The report socket's kernel buffer: UDP drops what does not fit while the reader thread
waits for a core, so bursts from many workers get room (forced past net.core.rmem_max where
the daemon may, as root)."""


def _large_receive_buffer(sock: socket.socket) -> None:
    for option in (getattr(socket, "SO_RCVBUFFORCE", None), socket.SO_RCVBUF):
        if option is None:
            continue
        try:
            sock.setsockopt(socket.SOL_SOCKET, option, RECEIVE_BUFFER_BYTES)
            return
        except OSError:
            continue  # not privileged: the plain option, capped by net.core.rmem_max


class _Counts:
    """Received and dropped counts, updated by the reader thread and the daemon's thread and
    read by the status API: every access goes through one lock."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.lock = threading.Lock()
        self._dropped: Counter[str] = Counter()
        self._received = 0

    def drop(self, reason: str, detail: str | None = None, n: int = 1) -> None:
        with self.lock:
            if reason not in self._dropped and len(self._dropped) >= MAX_DROP_REASONS:
                reason = "other"
            if not self._dropped[reason]:
                log.warning("%s dropped: %s (further drops of this kind are counted)",
                            self.what, detail or reason)
            self._dropped[reason] += n

    def receive(self, n: int = 1) -> None:
        with self.lock:
            self._received += n

    @property
    def dropped(self) -> Counter[str]:
        with self.lock:
            return Counter(self._dropped)

    @property
    def received(self) -> int:
        with self.lock:
            return self._received


class DatagramQueue(Generic[T]):
    """Reads a non-blocking datagram socket on a daemon thread into a bounded queue.

    ``receive()`` reads one datagram (``BlockingIOError`` when none waits) and returns what to
    queue, or None to discard it (it counts its own drops). ``fileno()`` is readable while the
    queue holds anything; :meth:`take` empties it. :meth:`close` stops and joins the thread.
    """

    def __init__(self, sock: socket.socket, receive: Callable[[], T | None], counts: _Counts,
                 max_queued: int = MAX_QUEUED, name: str = "intake") -> None:
        if max_queued < 1:
            raise ValueError(f"max_queued must be at least 1, not {max_queued}")
        sock.setblocking(False)
        self.sock = sock
        self.receive = receive
        self.counts = counts
        self.max_queued = max_queued
        self._queue: deque[T] = deque()
        self._lock = threading.Lock()
        self._ready_r, self._ready_w = os.pipe()
        self._stop_r, self._stop_w = os.pipe()
        for fd in (self._ready_r, self._ready_w, self._stop_r, self._stop_w):
            os.set_blocking(fd, False)
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def fileno(self) -> int:
        return self._ready_r

    def __len__(self) -> int:
        with self._lock:
            return len(self._queue)

    def _run(self) -> None:
        _raise_priority(self.counts.what)
        poller = select.poll()
        poller.register(self.sock.fileno(), select.POLLIN)
        poller.register(self._stop_r, select.POLLIN)
        while True:
            try:
                ready = {fd for fd, _ in poller.poll()}
            except InterruptedError:
                continue
            if self._stop_r in ready:
                return
            batch: list[T] = []
            while len(batch) < self.max_queued:
                try:
                    item = self.receive()
                except (BlockingIOError, InterruptedError, socket.timeout):
                    break
                except OSError as exc:  # the socket is unusable: the poll still reconciles
                    log.error("%s socket failed, no longer reading it: %s", self.counts.what,
                              exc)
                    return
                if item is not None:
                    batch.append(item)
            if batch:
                self._put(batch)

    def _put(self, batch: list[T]) -> None:
        with self._lock:
            was_empty = not self._queue
            room = self.max_queued - len(self._queue)
            self._queue.extend(batch[:room])
            overflow = len(batch) - room
            if was_empty and self._queue:
                try:
                    os.write(self._ready_w, b"!")
                except (BlockingIOError, OSError):
                    pass  # already readable
        if overflow > 0:
            self.counts.drop(OVERFLOW, f"more than {self.max_queued} datagrams waiting; "
                             "the daemon is not draining its queue", n=overflow)

    def take(self) -> list[T]:
        """Everything queued now, oldest first; the queue is empty afterwards."""
        with self._lock:
            try:
                while os.read(self._ready_r, 512):
                    pass
            except (BlockingIOError, OSError):
                pass
            out = list(self._queue)
            self._queue.clear()
        return out

    def close(self) -> None:
        """Stop the reader, join it, then release the pipes (not the socket: its owner's)."""
        if self._stop_w < 0:
            return
        try:
            os.write(self._stop_w, b"!")
        except OSError:
            pass
        self._thread.join(_JOIN_TIMEOUT_S)
        if self._thread.is_alive():
            log.error("%s reader did not stop within %.0f s", self.counts.what, _JOIN_TIMEOUT_S)
            return  # leave its descriptors open rather than pull them from under it
        for fd in (self._ready_r, self._ready_w, self._stop_r, self._stop_w):
            try:
                os.close(fd)
            except OSError:
                pass
        self._ready_r = self._ready_w = self._stop_r = self._stop_w = -1


class _Queued:
    """What the daemon's selector and the status API read of a listener: the queue's pipe
    and the counters (snapshots, taken under the counters' lock)."""

    _counts: _Counts
    queue: DatagramQueue[Any]

    @property
    def dropped(self) -> Counter[str]:
        """Datagrams dropped, by reason."""
        return self._counts.dropped

    @property
    def received(self) -> int:
        """Datagrams accepted."""
        return self._counts.received

    def fileno(self) -> int:
        return self.queue.fileno()


class HookListener(_Queued):
    """The daemon's hook socket, read continuously on its own thread; only senders whose
    kernel-reported uid is in ``allowed_uids`` are heard (root, SlurmUser).

    Two locks keep users out: the socket's mode (``group``: the SlurmUser's group, mode 0o620,
    so its members may send and nobody may read; no group: 0o600, the daemon's user only;
    ``mode`` overrides) and the kernel's ``SCM_CREDENTIALS`` uid checked on every datagram.
    At most ``max_queued`` datagrams wait in memory for :meth:`drain`.
    """

    def __init__(self, path: str | os.PathLike[str], allowed_uids: Collection[int],
                 decode: Callable[[bytes], object] | None = None,
                 group: str | int | None = None, mode: int | None = None,
                 max_queued: int = MAX_QUEUED) -> None:
        self.allowed_uids = set(allowed_uids)
        self.decode = decode
        self._counts = _Counts("hook datagram")
        self.other_submits = 0
        """Datagrams announcing a job that is not elastic (job_submit.lua's ``"elastic":false``),
        counted on the reader thread as they arrive, before any drain: the Slurm backend holds
        back the grows of a cycle during which one came (see ``slurm.unplanned_wait_s``)."""
        self.listener = protocol.HookSocket(Path(path), mode=SOCKET_PRIVATE).bind()
        self.path = self.listener.path
        try:
            self.mode = restrict_socket(self.path, group, HOOK_SOCKET_GROUP, mode)
        except MalleTrainError:
            self.listener.close()
            raise
        assert self.listener.sock is not None
        self.queue: DatagramQueue[bytes] = DatagramQueue(
            self.listener.sock, self._receive, self._counts, max_queued, "hook-intake")

    def close(self) -> None:
        self.queue.close()
        self.listener.close()

    def _receive(self) -> bytes | None:
        """On the reader thread: one datagram, kept only from an allowed sender."""
        data, _, uid, _ = self.listener.receive_raw(timeout_s=0.0)
        if uid not in self.allowed_uids:
            self._counts.drop("sender not allowed", f"sender uid {uid} is not allowed")
            return None
        if len(data) > protocol.MAX_DATAGRAM_BYTES:
            self._counts.drop("oversized datagram")
            return None
        if OTHER_SUBMIT in data:
            self.other_submits += 1  # one writer (this thread); readers only compare
        return data

    def drain(self) -> list[object]:
        """Every datagram queued now, decoded; bad ones are dropped and counted."""
        out: list[object] = []
        for data in self.queue.take():
            if self.decode is None:
                out.append(data)
                continue
            try:
                out.append(self.decode(data))
            except Exception as exc:  # noqa: BLE001 - any decoding failure drops the datagram
                self._counts.drop("malformed datagram", f"malformed datagram: {exc}")
        self._counts.receive(len(out))
        return out


class ReportListener(_Queued):
    """Receives signed progress reports over UDP, read continuously on its own thread;
    ``key_for(job)`` gives each job's key (called from :meth:`drain`, on the caller's thread).

    A report's time is when the reader thread received it, on the daemon's ``clock``, not the
    ``t`` its sender wrote: the nodes' clocks are not the daemon's, and one that is off or
    jumps (an NTP step, a VM resumed) would otherwise move the engine's time, and with it the
    harvest accounting and the profiler's rates, by as much as it is off.
    """

    def __init__(self, host: str, port: int, key_for: Callable[[str], bytes | None],
                 max_queued: int = MAX_QUEUED, clock: Callable[[], float] = time.time) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_DGRAM)
        _large_receive_buffer(self.sock)
        try:
            self.sock.bind((host, port))
        except OSError:
            self.sock.close()
            raise
        self.key_for = key_for
        self.guard = reports.ReplayGuard()
        self._until_prune = GUARD_PRUNE_EVERY
        self._counts = _Counts("report")
        self.clock = clock
        self.queue: DatagramQueue[tuple[bytes, float]] = DatagramQueue(
            self.sock, lambda: (self.sock.recv(reports.MAX_BYTES + 1), clock()), self._counts,
            max_queued, "report-intake")

    @property
    def address(self) -> tuple[str, int]:
        host, port = self.sock.getsockname()[:2]
        return host, port

    def close(self) -> None:
        self.queue.close()
        self.sock.close()

    def accept(self, data: bytes) -> reports.Report | None:
        """Verify one datagram; None (and a count) when it must be dropped."""
        try:
            _, _, unverified = reports.parse(data)
            key = self.key_for(unverified.job)
            if key is None:
                raise reports.ReportError(f"no running launch for job {unverified.job!r}")
            report = reports.verify(data, key)
            self.guard.check(report)
        except reports.ReportError as exc:
            reason = str(exc).split(" for job")[0].split(" (")[0]
            self._counts.drop(reason, str(exc))
            return None
        self._counts.receive()
        return report

    def drain(self) -> list[reports.Report]:
        """Every report queued now that verifies, timed at its receipt; the others are dropped
        and counted."""
        out: list[reports.Report] = []
        taken = self.queue.take()
        for data, received in taken:
            report = self.accept(data)
            if report is not None:
                out.append(dataclasses.replace(report, t=received))
        self._until_prune -= len(taken)
        if self._until_prune <= 0:  # ended jobs' sequence numbers: not kept for ever
            self._until_prune = GUARD_PRUNE_EVERY
            self.guard.retain(lambda job: self.key_for(job) is not None)
        return out


def to_event(report: reports.Report) -> ProgressReport:
    """The engine event of one verified report."""
    return ProgressReport(time=report.t, job_id=report.job, samples=report.samples,
                          world_size=report.world, epoch=report.epoch)
