"""Signed progress reports: the one datagram a training job sends per report.

Reports cross the network from compute nodes, where UDP can be forged, so each carries an
HMAC-SHA256 under the per-launch key the daemon handed to the job's launcher (inside a munge
credential restricted to the job's user) and a sequence number. The daemon drops unsigned,
forged, replayed or oversized reports and counts them.

Wire format (ASCII header, then compact JSON)::

    MTR1 <64 hex digits of HMAC-SHA256(key, json)> <json>

with json = {"job", "epoch", "seq", "t", "samples", "world", "rank"[, "ckpt"]}.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import MalleTrainError

MAGIC = b"MTR1"
MAX_BYTES = 1024


class ReportError(MalleTrainError):
    """A report that must be dropped: the reason is one line."""


@dataclass(frozen=True)
class Report:
    """One progress report: cumulative ``samples`` at time ``t`` in ``epoch``, world ``world``."""

    job: str
    epoch: int
    seq: int
    t: float
    samples: float
    world: int
    rank: int = 0
    ckpt: int | None = None
    """Step of a checkpoint completed since the last report (acknowledges a request)."""

    def payload(self) -> bytes:
        body = {"job": self.job, "epoch": self.epoch, "seq": self.seq, "t": self.t,
                "samples": self.samples, "world": self.world, "rank": self.rank}
        if self.ckpt is not None:
            body["ckpt"] = self.ckpt
        return json.dumps(body, separators=(",", ":"), sort_keys=True).encode()


def sign(report: Report, key: bytes) -> bytes:
    """The datagram for ``report`` under ``key``."""
    payload = report.payload()
    mac = hmac.new(key, payload, hashlib.sha256).hexdigest().encode()
    data = MAGIC + b" " + mac + b" " + payload
    if len(data) > MAX_BYTES:
        raise ReportError(f"report of {len(data)} bytes exceeds {MAX_BYTES}; shorten the job id")
    return data


def _field(body: dict[str, object], name: str, kinds: tuple[type, ...]) -> object:
    value = body.get(name)
    if isinstance(value, bool) or not isinstance(value, kinds):
        raise ReportError(f"field {name!r} missing or of the wrong type")
    return value


def _finite(value: object) -> float:
    """``value`` as a float; integers too large for one become inf (refused by the caller)."""
    try:
        return float(value)  # type: ignore[arg-type]
    except OverflowError:
        return math.inf


def parse(data: bytes) -> tuple[bytes, bytes, Report]:
    """Split a datagram into (mac, payload, report) without checking the signature."""
    if len(data) > MAX_BYTES:
        raise ReportError(f"oversized report ({len(data)} bytes > {MAX_BYTES})")
    parts = data.split(b" ", 2)
    if len(parts) == 3 and parts[0][:3] == MAGIC[:3] and parts[0] != MAGIC \
            and parts[0][3:].isdigit() and len(parts[0]) <= 8:
        raise ReportError(f"report format {parts[0].decode()}, this daemon reads "
                          f"{MAGIC.decode()}: upgrade malletraind before the launchers")
    if len(parts) != 3 or parts[0] != MAGIC:
        raise ReportError("not a MalleTrain report (bad magic or version)")
    mac, payload = parts[1], parts[2]
    if len(mac) != 64:
        raise ReportError("malformed signature")
    try:
        body = json.loads(payload.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        raise ReportError("payload is not UTF-8 JSON") from None
    if not isinstance(body, dict):
        raise ReportError("payload is not a JSON object")
    samples = _finite(_field(body, "samples", (int, float)))
    t = _finite(_field(body, "t", (int, float)))
    if not (math.isfinite(samples) and samples >= 0 and math.isfinite(t)):
        raise ReportError("samples and t must be finite, samples ≥ 0")
    ckpt = body.get("ckpt")
    if ckpt is not None and (isinstance(ckpt, bool) or not isinstance(ckpt, int)):
        raise ReportError("field 'ckpt' of the wrong type")
    report = Report(job=str(_field(body, "job", (str,))),
                    epoch=int(_field(body, "epoch", (int,))),  # type: ignore[call-overload]
                    seq=int(_field(body, "seq", (int,))),  # type: ignore[call-overload]
                    t=t, samples=samples,
                    world=int(_field(body, "world", (int,))),  # type: ignore[call-overload]
                    rank=int(_field(body, "rank", (int,))),  # type: ignore[call-overload]
                    ckpt=ckpt)
    try:
        report.job.encode("utf-8")
    except UnicodeEncodeError:
        raise ReportError("field 'job' holds a lone surrogate escape (not Unicode text)") from None
    if report.world < 1 or report.epoch < 0 or report.seq < 0 or not 0 <= report.rank < report.world:
        raise ReportError("epoch, seq, world or rank out of range")
    return mac, payload, report


def verify(data: bytes, key: bytes) -> Report:
    """The report in ``data`` if its signature is valid under ``key``."""
    mac, payload, report = parse(data)
    expected = hmac.new(key, payload, hashlib.sha256).hexdigest().encode()
    if not hmac.compare_digest(mac, expected):
        raise ReportError(f"bad signature on a report for job {report.job!r}")
    return report


class ReplayGuard:
    """Accepts each (job, epoch) sequence number at most once and in increasing order."""

    def __init__(self) -> None:
        self._last: dict[tuple[str, int], int] = {}

    def check(self, report: Report) -> None:
        key = (report.job, report.epoch)
        last = self._last.get(key, -1)
        if report.seq <= last:
            raise ReportError(f"replayed report for job {report.job!r} (seq {report.seq} ≤ {last})")
        self._last[key] = report.seq

    def forget(self, job: str) -> None:
        for key in [k for k in self._last if k[0] == job]:
            del self._last[key]

    def retain(self, live: Callable[[str], bool]) -> int:
        """Forget every job ``live`` says has ended (its reports are refused before this guard
        sees them); returns the entries dropped. Without it, every (job, epoch) ever reported
        stays in memory."""
        verdict: dict[str, bool] = {}
        for job, _ in self._last:
            if job not in verdict:
                verdict[job] = live(job)
        gone = [k for k in self._last if not verdict[k[0]]]
        for key in gone:
            del self._last[key]
        return len(gone)

    def __len__(self) -> int:
        return len(self._last)
