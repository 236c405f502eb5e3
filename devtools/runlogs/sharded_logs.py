"""Reading examples/train_sharded.py under real Slurm: its ``start`` and ``step`` lines, and the
daemon's epoch lines with their time of day.

The example prints, at the first step of every epoch, ``start step=S epoch=E world=W rank=R
mode=M params=P reform_s=X t=T moved={...}`` (``moved``: what the change moved, as
``sharded.ShardedHandover.moved`` says) and, every ``--log-every`` steps, ``step=N epoch=E
world=W rank=R samples=... loss=... t=T copies=...``; ``t`` is the wall-clock time the line was
printed (absent from lines of older runs). The processes of a node share their task's output
file, and two lines written at once can end up on one line, so the patterns are not anchored.
Used by tests/slurm/test_sharded_slurm.py (what each change moved) and bench/sharded.py (when
it happened).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, NamedTuple

from .epochs import latest_epoch

START = re.compile(r"start step=(\d+) epoch=(\d+) world=(\d+) rank=(\d+) mode=(\w+) "
                   r"params=\d+ reform_s=\S+(?: t=(\d+\.\d+))? moved=(\{[^{}]*\})")
STEP = re.compile(r"(?<!\S)step=(\d+) epoch=(\d+) world=(\d+) rank=(\d+) samples=\S+ loss=\S+"
                  r"(?: t=(\d+\.\d+))?")
DAEMON_EPOCH = (r"^(\d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d,\d{{3}}) .*job[= ]{job}:? epoch (\d+), "
                r"world (\d+), path (\w+)( \(abandon\))?")
"""The daemon's line for each epoch it started (malletrain_core/daemon/main.py), behind the log
format's ``asctime`` (local time, milliseconds after a comma)."""


class StepLine(NamedTuple):
    """One ``step=`` line: ``step`` steps done, at ``world`` (processes), by ``rank``, at
    wall-clock ``t`` (None on lines without one)."""

    step: int
    world: int
    rank: int
    t: float | None = None


class StartLine(NamedTuple):
    """One ``start`` line: the epoch began from ``step`` steps done, at ``world``, on ``rank``,
    at wall-clock ``t``; ``moved`` is what the change moved."""

    step: int
    world: int
    rank: int
    t: float | None
    moved: dict[str, Any]


@dataclass
class ShardedLog:
    """The example's lines in a job's output files, by epoch: the start lines by rank and the
    step lines."""

    begun: dict[int, dict[int, StartLine]] = field(default_factory=dict)
    steps: dict[int, list[StepLine]] = field(default_factory=dict)

    @property
    def starts(self) -> dict[int, dict[int, dict[str, Any]]]:
        """What each epoch's change moved, by rank (the start lines' ``moved``)."""
        return {e: {r: s.moved for r, s in rows.items()} for e, rows in self.begun.items()}

    def latest(self) -> tuple[int, int, set[int]] | None:
        """(newest epoch with steps, its world, the ranks seen in it)."""
        return latest_epoch(self.steps)

    def trained(self, epoch: int, world: int, steps: int = 2) -> bool:
        """Every rank of a ``world``-wide ``epoch`` printed ``steps`` step lines in it."""
        rows = [r for r in self.steps.get(epoch, []) if r.world == world]
        return all(sum(1 for r in rows if r.rank == k) >= steps for k in range(world))

    def first_step_t(self, epoch: int) -> float | None:
        """When the first step line of ``epoch`` was printed (any rank: a step ends on every
        rank together, its collectives wait for all), None when none has a time."""
        times = [r.t for r in self.steps.get(epoch, []) if r.t is not None]
        return min(times) if times else None

    def last_step(self, epoch: int) -> int:
        """The most steps done that any rank of ``epoch`` printed (-1: none)."""
        return max((r.step for r in self.steps.get(epoch, [])), default=-1)

    def start_step(self, epoch: int) -> int | None:
        """The steps done the epoch began from (its start lines'), None without one."""
        rows = self.begun.get(epoch, {})
        return min(s.step for s in rows.values()) if rows else None


def _time(text: str | None) -> float | None:
    return float(text) if text else None


def parse_sharded(text: str, log: ShardedLog | None = None) -> ShardedLog:
    """The start and step lines of ``text`` (one output file), added to ``log``."""
    log = log if log is not None else ShardedLog()
    for m in START.finditer(text):
        step, epoch, world, rank = (int(m.group(i)) for i in range(1, 5))
        log.begun.setdefault(epoch, {})[rank] = StartLine(
            step, world, rank, _time(m.group(6)), ast.literal_eval(m.group(7)))
    for m in STEP.finditer(text):
        step, epoch, world, rank = (int(m.group(i)) for i in range(1, 5))
        log.steps.setdefault(epoch, []).append(StepLine(step, world, rank, _time(m.group(5))))
    return log


def sharded_log(outdir: Path, job: str) -> ShardedLog:
    """The example's start and step lines in ``job``'s output files (``task-JOB_I.out``)."""
    log = ShardedLog()
    for path in sorted(outdir.glob(f"task-{job}_*.out")):
        parse_sharded(path.read_text(errors="replace"), log)
    return log


@dataclass
class InNodes:
    """:meth:`ShardedLog.latest` counted in nodes (``nproc`` ranks each), for the tests'
    wait_consistent: one task is one node."""

    log: ShardedLog
    nproc: int

    def latest(self) -> tuple[int, int, set[int]] | None:
        got = self.log.latest()
        if got is None:
            return None
        epoch, world, ranks = got
        return epoch, world // self.nproc, {r // self.nproc for r in ranks}


class DaemonEpoch(NamedTuple):
    """An epoch as the daemon logged it: when (wall clock), its world, its path, abandon."""

    t: float
    world: int
    path: str
    abandon: bool


def daemon_epoch_times(daemon_log: str, job: str) -> dict[int, DaemonEpoch]:
    """epoch → :class:`DaemonEpoch` from the daemon's log: the time of its line is when the
    daemon ordered the epoch (logged as the order is saved, before any launcher acts on it)."""
    out = {}
    pattern = re.compile(DAEMON_EPOCH.format(job=re.escape(job)), re.M)
    for m in pattern.finditer(daemon_log):
        t = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
        out[int(m.group(2))] = DaemonEpoch(t, int(m.group(3)), m.group(4), bool(m.group(5)))
    return out
