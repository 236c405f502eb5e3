"""The figures of bench/sharded.py, from what a run left behind (no cluster here): each change's
pause, the steps it lost, what it moved, what it wrote to disk; the medians of one path; the
issue's done-when conditions. Kept apart from the cluster driving so that a unit test
(tests/test_bench_sharded.py) checks them on hand-written lines.

A change is known by the epoch the job trained in before it (``before``), the first epoch that
trains at the new world after it (``after``), the time the bench triggered it (``trigger_t``:
the prod job submitted, the blocking job cancelled, the second elastic job submitted) and the
checkpoint folder's files before and after it.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devtools.runlogs.sharded_logs import DaemonEpoch, ShardedLog

KINDS = ("grow", "shrink", "preempt")
RATIO = 5.0
"""Done when each in-place pause is at most 1/RATIO of the restart path's."""
PEAK_LIMIT = 2.0
"""Done when the peak extra memory of a rescale is at most this many shards."""

Files = dict[str, tuple[int, int]]
"""A folder's files: relative path → (size, mtime in ns)."""


def folder_files(folder: Path) -> Files:
    """Every file under ``folder`` (none: empty) with its size and modification time."""
    out: Files = {}
    for dirpath, _, names in os.walk(folder):
        for name in names:
            path = Path(dirpath) / name
            try:
                st = path.stat()
            except OSError:  # removed while walking (an older checkpoint let go)
                continue
            out[str(path.relative_to(folder))] = (st.st_size, st.st_mtime_ns)
    return out


def written_bytes(before: Files, after: Files) -> int:
    """The bytes of the files that are new or changed (size or mtime) in ``after``: a file
    rewritten counts whole. A file written and removed between the two reads is not seen, but
    a checkpoint is never removed before the next one is written, so one change's writes
    always show."""
    return sum(size for path, (size, mtime) in after.items() if before.get(path) != (size, mtime))


@dataclass
class Change:
    """One change the bench triggered and waited for (see the module doc)."""

    kind: str
    before: int
    after: int
    trigger_t: float
    files_before: Files = field(default_factory=dict)
    files_after: Files = field(default_factory=dict)


def order_time(change: Change, epochs: Mapping[int, DaemonEpoch]) -> float | None:
    """When the change was ordered: a preemption is ordered by the batch system (the prod
    job's submission); a grow or a planned shrink by the daemon (its first epoch after
    ``before``: in place the new membership, on the restart path the epoch it starts once
    the old one checkpointed). None when the daemon's line is missing."""
    if change.kind == "preempt":
        return change.trigger_t
    later = [e for e in epochs if change.before < e <= change.after]
    return epochs[min(later)].t if later else None


def figures(change: Change, log: ShardedLog,
            epochs: Mapping[int, DaemonEpoch]) -> dict[str, Any]:
    """One change's figures: ``pause_s`` (order → the first step line at the new world),
    ``steps_lost`` (the most steps any rank of the epochs it ended had done, less the steps
    the new epoch began from), ``peak_extra_ratio`` (the largest over the new epoch's ranks
    that reported one: a heal or a re-shard), ``from_disk``, ``disk_bytes``, the paths the
    daemon took and the bytes received."""
    order = order_time(change, epochs)
    first = log.first_step_t(change.after)
    begun = log.begun.get(change.after, {})
    start = log.start_step(change.after)
    if start is None:  # no start line read (two lines written at once): its first step's
        rows = log.steps.get(change.after, [])
        start = min(r.step for r in rows) - 1 if rows else 0
    done = max((log.last_step(e) for e in log.steps if change.before <= e < change.after),
               default=-1)
    peaks = [s.moved["peak_extra_ratio"] for s in begun.values()
             if isinstance(s.moved.get("peak_extra_ratio"), (int, float))]
    return {
        "kind": change.kind, "epochs": [change.before, change.after],
        "pause_s": round(first - order, 3) if first is not None and order is not None else None,
        "steps_lost": max(0, done - start),
        "peak_extra_ratio": max(peaks) if peaks else None,
        "from_disk": any(bool(s.moved.get("from_disk")) for s in begun.values()),
        "received_bytes": sum(int(s.moved.get("received_bytes", 0)) for s in begun.values()),
        "disk_bytes": written_bytes(change.files_before, change.files_after),
        "paths": sorted({epochs[e].path for e in epochs if change.before < e <= change.after}),
    }


def median(xs: list[float]) -> float | None:
    return round(statistics.median(xs), 3) if xs else None


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """A path's figures over its changes: the median pause per kind (with every pause),
    steps lost and disk bytes summed, the largest peak ratio, the changes read from disk."""
    out: dict[str, Any] = {}
    for kind in KINDS:
        pauses = [r["pause_s"] for r in rows if r["kind"] == kind and r["pause_s"] is not None]
        out[f"{kind}_s"] = median(pauses)
        out[f"{kind}_s_all"] = pauses
    peaks = [r["peak_extra_ratio"] for r in rows if r["peak_extra_ratio"] is not None]
    out["steps_lost"] = sum(r["steps_lost"] for r in rows)
    out["steps_lost_all"] = {kind: [r["steps_lost"] for r in rows if r["kind"] == kind]
                             for kind in KINDS}
    out["disk_bytes"] = sum(r["disk_bytes"] for r in rows)
    out["peak_extra_ratio"] = max(peaks) if peaks else None
    out["peak_extra_ratio_from"] = sorted({r["kind"] for r in rows
                                           if r["peak_extra_ratio"] is not None})
    out["from_disk"] = [r["kind"] for r in rows if r["from_disk"]]
    out["paths"] = sorted({p for r in rows for p in r["paths"]})
    out["changes"] = rows
    return out


def fastest_restart(restart: Mapping[str, Mapping[str, Any]]) -> dict[str, float | None]:
    """Per kind, the smallest median pause over the modes' restart runs: the stricter bar."""
    out: dict[str, float | None] = {}
    for kind in KINDS:
        got = [r[f"{kind}_s"] for r in restart.values() if r.get(f"{kind}_s") is not None]
        out[f"{kind}_s"] = min(got) if got else None
    return out


def done_when(mode: Mapping[str, Any], restart: Mapping[str, Any]) -> dict[str, Any]:
    """The issue's conditions for one mode against a restart run of the same run: it matches
    the reference, writes 0 bytes during a rescale, peaks at most :data:`PEAK_LIMIT` shards,
    and each in-place pause is at most 1/:data:`RATIO` of the restart path's (None where a
    figure is missing)."""
    out: dict[str, Any] = {
        "matches_reference": mode.get("matches_reference") is True,
        "zero_disk_bytes": mode.get("disk_bytes") == 0 if "disk_bytes" in mode else None,
        "peak_within_limit": (mode["peak_extra_ratio"] <= PEAK_LIMIT
                              if mode.get("peak_extra_ratio") is not None else None),
    }
    for kind in KINDS:
        ours, theirs = mode.get(f"{kind}_s"), restart.get(f"{kind}_s")
        out[f"{kind}_ratio"] = round(theirs / ours, 2) if ours and theirs else None
        out[f"{kind}_fifth"] = ours * RATIO <= theirs if ours is not None and theirs is not None \
            else None
    out["all"] = all(v is True for k, v in out.items() if not k.endswith("_ratio"))
    return out
