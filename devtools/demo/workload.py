"""The demo's main-queue workload: production jobs whose idle gaps follow the Summit trace.

Every node alternates production work and idle gaps. The gap lengths are drawn from the real
Summit idle-fragment lengths (``data/summit/fragments.npy``, 411,151 fragments, median 475 s)
and time-compressed by ``compress`` (the default 60 turns one trace hour into one demo minute:
median gap 7.9 s, p90 56 s). Busy periods are sized so that about ``busy_fraction`` of the
nodes run production work on average.

Two kinds of production job, each pinned to its nodes (``sbatch -p prod -w NODES``) so the
gaps the schedule plans are the gaps the cluster shows:

* **fill** jobs, one node each, submitted at their start time; the node was idle (or
  harvested) until then.
* **big** jobs (``big_nodes`` nodes) that must wait: submitted while some of their nodes still
  run fill jobs, they stay pending until the last of those ends. The nodes that free up first
  sit in a *planned* hole (Slurm's backfill plan, ``squeue -t PD --start``, shows when the big
  job will take them), each hole a drawn gap; the node released last goes straight from its
  fill job to the big job, as on a real machine where such a node is never idle.

Every job gets a time limit (whole minutes: Slurm's granularity) covering its run, so that the
backfill plan knows when nodes come back. :func:`plan` is pure and deterministic by seed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from malletrain_core.errors import ConfigError, InputFileError
from malletrain_core.sim.measured import shared_dir

FRAGMENTS_FILE = ("data", "summit", "fragments.npy")
DEFAULT_COMPRESS = 60.0
"""Trace seconds per demo second: one trace hour becomes one demo minute."""


@dataclass(frozen=True)
class ProdJob:
    """One production job of the plan: start ``start_s`` (demo seconds from the workload's
    start), run ``run_s`` on ``nodes``; ``submit_s`` ≤ ``start_s`` for big jobs that wait."""

    name: str
    kind: str  # "fill" or "big"
    nodes: tuple[str, ...]
    submit_s: float
    start_s: float
    run_s: float

    @property
    def end_s(self) -> float:
        return self.start_s + self.run_s

    @property
    def time_limit_min(self) -> int:
        """The job's time limit in whole minutes (at least one), above its run time."""
        return max(1, math.ceil((self.run_s + 2.0) / 60.0))

    def sbatch_args(self, partition: str = "prod") -> list[str]:
        """The sbatch arguments (no ``sbatch`` itself): pinned nodes, time limit, a sleep."""
        return ["-p", partition, "-J", self.name, "-N", str(len(self.nodes)),
                "-w", ",".join(self.nodes), "-t", str(self.time_limit_min), "-o", "/dev/null",
                "--wrap", f"sleep {self.run_s:.1f}"]


@dataclass(frozen=True)
class Workload:
    """The plan: jobs in submission order and, per node, the idle gaps it plans (seconds)."""

    jobs: tuple[ProdJob, ...]
    gaps: dict[str, list[float]]
    horizon_s: float
    compress: float

    def all_gaps(self) -> np.ndarray:
        return np.array([g for gs in self.gaps.values() for g in gs], dtype=np.float64)


def load_fragments(path: str | Path | None = None) -> np.ndarray:
    """The Summit idle-fragment lengths in seconds (positive ones only)."""
    path = Path(path) if path is not None else shared_dir().joinpath(*FRAGMENTS_FILE)
    try:
        frags = np.asarray(np.load(path), dtype=np.float64)
    except (OSError, ValueError) as exc:
        raise InputFileError(str(path), f"cannot read the fragment lengths ({exc}); set "
                             "MALLETRAIN_SHARED to the folder holding data/summit") from None
    frags = frags[frags > 0]
    if not len(frags):
        raise InputFileError(str(path), "holds no positive fragment length")
    return frags


