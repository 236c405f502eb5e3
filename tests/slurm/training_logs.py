"""Reading what elastic training tasks wrote (examples/train_elastic.py's log lines).

The assertions of the end-to-end tests read Slurm and the workers, never the daemon's view:
these helpers parse the workers' own output files.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from devtools.runlogs.epochs import EpochSteps

STEP = re.compile(r"^step=(\d+) epoch=(\d+) world=(\d+) rank=(\d+) samples=\S+ loss=\S+ "
                  r"params=(\w+)")
START = re.compile(r"^start step=(\d+) epoch=(\d+) world=(\d+) rank=(\d+) .*resumed=(yes|no)")
CKPT = re.compile(r"^checkpoint step=(\d+) epoch=(\d+) world=(\d+)")


class StepRow(NamedTuple):
    step: int
    world: int
    rank: int
    params: str


@dataclass
class JobLog(EpochSteps):
    """Everything the tasks of one job printed, keyed by epoch."""

    steps: dict[int, list[StepRow]] = field(
        default_factory=lambda: defaultdict(list))       # epoch -> its step lines
    starts: dict[int, list[tuple[int, int, int]]] = field(
        default_factory=lambda: defaultdict(list))       # epoch -> (step, world, rank)
    checkpoints: list[tuple[int, int]] = field(default_factory=list)  # (epoch, step)


def read_job(outdir: Path, job: str) -> JobLog:
    log = JobLog()
    for path in sorted(outdir.glob(f"task-{job}_*.out")):
        for line in path.read_text(errors="replace").splitlines():
            if m := STEP.match(line):
                step, epoch, world, rank = (int(x) for x in m.groups()[:4])
                log.steps[epoch].append(StepRow(step, world, rank, m.group(5)))
            elif m := START.match(line):
                step, epoch, world, rank = (int(x) for x in m.groups()[:4])
                log.starts[epoch].append((step, world, rank))
            elif m := CKPT.match(line):
                log.checkpoints.append((int(m.group(2)), int(m.group(1))))
    return log


def invariant_problems(log: JobLog) -> list[str]:
    """What breaks the training contract: ranks of one epoch disagreeing on the world size or
    on the parameters after a step, a world size that is not the number of ranks, or a
    resume from anything but the last checkpoint."""
    problems = []
    for epoch, rows in log.steps.items():
        worlds = {w for _, w, _, _ in rows}
        if len(worlds) != 1:
            problems.append(f"epoch {epoch}: ranks disagree on the world size {sorted(worlds)}")
        ranks = {r for _, _, r, _ in rows}
        if ranks and max(ranks) >= min(worlds):
            problems.append(f"epoch {epoch}: rank {max(ranks)} in a world of {min(worlds)}")
        by_step: dict[int, set[str]] = defaultdict(set)
        for step, _, _, params in rows:
            by_step[step].add(params)
        for step, digests in sorted(by_step.items()):
            if len(digests) > 1:
                problems.append(f"epoch {epoch} step {step}: parameters differ across ranks "
                                f"({sorted(digests)})")
    for epoch, starts in sorted(log.starts.items()):
        steps = {s for s, _, _ in starts}
        before = [s for e, s in log.checkpoints if e < epoch]
        expected = before[-1] if before else 0
        if before:
            expected = max(before)
        if steps != {expected}:
            problems.append(f"epoch {epoch} resumed at step {sorted(steps)}, the last "
                            f"checkpoint before it was step {expected}")
    return problems
