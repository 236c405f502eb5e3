"""Reading the step lines of ``malletrain_core.worker`` integrations (``MALLETRAIN_LOG_EVERY``).

    malletrain: start step=S epoch=E world=W rank=R resumed=yes|no|memory cursor=C params=P run=ID
    malletrain: step=S epoch=E world=W rank=R batch=A-B samples=N loss=L params=P run=ID t=T
    malletrain: checkpoint step=S epoch=E world=W cursor=C

From the workers' own output (never the daemon's view) :func:`lineage` rebuilds the updates
that survive — each epoch resumed from the newest checkpoint before it; the steps it trained
after that checkpoint's step were lost with it — and :func:`problems` checks the contract.
"""

from __future__ import annotations

import re
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from .epochs import EpochSteps

PREFIX = r"(?:^|[^\w-])malletrain: "   # progress bars may share the line
START = re.compile(PREFIX + r"start step=(\d+) epoch=(\d+) world=(\d+) rank=(\d+) "
                   r"resumed=(yes|no|memory) cursor=(-?\d+) params=(\w+) run=(\S+)")
STEP = re.compile(PREFIX + r"step=(\d+) epoch=(\d+) world=(\d+) rank=(\d+) batch=(\d+)-(\d+) "
                  r"samples=\d+ loss=(\S+) params=(\w+) run=(\S+) t=([\d.]+)")
CKPT = re.compile(PREFIX + r"checkpoint step=(\d+) epoch=(\d+) world=(\d+) cursor=(-?\d+)")

# How tests/slurm/test_byo_e2e.py and bench/byo.py run each integration's example script.
ENV = ["env", "MALLETRAIN_LOG_EVERY=1", "MALLETRAIN_MIN_STEP_S=0.15",
       "MALLETRAIN_CHECKPOINT_EVERY_S=6", "OMP_NUM_THREADS=1"]
# lr 0.01, not the examples' 0.05: with momentum 0.9 and 8-sample batches, 0.05 makes the
# logged loss bounce, and the loss check of the byo test then fails on short runs (a CPU simulation of
# these world sizes over 40 seeds: 50-80 % passed at 0.05, all passed at 0.01).
SCRIPTS = {
    "torchrun": [sys.executable, "examples/torchrun/after.py", "--epochs", "100000",
                 "--batch-size", "8", "--lr", "0.01"],
    "lightning": [sys.executable, "examples/lightning/after.py", "--epochs", "100000",
                  "--batch-size", "8", "--lr", "0.01", "--num-nodes", "1", "--root-dir", "{out}"],
    # The Trainer's own sampler: positions in its step lines follow from the step and the
    # constant global batch (48 = 8 per device × 1, 2 or 3 processes × accumulation).
    "hf": [sys.executable, "examples/hf/after.py", "--output-dir", "{out}/hf", "--epochs",
           "1000", "--batch-size", "8"],
}


@dataclass(frozen=True)
class Step:
    step: int
    epoch: int
    world: int
    rank: int
    first: int
    stop: int
    loss: float
    params: str
    run: str
    t: float


@dataclass
class ByoLog(EpochSteps):
    """Everything the tasks of one job printed."""

    starts: dict[int, list[tuple[int, int, int, int, str, str]]] = field(
        default_factory=lambda: defaultdict(list))   # epoch -> (step, world, rank, cursor, params, run)
    in_memory: set[int] = field(default_factory=set)  # epochs whose state was handed over in process
    steps: dict[int, list[Step]] = field(default_factory=lambda: defaultdict(list))
    checkpoints: list[tuple[int, int, int]] = field(default_factory=list)  # (epoch, step, cursor)

    def runs(self) -> set[str]:
        return {r.run for rows in self.steps.values() for r in rows} | \
            {s[5] for rows in self.starts.values() for s in rows}


