"""The allocator on hand-checked instances: DP, count MILP, per-node MILP, solver selection."""

from __future__ import annotations

import numpy as np
import pytest

from malletrain_core.allocator import milp, pernode, solve
from malletrain_core.allocator.objective import evaluate, job_values
from malletrain_core.errors import InfeasibleError, SolverError, ValidationError
from malletrain_core.model import Constraints, Curve, Job, Objective, Problem
from malletrain_core.sim.measured import load_profiles


def linear(rate: float, upto: int = 64) -> Curve:
    return Curve.of([1, upto], [rate, rate * upto])


def make(nodes: int, *jobs: Job, lookahead_s: float = 120.0, **cons: object) -> Problem:
    return Problem(nodes, tuple(jobs), lookahead_s, constraints=Constraints(**cons))  # type: ignore[arg-type]


def profiled(nodes: int, count: int, seed: int = 7) -> Problem:
    """Jobs with the measured ImageNet curves and varied current sizes."""
    rng = np.random.default_rng(seed)
    profiles = load_profiles("imagenet")
    picks = rng.choice(len(profiles), count, replace=False)
    held = rng.multinomial(int(0.6 * nodes), np.ones(count) / count)
    jobs = []
    for i, p in enumerate(profiles[int(x)] for x in picks):
        jobs.append(Job(p.name, p.max_nodes, p.min_nodes, p.curve, p.scale_up_s, p.scale_down_s,
                        int(min(held[i], p.max_nodes)), owner=f"user{i % 3}", model=p.model))
    return Problem(nodes, tuple(jobs))


class TestValues:
    def test_idle_job_starts_for_free(self) -> None:
        j = Job("a", 4, curve=linear(10.0), scale_up_s=18.0, scale_down_s=12.0)
        assert job_values(j, 8, 120.0, Objective.THROUGHPUT).tolist() == \
            [0.0, 1200.0, 2400.0, 3600.0, 4800.0]

    def test_rescale_costs_use_the_rate_before_the_change(self) -> None:
        j = Job("a", 4, curve=linear(10.0), scale_up_s=18.0, scale_down_s=12.0, current_nodes=2)
        # rate 20/s: a grow loses 18·20 = 360, a shrink 12·20 = 240.
        assert job_values(j, 8, 120.0, Objective.THROUGHPUT).tolist() == \
            [-240.0, 1200.0 - 240.0, 2400.0, 3600.0 - 360.0, 4800.0 - 360.0]

    def test_counts_below_min_are_infeasible(self) -> None:
        j = Job("a", 4, min_nodes=3, curve=linear(1.0))
        v = job_values(j, 8, 1.0, Objective.THROUGHPUT)
        assert v[0] == 0.0 and np.isneginf(v[1:3]).all() and v[3] == 3.0

    def test_evaluate_refuses_out_of_bounds(self) -> None:
        p = make(4, Job("a", 2, curve=linear(1.0)))
        with pytest.raises(ValueError, match="outside its bounds"):
            evaluate(p, {"a": 3})
        with pytest.raises(ValueError, match="only 4 available"):
            evaluate(p, {"a": 5})


class TestDP:
    def test_best_per_node_rate_first(self) -> None:
        p = make(5, Job("fast", 4, curve=linear(10.0)), Job("slow", 4, curve=linear(5.0)))
        sol = solve(p, "dp")
        assert dict(sol.counts) == {"fast": 4, "slow": 1}
        assert sol.objective == pytest.approx(120.0 * 45.0)
        assert sol.solver == "dp" and sol.status == "optimal"

    def test_short_lookahead_makes_a_grow_unprofitable(self) -> None:
        running = Job("a", 8, curve=linear(10.0), scale_up_s=18.0, current_nodes=2)
        # Growing to 3 gains 10/s over the look-ahead and costs 18 s at 20/s = 360.
        assert solve(make(3, running, lookahead_s=120.0)).counts["a"] == 3
        assert solve(make(3, running, lookahead_s=10.0)).counts["a"] == 2

    def test_no_nodes_no_jobs(self) -> None:
        assert dict(solve(make(0, Job("a", 4, curve=linear(1.0)))).counts) == {"a": 0}
        assert solve(make(5)).objective == 0.0

    def test_min_nodes_respected(self) -> None:
        p = make(5, Job("big", 8, min_nodes=6, curve=linear(100.0)),
                 Job("small", 2, curve=linear(1.0)))
        assert dict(solve(p).counts) == {"big": 0, "small": 2}