class _Drawer:
    """Draws compressed gaps and busy lengths from one seeded generator."""

    def __init__(self, fragments: np.ndarray, compress: float, busy_fraction: float,
                 max_gap_s: float, min_busy_s: float, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.gaps = np.minimum(fragments / compress, max_gap_s)
        self.min_busy_s = min_busy_s
        self.mean_busy_s = max(min_busy_s, float(self.gaps.mean()) * busy_fraction
                               / (1.0 - busy_fraction))

    def gap(self) -> float:
        return float(self.rng.choice(self.gaps))

    def busy(self) -> float:
        return max(self.min_busy_s, float(self.rng.exponential(self.mean_busy_s)))


def plan(nodes: Sequence[str], horizon_s: float, seed: int = 0, *,
         fragments: np.ndarray | None = None, compress: float = DEFAULT_COMPRESS,
         busy_fraction: float = 0.6, big_every_s: float = 50.0,
         big_nodes: tuple[int, int] = (3, 6), min_busy_s: float = 4.0) -> Workload:
    """Plan the production jobs of ``horizon_s`` demo seconds on ``nodes`` (see the module doc).

    Big jobs start about every ``big_every_s`` on ``big_nodes`` (lo, hi) nodes; the first
    busy period of each node began before the workload (its length is a random residue).
    """
    if len(nodes) < 2 or horizon_s <= 0 or compress <= 0 or not 0 < busy_fraction < 1:
        raise ConfigError("workload: needs ≥ 2 nodes, horizon_s > 0, compress > 0 and "
                          "0 < busy_fraction < 1")
    lo, hi = big_nodes
    if not 2 <= lo <= hi <= len(nodes):
        raise ConfigError(f"workload: big_nodes={big_nodes}: give 2 ≤ lo ≤ hi ≤ {len(nodes)}")
    frags = load_fragments() if fragments is None else np.asarray(fragments, np.float64)
    draw = _Drawer(frags, compress, busy_fraction, max_gap_s=horizon_s / 2,
                   min_busy_s=min_busy_s, seed=seed)
    rng = draw.rng
    # Per node: its jobs as [start, end, kind-index], and the drawn gap before its next job.
    timeline: dict[str, list[list[float]]] = {n: [] for n in nodes}
    pending = {n: draw.gap() for n in nodes}
    gaps: dict[str, list[float]] = {n: [] for n in nodes}
    for n in nodes:  # the first busy period of each node began before the workload
        timeline[n].append([0.0, max(min_busy_s, draw.busy() * float(rng.random())), -1])

    def fill_until(t: float) -> None:
        for n in nodes:
            while timeline[n][-1][1] + pending[n] < t:
                start = timeline[n][-1][1] + pending[n]
                gaps[n].append(pending[n])
                timeline[n].append([start, start + draw.busy(), -1])
                pending[n] = draw.gap()

    bigs: list[ProdJob] = []
    t = big_every_s * (0.5 + 0.5 * rng.random())
    while t < horizon_s:
        fill_until(t)
        free = [n for n in nodes if timeline[n][-1][2] < 0 and timeline[n][-1][1] <= t + 60]
        k = int(rng.integers(lo, hi + 1))
        if len(free) >= k:
            chosen = sorted(rng.choice(free, k, replace=False).tolist())
            last = chosen[int(rng.integers(k))]  # released last: goes straight to the big job
            hole = {n: 0.0 if n == last else pending[n] for n in chosen}
            # Each node's last fill is stretched or cut to end exactly where its hole begins.
            start = max(timeline[n][-1][0] + min_busy_s + hole[n] for n in chosen)
            run = draw.busy() * (1.0 + float(rng.random()))
            for n in chosen:
                timeline[n][-1][1] = start - hole[n]
                if hole[n] > 0:
                    gaps[n].append(hole[n])
                timeline[n].append([start, start + run, len(bigs)])
                pending[n] = draw.gap()
            submit = max(timeline[n][-2][0] for n in chosen) + 0.5
            bigs.append(ProdJob("", "big", tuple(chosen), submit, start, run))
        t += big_every_s * (0.75 + 0.5 * rng.random())
    fill_until(horizon_s)
    jobs = [ProdJob("", "fill", (n,), a, a, e - a) for n in nodes
            for a, e, kind in timeline[n] if kind < 0] + bigs
    ordered = sorted(jobs, key=lambda j: (j.submit_s, j.kind, j.nodes))
    named = tuple(ProdJob(f"prod-{j.kind}-{i:03d}", j.kind, j.nodes, round(j.submit_s, 3),
                          round(j.start_s, 3), round(j.run_s, 3)) for i, j in enumerate(ordered))
    return Workload(named, gaps, horizon_s, compress)


def schedule_gaps(jobs: Sequence[ProdJob]) -> dict[str, list[float]]:
    """The idle gaps between consecutive production jobs on each node, as planned (gaps of
    10 ms or less are rounding, not gaps)."""
    spans: dict[str, list[tuple[float, float]]] = {}
    for j in jobs:
        for n in j.nodes:
            spans.setdefault(n, []).append((j.start_s, j.end_s))
    out: dict[str, list[float]] = {}
    for n, s in spans.items():
        s.sort()
        out[n] = [b[0] - a[1] for a, b in zip(s, s[1:]) if b[0] - a[1] > 0.01]
    return out
