"""What the demo reads from the training side: each node's step log (when every step ran),
the workers' start-up lines and each job's counter file."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

STEP_JOIN_S = 0.25
"""Completed steps of one node less than this apart count as one stretch of training (the
bookkeeping between two steps); a longer pause (a re-form, a restart) is not counted."""


def read_step_logs(paths: Iterable[Path], until: float | None = None
                   ) -> dict[str, list[tuple[float, float]]]:
    """Per node, the ``(start, end)`` of every completed step, from the workers' step logs
    (``steps/<node>.log``: one ``START END`` line per completed step; the node is the file's
    name), only steps that ended by ``until`` when given (to read the logs again as they were
    read then). Malformed lines (a process killed mid-write) are skipped."""
    out: dict[str, list[tuple[float, float]]] = {}
    for path in paths:
        try:
            text = Path(path).read_text()
        except OSError:
            continue
        steps = out.setdefault(Path(path).stem, [])
        for line in text.splitlines():
            parts = line.split()
            try:
                start, end = float(parts[0]), float(parts[1])
            except (IndexError, ValueError):
                continue
            if len(parts) == 2 and end >= start and (until is None or end <= until):
                steps.append((start, end))
    return out


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
