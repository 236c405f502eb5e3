"""Every registered allocation policy replays a short synthetic trace with the real Engine."""

from __future__ import annotations

import numpy as np
import pytest

from malletrain_core.allocator import POLICIES
from malletrain_core.model import Curve
from malletrain_core.sim.bounds import BoundJob, compute_bounds
from malletrain_core.sim.perfmodel import PerfParams
from malletrain_core.sim.replay import replay
from malletrain_core.sim.sources import synthetic
from malletrain_core.sim.workloads import SimJob

CURVES = {"fast": Curve.of([1, 2, 4], [100.0, 190.0, 350.0]),
          "flat": Curve.of([1, 2, 4], [80.0, 110.0, 120.0])}


@pytest.fixture(scope="module")
def trace():
    return synthetic(nodes=6, days=0.05, seed=3, idle_fraction=0.5,
                     fragments=np.array([300, 900, 1800]))


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_every_registered_policy_replays_a_trace(trace, name: str) -> None:
    jobs = [SimJob(f"j{i}-{m}", m, c, 1, 4, 18.0, 12.0, None, 0.0)
            for i, (m, c) in enumerate(CURVES.items())]
    # "freetrain-exact" gives the jobs their true curves; the engine's policy is ``name``,
    # looked up in the registry as the daemon does (allocator.solver).
    run = replay(trace, jobs, "freetrain-exact", seed=0, params=PerfParams(noise=0.0),
                 engine_options={"solver": name})
    bounds = compute_bounds(trace, [BoundJob(j.curve, j.min_nodes, j.max_nodes) for j in jobs])
    assert run.invalid_actions == 0
    assert 0 < run.net_samples <= bounds.ub_oracle * (1 + 1e-9)
    assert 0 < run.node_seconds <= bounds.idle_node_seconds + 1e-6
