"""Event intake: hook datagrams (unix socket, sender uid checked) and signed progress reports.

Hooks only wake the daemon: the batch system's state, read by the reconciling poll, is the
truth, so a lost or dropped datagram delays a decision by at most one poll interval and never
corrupts state. Reports become :class:`~malletrain_core.events.ProgressReport` events when
their signature verifies under the job's per-launch key and their sequence number is new.
Everything dropped is counted and logged once per reason.
"""

from __future__ import annotations

import logging
import os
import socket
from collections import Counter
from collections.abc import Callable, Collection
from pathlib import Path

from .. import protocol, reports
from ..errors import MalleTrainError
from ..events import ProgressReport
from ..security import HOOK_SOCKET_GROUP, SOCKET_PRIVATE, restrict_socket

log = logging.getLogger(__name__)


MAX_DROP_REASONS = 32
"""Distinct drop reasons counted one by one; the rest are counted as "other" so that a flood
of varied garbage cannot grow the counters without bound."""


def _count_drop(dropped: Counter[str], reason: str, detail: str, what: str) -> None:
    if reason not in dropped and len(dropped) >= MAX_DROP_REASONS:
        reason = "other"
    if not dropped[reason]:
        log.warning("%s dropped: %s (further drops of this kind are counted)", what, detail)
    dropped[reason] += 1


class HookListener:
    """The daemon's hook socket: drains every waiting datagram without blocking; only senders
    whose kernel-reported uid is in ``allowed_uids`` are heard (root, SlurmUser).

    Two locks keep users out: the socket's mode (``group``: the SlurmUser's group, mode 0o620,
    so its members may send and nobody may read; no group: 0o600, the daemon's user only;
    ``mode`` overrides) and the kernel's ``SCM_CREDENTIALS`` uid checked on every datagram.
    """

    def __init__(self, path: str | os.PathLike[str], allowed_uids: Collection[int],
                 decode: Callable[[bytes], object] | None = None,
                 group: str | int | None = None, mode: int | None = None) -> None:
        self.allowed_uids = set(allowed_uids)
        self.decode = decode
        self.dropped: Counter[str] = Counter()
        self.received = 0
        self.listener = protocol.HookListener(Path(path), mode=SOCKET_PRIVATE).bind()
        self.path = self.listener.path
        try:
            self.mode = restrict_socket(self.path, group, HOOK_SOCKET_GROUP, mode)
        except MalleTrainError:
            self.listener.close()
            raise

    def fileno(self) -> int:
        assert self.listener.sock is not None
        return self.listener.sock.fileno()

    def close(self) -> None:
        self.listener.close()

    def _drop(self, reason: str, detail: str | None = None) -> None:
        _count_drop(self.dropped, reason, detail or reason, "hook datagram")

    def drain(self) -> list[object]:
        """Every datagram waiting now, decoded; bad ones are dropped and counted."""
        out: list[object] = []
        while True:
            try:
                data, _, uid, _ = self.listener.receive_raw(timeout_s=0.0)
            except (BlockingIOError, InterruptedError, socket.timeout):
                return out
            if uid not in self.allowed_uids:
                self._drop("sender not allowed", f"sender uid {uid} is not allowed")
                continue
            if len(data) > protocol.MAX_DATAGRAM_BYTES:
                self._drop("oversized datagram")
                continue
            if self.decode is None:
                out.append(data)
                self.received += 1
                continue
            try:
                out.append(self.decode(data))
                self.received += 1
            except Exception as exc:  # noqa: BLE001 - any decoding failure drops the datagram
                self._drop("malformed datagram", f"malformed datagram: {exc}")


class ReportListener:
    """Receives signed progress reports over UDP; ``key_for(job)`` gives each job's key."""

    def __init__(self, host: str, port: int, key_for: Callable[[str], bytes | None]) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_DGRAM)
        self.sock.bind((host, port))
        self.sock.setblocking(False)
        self.key_for = key_for
        self.guard = reports.ReplayGuard()
        self.dropped: Counter[str] = Counter()
        self.received = 0

    @property
    def address(self) -> tuple[str, int]:
        host, port = self.sock.getsockname()[:2]
        return host, port

    def fileno(self) -> int:
        return self.sock.fileno()

    def close(self) -> None:
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
            _count_drop(self.dropped, reason, str(exc), "report")
            return None
        self.received += 1
        return report

    def drain(self) -> list[reports.Report]:
        out: list[reports.Report] = []
        while True:
            try:
                data = self.sock.recv(reports.MAX_BYTES + 1)
            except (BlockingIOError, InterruptedError):
                return out
            report = self.accept(data)
            if report is not None:
                out.append(report)


def to_event(report: reports.Report) -> ProgressReport:
    return ProgressReport(time=report.t, job_id=report.job, samples=report.samples,
                          world_size=report.world, epoch=report.epoch)