class TestCountMilp:
    def test_matches_dp_on_measured_curves(self) -> None:
        p = profiled(460, 50)
        dp_sol, milp_sol = solve(p, "dp"), solve(p, "milp")
        assert milp_sol.objective == pytest.approx(dp_sol.objective, rel=1e-9)
        assert sum(milp_sol.counts.values()) <= 460

    def test_user_cap(self) -> None:
        p = make(10, Job("a1", 8, curve=linear(10.0), owner="ann"),
                 Job("a2", 8, curve=linear(9.0), owner="ann"),
                 Job("b1", 8, curve=linear(1.0), owner="bob"), user_max_nodes={"ann": 6})
        sol = solve(p)
        assert sol.solver == "milp"
        assert dict(sol.counts) == {"a1": 6, "a2": 0, "b1": 4}

    def test_fairness_floor(self) -> None:
        # floor = ⌊0.5 · 12 / 3⌋ = 2 nodes each, raised to min_nodes 3 for "c".
        p = make(12, Job("a", 12, curve=linear(10.0)), Job("b", 12, curve=linear(1.0)),
                 Job("c", 12, min_nodes=3, curve=linear(1.0)), min_share=0.5)
        assert milp.fairness_floor(p) == {"a": 2, "b": 2, "c": 3}
        assert dict(solve(p).counts) == {"a": 7, "b": 2, "c": 3}

    def test_floor_capped_at_max_nodes(self) -> None:
        p = make(40, Job("a", 3, curve=linear(1.0)), Job("b", 40, curve=linear(1.0)),
                 min_share=1.0)
        assert milp.fairness_floor(p) == {"a": 3, "b": 20}

    def test_running_limit(self) -> None:
        p = make(8, Job("a", 4, curve=linear(10.0)), Job("b", 4, curve=linear(9.0)),
                 Job("c", 4, curve=linear(8.0)), max_running_jobs=1)
        assert dict(solve(p).counts) == {"a": 4, "b": 0, "c": 0}

    def test_running_limit_zero_stops_everything(self) -> None:
        p = make(8, Job("a", 4, curve=linear(10.0), current_nodes=2, scale_down_s=5.0),
                 max_running_jobs=0)
        sol = solve(p)
        assert dict(sol.counts) == {"a": 0}
        assert sol.objective == pytest.approx(-5.0 * 20.0)

    def test_floors_beyond_capacity_are_infeasible(self) -> None:
        p = make(4, Job("a", 4, min_nodes=3, curve=linear(1.0)),
                 Job("b", 4, min_nodes=3, curve=linear(1.0)), min_share=1.0)
        with pytest.raises(InfeasibleError, match="fairness floors need 6 nodes"):
            solve(p)

    def test_floor_against_running_limit_is_infeasible(self) -> None:
        p = make(8, Job("a", 4, curve=linear(1.0)), Job("b", 4, curve=linear(1.0)),
                 min_share=1.0, max_running_jobs=1)
        with pytest.raises(InfeasibleError, match="max_running_jobs"):
            solve(p)

    def test_floor_against_user_cap_is_infeasible(self) -> None:
        p = make(8, Job("a", 4, curve=linear(1.0), owner="ann"), min_share=1.0,
                 user_max_nodes={"ann": 2})
        with pytest.raises(InfeasibleError, match="user 'ann'"):
            solve(p)

    def test_time_limit_without_proof_is_an_error(self) -> None:
        p = profiled(1000, 200, seed=1)
        with pytest.raises(SolverError, match="without a proven optimum"):
            solve(p, "milp", time_limit_s=1e-6)


class TestPerNode:
    def test_large_shrink_needs_the_fixed_big_m(self) -> None:
        # The optimum moves 15 of 16 nodes at once; FreeTrain's M = N + 1 allowed ~N/2.
        p = make(16, Job("old", 16, curve=linear(1.0), current_nodes=16, scale_down_s=1.0),
                 Job("new", 15, min_nodes=15, curve=linear(50.0)))
        ref = solve(p, "dp")
        assert dict(ref.counts) == {"old": 1, "new": 15}
        sol = solve(p, "pernode", time_limit_s=60)
        assert sol.status == "optimal" and sol.gap == 0.0
        assert sol.objective == pytest.approx(ref.objective, rel=1e-9)
        flawed = pernode.build(p, big_m=p.nodes + 1)
        flawed.highs.run()
        assert pernode.objective_of(p, flawed.counts(p)) < ref.objective - 1.0

    def test_matches_dp_and_keeps_nodes(self) -> None:
        p = profiled(64, 8, seed=3)
        model = pernode.build(p)
        assert model.num_binaries >= 64 * 8
        model.highs.setOptionValue("mip_rel_gap", 0.0)
        model.highs.run()
        counts = model.counts(p)
        assert pernode.objective_of(p, counts) == pytest.approx(solve(p, "dp").objective,
                                                                rel=1e-7)
        used: set[int] = set()
        for before, after in zip(pernode.current_blocks(p), model.assignment(p)):
            assert before <= after or after <= before
            assert not used & after
            used |= after

    def test_speedup_objective(self) -> None:
        p = Problem(12, (Job("a", 8, curve=Curve.of([1, 8], [10.0, 40.0]), current_nodes=2,
                             scale_up_s=18.0, scale_down_s=12.0),
                         Job("b", 8, curve=Curve.of([1, 8], [100.0, 700.0]))),
                    objective=Objective.SPEEDUP)
        assert solve(p, "pernode").objective == pytest.approx(solve(p, "dp").objective, rel=1e-9)

    def test_time_limit_returns_incumbent_and_gap(self) -> None:
        p = profiled(460, 50)
        try:
            sol = solve(p, "pernode", time_limit_s=3.0)
        except SolverError as err:  # no incumbent yet on a very slow machine
            assert "without a solution" in str(err)
            return
        assert sol.status == "time_limit" and sol.gap > 0
        assert sol.objective <= solve(p, "dp").objective * (1 + 1e-9)


class TestSolverChoice:
    def test_auto_uses_dp_without_constraints(self) -> None:
        assert solve(make(2, Job("a", 2, curve=linear(1.0)))).solver == "dp"

    def test_dp_refuses_side_constraints(self) -> None:
        with pytest.raises(ValidationError, match="use milp or auto"):
            solve(make(2, Job("a", 2, curve=linear(1.0)), max_running_jobs=1), "dp")

    def test_unknown_solver(self) -> None:
        with pytest.raises(ValidationError, match="choose one of auto, dp, milp, pernode"):
            solve(make(2), "cplex")

    def test_non_positive_time_limit(self) -> None:
        with pytest.raises(ValidationError, match="time_limit_s"):
            solve(make(2), "milp", time_limit_s=0)
