"""What the demo reads from the training side: each node's step log (when every step ran),
the workers' start-up lines and each job's counter file."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

STEP_JOIN_S = 0.25
"""Completed steps of one node less than this apart count as one stretch of training (the
bookkeeping between two steps); a longer pause (a re-form, a restart) is not counted."""


def read_step_logs(paths: Iterable[Path], until: float | None = None
                   ) -> dict[str, list[tuple[float, float]]]:
    """Per node, the ``(start, end)`` of every completed step, from the workers' step logs
    (``steps/<node>.log``: one ``START END [STEP EPOCH]`` line per completed step; the node is
    the file's name), only steps that ended by ``until`` when given (to read the logs again as
    they were read then). Malformed lines (a process killed mid-write) are skipped."""
    out: dict[str, list[tuple[float, float]]] = {}
    for path in paths:
        steps = out.setdefault(Path(path).stem, [])
        steps += [(r.start, r.end) for r in _records(Path(path), until)]
    return out


@dataclass(frozen=True)
class StepRecord:
    """One completed step of one node, as its step log wrote it (``step``/``epoch`` -1 in a
    log of the older two-field format)."""

    job: str
    node: str
    start: float
    end: float
    step: int
    epoch: int


def _records(path: Path, until: float | None) -> list[StepRecord]:
    try:
        text = path.read_text()
    except OSError:
        return []
    job = path.parent.parent.name.removeprefix("checkpoints-")
    out = []
    for line in text.splitlines():
        parts = line.split()
        try:
            start, end = float(parts[0]), float(parts[1])
            step, epoch = (int(parts[2]), int(parts[3])) if len(parts) == 4 else (-1, -1)
        except (IndexError, ValueError):
            continue
        if len(parts) in (2, 4) and end >= start and (until is None or end <= until):
            out.append(StepRecord(job, path.stem, start, end, step, epoch))
    return out


def read_step_records(paths: Iterable[Path], until: float | None = None) -> list[StepRecord]:
    """Every completed step of every node, with its job (``checkpoints-<job>/steps/``)."""
    return [r for path in paths for r in _records(Path(path), until)]


def kept_and_rolled_back(records: Iterable[StepRecord], batch: int,
                         window: tuple[float, float] | None = None) -> tuple[int, int]:
    """Samples the step logs say were trained and kept, and trained and then rolled back.

    A job that loses every node resumes from its last checkpoint in a later epoch and trains
    the steps after it again: of the occurrences of one global step, the one of the latest
    epoch is kept, the earlier ones were rolled back. A step counts ``batch`` samples for each
    node that completed it (a step kept across a lost peer, logged in two pieces, once).
    Only steps that ended inside ``window``, when given, are counted; the roll-backs are
    decided on every record."""
    records = list(records)
    latest: dict[tuple[str, int], int] = {}
    for r in records:
        key = (r.job, r.step)
        latest[key] = max(latest.get(key, r.epoch), r.epoch)
    seen: set[tuple[str, str, int, int]] = set()
    kept = rolled = 0
    for r in records:
        if window is not None and not window[0] <= r.end <= window[1]:
            continue
        if r.step < 0:  # the older format: every line a step, none rolled back
            kept += batch
            continue
        instance = (r.job, r.node, r.step, r.epoch)
        if instance in seen:
            continue
        seen.add(instance)
        if r.epoch >= latest[(r.job, r.step)]:
            kept += batch
        else:
            rolled += batch
    return kept, rolled


def training_stretches(steps: Iterable[tuple[float, float]],
                       join_s: float = STEP_JOIN_S) -> list[tuple[float, float]]:
    """The union of the steps' spans, joining spans less than ``join_s`` apart."""
    out: list[list[float]] = []
    for start, end in sorted(steps):
        if out and start - out[-1][1] < join_s:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return [(a, b) for a, b in out]


_STARTUP = re.compile(r"first step ([0-9.]+) s after the task started: launcher ([0-9.]+) s, "
                      r"torch and model ([0-9.]+) s, ready to placed and formed ([0-9.]+) s")
STARTUP_PARTS = ("launcher", "torch_and_model", "placed_and_formed")


def read_startups(paths: Iterable[Path]) -> list[dict[str, float]]:
    """Every worker start-up the tasks' output names (``examples/standin_nas.py`` writes one
    line to stderr at its first completed step): ``total`` from the task's start to the first
    step, and its parts (:data:`STARTUP_PARTS`). Unreadable files and other lines are skipped."""
    out = []
    for path in paths:
        try:
            text = Path(path).read_text(errors="replace")
        except OSError:
            continue
        for m in _STARTUP.finditer(text):
            values = [float(v) for v in m.groups()]
            out.append({"total": values[0], **dict(zip(STARTUP_PARTS, values[1:]))})
    return out


def read_counters(paths: Iterable[Path]) -> dict[str, dict[str, Any]]:
    """Each elastic job's counter file (unreadable or partial files are skipped)."""
    out: dict[str, dict[str, Any]] = {}
    for path in paths:
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and "samples" in data:
            out[str(data.get("job") or Path(path).parent.name)] = data
    return out


def count_resumes(records: Iterable[StepRecord]) -> int:
    """How many times a job resumed from a checkpoint behind steps it had completed: epochs
    whose first step is not past the last step of the job's epoch before."""
    steps: dict[str, dict[int, list[int]]] = {}
    for r in records:
        if r.step >= 0:
            steps.setdefault(r.job, {}).setdefault(r.epoch, []).append(r.step)
    count = 0
    for epochs in steps.values():
        last = -1
        for epoch in sorted(epochs):
            count += min(epochs[epoch]) <= last
            last = max(epochs[epoch])
    return count