def read(outdir: Path, job: str) -> ByoLog:
    log = ByoLog()
    for path in sorted(outdir.glob(f"task-{job}_*.out")):
        for line in path.read_text(errors="replace").splitlines():
            if m := STEP.search(line):
                g = m.groups()
                log.steps[int(g[1])].append(Step(int(g[0]), int(g[1]), int(g[2]), int(g[3]),
                                                 int(g[4]), int(g[5]), float(g[6]), g[7], g[8],
                                                 float(g[9])))
            elif m := START.search(line):
                g = m.groups()
                log.starts[int(g[1])].append((int(g[0]), int(g[2]), int(g[3]), int(g[5]),
                                              g[6], g[7]))
                if g[4] == "memory":
                    log.in_memory.add(int(g[1]))
            elif m := CKPT.search(line):
                log.checkpoints.append((int(m.group(2)), int(m.group(1)), int(m.group(4))))
    return log


def lineage(log: ByoLog) -> list[Step]:
    """The surviving updates, one row per step (rank 0's), in step order."""
    by_epoch = {e: {r.step: r for r in rows if r.rank == 0} for e, rows in log.steps.items()}
    kept: dict[int, Step] = {}
    for epoch in sorted(by_epoch):
        start = min((s for s, *_ in log.starts.get(epoch, [])), default=None)
        if start is None:
            start = min(by_epoch[epoch]) - 1
        kept = {s: r for s, r in kept.items() if s <= start}
        kept.update(by_epoch[epoch])
    return [kept[s] for s in sorted(kept)]


def problems(log: ByoLog) -> list[str]:
    """Ranks disagreeing in one step, resumes from anything but the newest checkpoint, and
    gaps or overlaps in the global sample positions of the surviving updates."""
    out = []
    for epoch, rows in log.steps.items():
        if len({r.world for r in rows}) != 1:
            out.append(f"epoch {epoch}: ranks disagree on the world size")
        by_step: dict[int, list[Step]] = defaultdict(list)
        for r in rows:
            by_step[r.step].append(r)
        for step, same in by_step.items():
            if len({r.params for r in same}) > 1 or len({(r.first, r.stop) for r in same}) > 1:
                out.append(f"epoch {epoch} step {step}: ranks differ")
    for epoch, starts in sorted(log.starts.items()):
        before = [(s, c) for e, s, c in log.checkpoints if e < epoch]
        expected = max(before) if before else (0, 0)
        got = {(s, c) for s, _, _, c, _, _ in starts}
        if epoch in log.in_memory:  # in process: every rank at the hand-over's (step, cursor)
            if len(got) != 1:
                out.append(f"epoch {epoch}: ranks started at (step, cursor) {sorted(got)}")
        elif got != {expected}:
            out.append(f"epoch {epoch} resumed at (step, cursor) {sorted(got)}, the newest "
                       f"checkpoint before it was {expected}")
        if len({p for *_, p, _ in starts}) > 1:
            out.append(f"epoch {epoch}: ranks loaded different parameters")
    kept = lineage(log)
    cursor = 0
    for r in kept:
        if r.first != cursor:
            out.append(f"step {r.step} trained positions {r.first}-{r.stop}, expected from "
                       f"{cursor}")
        cursor = r.stop
    return out


def lost_per_epoch_change(log: ByoLog) -> list[tuple[str, int, float]]:
    """("W→W'", samples trained after the checkpoint the next epoch resumed from (lost),
    pause in seconds from the last step to the next epoch's first step) for each epoch
    with steps followed by another."""
    out = []
    epochs = [e for e in log.epochs if log.steps.get(e)]
    for e, nxt in zip(epochs, epochs[1:]):
        resumed = {c for _, _, _, c, _, _ in log.starts.get(nxt, [])}
        reached = max(r.stop for r in log.steps[e])
        lost = reached - min(resumed) if resumed else 0
        pause = min(r.t for r in log.steps[nxt]) - max(r.t for r in log.steps[e])
        change = f"{log.steps[e][0].world}→{log.steps[nxt][0].world}"
        out.append((change, max(0, lost), round(pause, 2)))
    return out
