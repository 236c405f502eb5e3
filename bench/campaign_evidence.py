"""What the campaign keeps of a fault slower than :data:`SLOW_S`: where its time went.

For such a fault (or one not recovered) the campaign writes, into a folder of its own
(``NNN-<fault>``, under ``--evidence``): ``timeline.json``, the fault, then every line the
daemon logged about the job from the fault until training resumed (their own timestamps), then
the first step trained again, each at its offset from the fault, with the longest wait between
two of them named; ``daemon.log``, the daemon's log over the same span; and the last lines of
each of the job's output files (the launchers' and the training processes' own words, the
heartbeat's findings among them). The row gets ``where``: the longest wait and its two ends,
which the report prints beside the fault.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from pathlib import Path
from typing import Any

SLOW_S = 5.0
"""A fault back to training later than this keeps its evidence."""
TAIL_LINES = 200
STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) (.*)$")


def stamped(log: str) -> list[tuple[float, str]]:
    """The lines of a daemon log that carry the log format's time (local time, as logging
    writes it), with that time as seconds since the epoch."""
    out = []
    for line in log.splitlines():
        m = STAMP.match(line)
        if m:
            t = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            out.append((t, m.group(2)))
    return out


def timeline(log: str, job: str, t_fault: float, what: str,
             back_at: float | None, until: float) -> list[tuple[float, str]]:
    """(seconds after the fault, event), in time order: the fault, the daemon's lines about
    ``job`` (tagged ``job=JOB`` or naming its tasks) up to training again (``back_at``, or
    ``until`` when it never came), and that."""
    end = back_at if back_at is not None else until
    tag = re.compile(rf"\bjob={re.escape(job)}\b|\b(?:job|task) {re.escape(job)}(?:_\d+)?\b")
    events = [(0.0, f"fault: {what}")]
    events += [(round(t - t_fault, 3), f"daemon: {text}") for t, text in stamped(log)
               if t_fault - 0.5 <= t <= end + 0.5 and tag.search(text)]
    if back_at is not None:
        events.append((round(back_at - t_fault, 3), "training again"))
    return sorted(events, key=lambda e: e[0])


def longest_wait(events: list[tuple[float, str]]) -> dict[str, Any] | None:
    """The longest gap between two consecutive events, and its ends."""
    if len(events) < 2:
        return None
    gaps = [(b[0] - a[0], a, b) for a, b in zip(events, events[1:], strict=False)]
    gap, a, b = max(gaps, key=lambda g: g[0])
    return {"wait_s": round(gap, 2), "after": a[1][:160], "at_s": a[0], "until": b[1][:160]}


def keep(folder: Path, row: dict[str, Any], log: str, outputs: list[Path],
         t_fault: float, back_at: float | None, until: float) -> dict[str, Any] | None:
    """Write the fault's evidence into ``folder`` and return the row's ``where``."""
    events = timeline(log, row["job"], t_fault, f"{row['fault']} {row.get('target', '')}",
                      back_at, until)
    where = longest_wait(events)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "timeline.json").write_text(json.dumps(
        {"row": {k: v for k, v in row.items() if k != "where"}, "where": where,
         "events": [{"s": s, "event": e} for s, e in events]}, indent=1) + "\n")
    (folder / "daemon.log").write_text("\n".join(
        f"{datetime.fromtimestamp(t).isoformat(timespec='milliseconds')} {text}"
        for t, text in stamped(log) if t_fault - 5 <= t <= until + 1) + "\n")
    for path in outputs:
        try:
            lines = path.read_text(errors="replace").splitlines()[-TAIL_LINES:]
        except OSError:
            continue
        (folder / path.name).write_text("\n".join(lines) + "\n")
    return where
