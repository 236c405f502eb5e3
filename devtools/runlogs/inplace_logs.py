"""Reading in-place training under real Slurm: the workers' JSON step lines and the daemon's
epoch lines.

The workers (tests/workers/inplace_train.py) print one JSON object per step (time, global
step, epoch, world, rank, local rank, sampler position, pid, state digest; the N processes of
a node, ``--nproc-per-node N``, share their task's output); the daemon logs every epoch it
starts with the path it took (``job J: epoch N, world W, path inplace|disk``). Used by
tests/slurm/test_inplace_slurm.py and bench/e2e_paths.py.
"""

from __future__ import annotations

import re
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .jsonlines import read_json_lines

EPOCH_LINE = r"job[= ]{job}:? epoch (\d+), world (\d+), path (\w+)( \(abandon\))?"


@dataclass
class InplaceLog:
    """Everything the tasks of one job printed: committed steps and re-forms."""

    steps: list[dict[str, Any]] = field(default_factory=list)      # committed steps, by time
    changes: list[dict[str, Any]] = field(default_factory=list)

    def epochs(self) -> list[int]:
        return sorted({r["epoch"] for r in self.steps})

    def in_epoch(self, epoch: int) -> list[dict[str, Any]]:
        return [r for r in self.steps if r["epoch"] == epoch]

    def trained(self, epoch: int, world: int, steps: int = 3) -> bool:
        """Every rank of a ``world``-wide ``epoch`` committed ``steps`` steps in it."""
        rows = self.in_epoch(epoch)
        return all(sum(1 for r in rows if r["rank"] == k and r["world"] == world) >= steps
                   for k in range(world))

    def max_step(self) -> int:
        return max((r["step"] for r in self.steps), default=0)


def read(outdir: Path, job: str) -> InplaceLog:
    log = InplaceLog()
    for path in sorted(outdir.glob(f"task-{job}_*.out")):
        for rec in read_json_lines(path):
            # one process of the task: several per node share its output
            rec["task"] = f"{path.name}:{rec.get('local', 0)}"
            if "change" in rec:
                log.changes.append(rec)
            elif "step" in rec and not rec.get("failed") and rec.get("epoch") is not None:
                log.steps.append(rec)
    log.steps.sort(key=lambda r: r["t"])
    return log


def daemon_epochs(daemon_log: str, job: str) -> dict[int, tuple[int, str, bool]]:
    """epoch → (world, path, abandon) as the daemon logged them."""
    out = {}
    for m in re.finditer(EPOCH_LINE.format(job=re.escape(job)), daemon_log):
        out[int(m.group(1))] = (int(m.group(2)), m.group(3), bool(m.group(4)))
    return out


def problems(log: InplaceLog, batch: int) -> list[str]:
    """What breaks the in-place contract: ranks of one epoch holding different states after
    the same step; a sample counted twice or skipped (the sampler position must grow by
    ``batch × world`` per committed step, along the steps that were kept)."""
    out = []
    by: dict[tuple[int, int], set[str]] = defaultdict(set)
    for r in log.steps:
        if "digest" in r:
            by[(r["epoch"], r["step"])].add(r["digest"])
    for (epoch, step), digests in sorted(by.items()):
        if len(digests) > 1:
            out.append(f"epoch {epoch} step {step}: states differ across ranks {sorted(digests)}")
    kept: dict[int, tuple[int, int]] = {}   # step -> (position after it, world)
    for epoch in log.epochs():  # an epoch that starts back (from disk) drops what followed
        rows = log.in_epoch(epoch)
        first = min(r["step"] for r in rows)
        kept = {s: v for s, v in kept.items() if s < first}
        for r in rows:
            kept[r["step"]] = (r["pos"], r["world"])
    for step in sorted(kept):
        if step - 1 in kept:
            pos, world = kept[step]
            if pos - kept[step - 1][0] != batch * world:
                out.append(f"step {step}: the sampler moved {pos - kept[step - 1][0]} samples, "
                           f"{batch} × world {world} = {batch * world} expected")
        elif step == 1 and kept[step][0] != batch * kept[step][1]:
            out.append(f"step 1: sampler at {kept[step][0]}")
    return out


def change(log: InplaceLog, before: int, after: int) -> tuple[float, int]:
    """The pause of a change from epoch ``before`` to ``after`` on the members of both (their
    tasks' processes, by local rank: in place the same process, on the restart path a new
    one; the median over them of
    the gap between their last step before and first step after) and the steps it lost (the
    largest: last global step before − first step after + 1)."""
    gaps, lost = [], 0
    for task in ({r["task"] for r in log.in_epoch(before)}
                 & {r["task"] for r in log.in_epoch(after)}):
        old = [r for r in log.in_epoch(before) if r["task"] == task]
        new = [r for r in log.in_epoch(after) if r["task"] == task]
        gaps.append(new[0]["t"] - old[-1]["t"])
        lost = max(lost, old[-1]["step"] - (new[0]["step"] - 1))
    if not gaps:  # no process lived through it (every node lost): the job's own gap
        old, new = log.in_epoch(before), log.in_epoch(after)
        gaps = [new[0]["t"] - old[-1]["t"]]
        lost = max(r["step"] for r in old) - (min(r["step"] for r in new) - 1)
    return statistics.median(gaps), lost
