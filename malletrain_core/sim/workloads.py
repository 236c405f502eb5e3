"""Simulated job sets built from the measured scaling profiles.

A :class:`SimJob` carries the job's TRUE curve and costs; what the engine is told about it
depends on the policy (see :mod:`.policies`). Two shapes:

* saturated: N jobs, all submitted at the trace's start, that never finish (work is
  unbounded), so the job set is fixed and the upper bound UB_oracle is defined; the N jobs are
  drawn from the workload's profiles by the seed;
* with arrivals: N jobs drawn by the seed, each with its ``Pmax`` samples to train, arriving
  at its ``Tsub`` (kept as is when the first arrival falls inside the trace, as the ImageNet
  and Summit data are aligned; otherwise all shifted so the first arrival is the trace's
  start). Each seed thus brings a different job mix arriving over the same hours.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError
from ..model import Curve
from .measured import WORKLOAD_FILES, ProfiledJob, load_profiles


@dataclass(frozen=True)
class SimJob:
    """One simulated job with its true scalability, bounds, rescale costs and work."""

    id: str
    model: str
    curve: Curve
    min_nodes: int
    max_nodes: int
    scale_up_s: float
    scale_down_s: float
    work: float | None
    submit_time: float


def make_workload(name: str, jobs: int, *, arrivals: bool = False, seed: int = 0,
                  start: float = 0.0, end: float | None = None,
                  profiles: list[ProfiledJob] | None = None) -> list[SimJob]:
    """``jobs`` jobs of workload ``name`` (``imagenet``, ``hpo``) for a trace from ``start``
    to ``end``; saturated unless ``arrivals``."""
    if name not in WORKLOAD_FILES:
        raise ConfigError(f"unknown workload {name!r}; choose one of {sorted(WORKLOAD_FILES)}")
    pool = profiles if profiles is not None else load_profiles(name)
    if jobs < 1:
        raise ConfigError(f"--jobs {jobs}: give at least 1 job")
    if jobs > len(pool):
        raise ConfigError(f"--jobs {jobs}: workload {name!r} has only {len(pool)} jobs")
    rng = np.random.default_rng([seed, 7])
    picked = sorted(rng.choice(len(pool), size=jobs, replace=False).tolist())
    if not arrivals:
        return [_sim_job(pool[i], None, start) for i in picked]
    chosen = sorted((pool[i] for i in picked), key=lambda p: p.submit_time)
    first = chosen[0].submit_time
    inside = end is None or start <= first < end
    shift = 0.0 if inside and first >= start else start - first
    return [_sim_job(p, p.work, p.submit_time + shift) for p in chosen]


def _sim_job(p: ProfiledJob, work: float | None, submit: float) -> SimJob:
    return SimJob(id=p.name, model=p.model, curve=p.curve, min_nodes=p.min_nodes,
                  max_nodes=p.max_nodes, scale_up_s=p.scale_up_s, scale_down_s=p.scale_down_s,
                  work=work, submit_time=submit)


def model_curves(jobs: list[SimJob], extra: list[ProfiledJob] | None = None) -> dict[str, Curve]:
    """One true curve per model name (the first seen), from the jobs and ``extra`` profiles."""
    curves: dict[str, Curve] = {}
    for j in jobs:
        curves.setdefault(j.model, j.curve)
    for p in extra or ():
        curves.setdefault(p.model, p.curve)
    return curves
