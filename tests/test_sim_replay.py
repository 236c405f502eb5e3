"""The simulator end to end with the real Engine: bounds hold, runs are deterministic."""

from __future__ import annotations

import numpy as np
import pytest

from malletrain_core.events import JobSubmitted
from malletrain_core.model import Curve
from malletrain_core.sim.backend import SimBackend
from malletrain_core.sim.bounds import BoundJob, compute_bounds
from malletrain_core.sim.perfmodel import PerfParams
from malletrain_core.sim.policies import RUN_POLICIES, job_requests
from malletrain_core.sim.replay import replay
from malletrain_core.sim.sources import synthetic
from malletrain_core.sim.workloads import SimJob

FRAGMENTS = np.array([200, 400, 900, 1800, 3600])
CURVES = {
    "fast": Curve.of([1, 2, 4, 8], [100.0, 190.0, 350.0, 600.0]),
    "flat": Curve.of([1, 2, 4, 8], [80.0, 110.0, 120.0, 125.0]),
    "linear": Curve.of([1, 8], [50.0, 400.0]),
}


def _jobs(work: float | None = None, start: float = 0.0) -> list[SimJob]:
    return [SimJob(f"j{i}-{m}", m, c, 1, 8, 18.0, 12.0, work, start + 30.0 * i * (work is not None))
            for i, (m, c) in enumerate(CURVES.items())]


@pytest.fixture(scope="module")
def trace():
    return synthetic(nodes=12, days=0.15, seed=2, idle_fraction=0.4, fragments=FRAGMENTS)


@pytest.mark.parametrize("policy", RUN_POLICIES)
def test_no_policy_beats_ub_oracle(trace, policy: str) -> None:
    jobs = _jobs()
    bounds = compute_bounds(trace, [BoundJob(j.curve, j.min_nodes, j.max_nodes) for j in jobs])
    run = replay(trace, jobs, policy, seed=0, params=PerfParams(noise=0.0), catalogue=CURVES)
    assert 0 <= run.net_samples <= bounds.ub_oracle * (1 + 1e-9)
    assert bounds.ub_oracle <= bounds.ub_lin
    assert run.node_seconds <= bounds.idle_node_seconds + 1e-6
    assert run.invalid_actions == 0
    if policy in ("freetrain-exact", "greedy", "malletrain"):
        assert run.net_samples > 0.5 * bounds.ub_oracle


def test_same_seed_same_result_other_seed_differs(trace) -> None:
    def figures(seed: int) -> tuple:
        r = replay(trace, _jobs(), "malletrain", seed=seed, params=PerfParams(noise=0.05))
        return (r.net_samples, r.rescales, r.preemptions, r.preemption_loss, r.node_seconds,
                tuple(r.sample_net))

    assert figures(4) == figures(4)
    assert figures(4) != figures(5)


def test_arrivals_complete_and_report_completion_times(trace) -> None:
    jobs = _jobs(work=2e5, start=trace.start)
    run = replay(trace, jobs, "freetrain-exact", seed=0, params=PerfParams(noise=0.0))
    assert run.completed_jobs == 3
    assert run.mean_jct_s is not None and run.mean_jct_s > 2e5 / 600
    assert run.trained_samples == pytest.approx(3 * 2e5)
    assert run.makespan_s is not None and run.makespan_s >= run.mean_jct_s


def test_preemption_losses_are_charged_with_periodic_checkpoints(trace) -> None:
    base = replay(trace, _jobs(), "freetrain-exact", seed=0, params=PerfParams(noise=0.0))
    ckpt = replay(trace, _jobs(), "freetrain-exact", seed=0,
                  params=PerfParams(noise=0.0, checkpoint_interval_s=600.0))
    assert base.preemptions > 0
    assert base.makespan_s is None  # saturated jobs never finish
    assert ckpt.preemption_loss > base.preemption_loss
    assert ckpt.net_samples < base.net_samples


def test_malletrain_engine_never_sees_a_true_curve(trace) -> None:
    jobs = _jobs()
    assert all(r.curve is None for r in job_requests("malletrain", jobs, 0))
    backend = SimBackend(trace, jobs, job_requests("malletrain", jobs, 0))
    submitted = [e for e in backend.poll(trace.start) if isinstance(e, JobSubmitted)]
    assert len(submitted) == 3 and all(e.job.curve is None for e in submitted)
    exact = job_requests("freetrain-exact", jobs, 0)
    assert [r.curve for r in exact] == [j.curve for j in jobs]
