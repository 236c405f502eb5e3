"""Upper bounds on hand-checkable traces, baseline policies, and workloads."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from malletrain_core.allocator.baselines import equal_share, greedy, rigid
from malletrain_core.errors import ConfigError
from malletrain_core.model import Curve, Job, Problem
from malletrain_core.sim.bounds import BoundJob, best_values, compute_bounds, linear_values
from malletrain_core.sim.policies import linear_curve, mismatched_curves, parse_policies
from malletrain_core.sim.traces import from_transitions
from malletrain_core.sim.workloads import SimJob, make_workload

A = Curve.of([1, 2, 3], [10.0, 15.0, 18.0])
B = Curve.of([1, 2], [8.0, 16.0])


def _trace():
    # 3 nodes; idle: [0,100): n0; [100,200): n0,n1,n2; [200,300): n2; end 300.
    return from_transitions("tiny", ["n0", "n1", "n2"], np.array([0]),
                            np.array([100, 100, 200, 200, 200]), np.array([1, 2, 0, 1, 2]),
                            np.array([True, True, False, False, True]), start=0, end=300)


def test_best_values_equal_brute_force() -> None:
    jobs = [BoundJob(A, 1, 3), BoundJob(B, 1, 2), BoundJob(Curve.of([2, 4], [5.0, 30.0]), 2, 4)]
    f = best_values(jobs, 9)
    for n in range(10):
        ks = [range(0, 4), range(0, 3), [0, 2, 3, 4]]
        want = max(sum(j.curve.at(k) for j, k in zip(jobs, combo))
                   for combo in itertools.product(*ks) if sum(combo) <= n)
        assert f[n] == pytest.approx(want)
    assert f[3] == pytest.approx(26.0)  # A1 + B2


def test_ub_oracle_on_a_hand_checkable_trace() -> None:
    b = compute_bounds(_trace(), [BoundJob(A, 1, 3), BoundJob(B, 1, 2)])
    # F(1) = 10, F(3) = max(A3 18, A1+B2 26, A2+B1 23) = 26.
    assert b.ub_oracle == pytest.approx(100 * 10 + 100 * 26 + 100 * 10)
    assert b.idle_node_seconds == pytest.approx(100 * 1 + 100 * 3 + 100 * 1)
    # UB_lin: best per-node rates A 10, B 8 → F_lin(1) = 10, F_lin(3) = 10·3.
    assert b.ub_lin == pytest.approx(100 * 10 + 100 * 30 + 100 * 10)
    assert b.ub_lin >= b.ub_oracle
    assert list(linear_values([BoundJob(A, 1, 3)], 5)) == [0, 10, 20, 30, 30, 30]


def _problem(nodes: int, current: tuple[int, ...] = (0, 0, 0)) -> Problem:
    curves = [A, B, Curve.of([1, 4], [1.0, 4.0])]
    jobs = tuple(Job(f"j{i}", m, 1, c, 20.0, 10.0, cur) for i, (c, m, cur) in
                 enumerate(zip(curves, (3, 2, 4), current)))
    return Problem(nodes, jobs)


def test_equal_share_gives_floor_then_fcfs_leftovers() -> None:
    s = equal_share(_problem(7))
    assert dict(s.counts) == {"j0": 3, "j1": 2, "j2": 2}
    assert dict(equal_share(_problem(2)).counts) == {"j0": 2, "j1": 0, "j2": 0}
    assert s.solver == "equal"


def test_greedy_takes_the_largest_marginal_gain() -> None:
    s = greedy(_problem(4))
    # gains: A 10,5,3  B 8,8  C 1,1,1,1  → A1, B1, B2, A2.
    assert dict(s.counts) == {"j0": 2, "j1": 2, "j2": 0}
    assert s.objective == pytest.approx(120 * (15 + 16))


def test_rigid_runs_jobs_at_their_maximum_fcfs() -> None:
    assert dict(rigid(_problem(6)).counts) == {"j0": 3, "j1": 2, "j2": 0}
    # j1 runs at full size and keeps its nodes; j0 (first) does not fit in what is left.
    assert dict(rigid(_problem(4, (0, 2, 0))).counts) == {"j0": 0, "j1": 2, "j2": 0}


@pytest.mark.parametrize("policy", [equal_share, greedy, rigid])
@pytest.mark.parametrize("nodes", [0, 1, 3, 5, 9, 20])
def test_baselines_respect_bounds_and_capacity(policy, nodes: int) -> None:
    problem = _problem(nodes)
    counts = policy(problem).counts
    assert sum(counts.values()) <= nodes
    for j in problem.jobs:
        assert counts[j.id] == 0 or j.min_nodes <= counts[j.id] <= j.max_nodes


def test_policy_names_and_user_curves() -> None:
    assert parse_policies("malletrain, oracle,malletrain") == ["malletrain", "oracle"]
    assert "rigid" in parse_policies("all")
    with pytest.raises(ConfigError, match="unknown policy fast"):
        parse_policies("malletrain,fast")
    lin = linear_curve(A, 3)
    assert [lin.at(k) for k in (1, 2, 3)] == [10.0, 20.0, 30.0]
    jobs = [SimJob("x", "a", A, 1, 3, 1, 1, None, 0), SimJob("y", "b", B, 1, 2, 1, 1, None, 0)]
    got = mismatched_curves(jobs, {"a": A, "b": B}, seed=1)
    assert got[0].at(1) == pytest.approx(10.0) and got[0].at(2) == pytest.approx(20.0)
    assert got[1].at(2) == pytest.approx(12.0)


def test_workloads_saturated_and_with_arrivals() -> None:
    sat = make_workload("imagenet", 20, seed=1, start=5.0)
    assert len({j.id for j in sat}) == 20
    assert all(j.work is None and j.submit_time == 5.0 for j in sat)
    assert [j.id for j in make_workload("imagenet", 20, seed=1)] == [
        j.id for j in make_workload("imagenet", 20, seed=1)]
    assert {j.id for j in make_workload("imagenet", 20, seed=2)} != {j.id for j in sat}
    arr = make_workload("imagenet", 5, arrivals=True, seed=1, start=0.0, end=100.0)
    times = [j.submit_time for j in arr]
    assert times[0] == 0.0 and times == sorted(times)  # shifted to the trace, in order
    assert all(t % 36.0 == 0.0 for t in times) and times[-1] > 4 * 36.0  # drawn, not the first
    assert all(j.work == 1.3e8 and 17 <= j.scale_up_s <= 19 for j in arr)
    assert [j.id for j in arr] == [j.id for j in make_workload(
        "imagenet", 5, arrivals=True, seed=1, start=0.0, end=100.0)]
    assert {j.id for j in arr} != {j.id for j in make_workload(
        "imagenet", 5, arrivals=True, seed=2, start=0.0, end=100.0)}
    hpo = make_workload("hpo", 3)
    assert {j.model for j in hpo} == {"shufflenet"}
    with pytest.raises(ConfigError, match="only 1001"):
        make_workload("imagenet", 5000)


@pytest.mark.parametrize("policy", [equal_share, greedy, rigid])
def test_baseline_objective_is_the_freetrain_objective(policy) -> None:
    from malletrain_core.allocator.objective import evaluate

    for nodes, current in ((5, (0, 0, 0)), (7, (2, 1, 3)), (3, (3, 0, 0))):
        problem = _problem(nodes, current)
        solution = policy(problem)
        assert solution.objective == pytest.approx(evaluate(problem, dict(solution.counts)))
