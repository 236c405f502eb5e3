"""Property tests: the three solvers agree with each other and with brute force.

The brute force values a count vector from the curve points directly (its own arithmetic, not
the allocator's value tables) and enumerates every count vector, side constraints included.
"""

from __future__ import annotations

import itertools
import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from malletrain_core.allocator import milp, pernode, place, solve
from malletrain_core.allocator.objective import job_values
from malletrain_core.errors import InfeasibleError
from malletrain_core.model import Constraints, Curve, Job, Node, Objective, Problem

SETTINGS = settings(max_examples=40, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-7, abs_tol=1e-6)


@st.composite
def curves(draw: st.DrawFn, max_count: int) -> Curve:
    counts = draw(st.lists(st.integers(1, max_count), min_size=1, max_size=5, unique=True))
    rates = st.one_of(st.just(0.0), st.floats(1e-3, 1000.0))
    values = draw(st.lists(rates, min_size=len(counts), max_size=len(counts)))
    return Curve.of(counts, values)


@st.composite
def problems(draw: st.DrawFn, max_nodes: int, max_jobs: int,
             constrained: bool = False) -> Problem:
    nodes = draw(st.integers(0, max_nodes))
    free = nodes
    jobs = []
    for i in range(draw(st.integers(1, max_jobs))):
        lo = draw(st.integers(1, 3))
        hi = draw(st.integers(lo, max(lo, max_nodes + 1)))
        current = draw(st.integers(0, min(free, hi + 1)))
        free -= current
        jobs.append(Job(f"j{i}", hi, lo, draw(curves(max_nodes + 2)),
                        draw(st.floats(0.0, 40.0)), draw(st.floats(0.0, 40.0)), current,
                        owner=draw(st.sampled_from(["ann", "bob"]))))
    cons = Constraints()
    if constrained:
        cons = Constraints(
            user_max_nodes=draw(st.dictionaries(st.sampled_from(["ann", "bob"]),
                                                st.integers(0, max_nodes), max_size=2)),
            min_share=draw(st.sampled_from([0.0, 0.0, 0.5, 1.0])),
            max_running_jobs=draw(st.one_of(st.none(), st.integers(0, max_jobs))))
    return Problem(nodes, tuple(jobs), draw(st.sampled_from([0.0, 10.0, 120.0, 600.0])),
                   draw(st.sampled_from(list(Objective))), cons)


def value(problem: Problem, job: Job, k: int) -> float:
    """FreeTrain's objective for one job at k nodes, from first principles."""
    assert job.curve is not None
    scale = 1.0
    if problem.objective is Objective.SPEEDUP:
        one = job.curve.at(1)
        scale = 1.0 / one if one > 0 else 0.0
    rate = job.curve.at(job.current_nodes) * scale if job.current_nodes >= job.min_nodes else 0.0
    cost = job.scale_up_s if k > job.current_nodes else \
        job.scale_down_s if k < job.current_nodes else 0.0
    return problem.lookahead_s * job.curve.at(k) * scale - rate * cost


def feasible(problem: Problem, ks: tuple[int, ...]) -> bool:
    if sum(ks) > problem.nodes:
        return False
    cons = problem.constraints
    floors = milp.fairness_floor(problem)
    for job, k in zip(problem.jobs, ks):
        if k < floors[job.id]:
            return False
    for user, cap in cons.user_max_nodes.items():
        if sum(k for job, k in zip(problem.jobs, ks) if job.owner == user) > cap:
            return False
    running = sum(1 for k in ks if k > 0)
    return cons.max_running_jobs is None or running <= cons.max_running_jobs


def brute_force(problem: Problem) -> float | None:
    """Best objective over every feasible count vector; ``None`` when there is none."""
    ranges = [[0] + list(range(j.min_nodes, min(j.max_nodes, problem.nodes) + 1))
              for j in problem.jobs]
    best = None
    for ks in itertools.product(*ranges):
        if feasible(problem, ks):
            total = sum(value(problem, j, k) for j, k in zip(problem.jobs, ks))
            best = total if best is None else max(best, total)
    return best


def check_counts(problem: Problem, counts: dict[str, int], objective: float) -> None:
    ks = tuple(counts[j.id] for j in problem.jobs)
    assert all(k == 0 or j.min_nodes <= k <= j.max_nodes for j, k in zip(problem.jobs, ks))
    assert feasible(problem, ks)
    assert close(sum(value(problem, j, k) for j, k in zip(problem.jobs, ks)), objective)


@SETTINGS
@given(problems(max_nodes=6, max_jobs=3))
def test_all_solvers_equal_brute_force(problem: Problem) -> None:
    best = brute_force(problem)
    assert best is not None  # all jobs at 0 is always feasible here
    for solver in ("dp", "milp", "pernode"):
        sol = solve(problem, solver)
        assert sol.status == "optimal"
        assert close(sol.objective, best), (solver, sol, best)
        check_counts(problem, dict(sol.counts), sol.objective)


@SETTINGS
@given(problems(max_nodes=6, max_jobs=3, constrained=True))
def test_side_constraints_match_constrained_brute_force(problem: Problem) -> None:
    best = brute_force(problem)
    for solver in ("milp", "pernode"):
        if best is None:
            try:
                solve(problem, solver)
            except InfeasibleError:
                continue
            raise AssertionError(f"{solver} found an allocation where none exists")
        sol = solve(problem, solver)
        assert close(sol.objective, best), (solver, sol, best)
        check_counts(problem, dict(sol.counts), sol.objective)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems(max_nodes=40, max_jobs=8))
def test_dp_and_count_milp_agree_on_larger_instances(problem: Problem) -> None:
    dp_sol, milp_sol = solve(problem, "dp"), solve(problem, "milp")
    assert close(dp_sol.objective, milp_sol.objective)
    check_counts(problem, dict(milp_sol.counts), milp_sol.objective)
    check_counts(problem, dict(dp_sol.counts), dp_sol.objective)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems(max_nodes=14, max_jobs=4))
def test_per_node_milp_reaches_the_dp_optimum(problem: Problem) -> None:
    sol = solve(problem, "pernode", time_limit_s=60)
    assert sol.status == "optimal"
    assert close(sol.objective, solve(problem, "dp").objective)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems(max_nodes=12, max_jobs=4))
def test_per_node_solution_never_migrates(problem: Problem) -> None:
    model = pernode.build(problem)
    model.highs.setOptionValue("mip_rel_gap", 0.0)
    model.highs.run()
    used: set[int] = set()
    for job, before, after in zip(problem.jobs, pernode.current_blocks(problem),
                                  model.assignment(problem)):
        assert after <= before or before <= after
        assert len(after) == 0 or job.min_nodes <= len(after) <= job.max_nodes
        assert not used & after
        used |= after
    assert used <= set(range(problem.nodes))


@SETTINGS
@given(problems(max_nodes=10, max_jobs=3))
def test_idle_job_starts_for_free(problem: Problem) -> None:
    for job in problem.jobs:
        if job.current_nodes == 0:
            table = job_values(job, problem.nodes, problem.lookahead_s, problem.objective)
            for k in range(len(table)):
                if k == 0 or k >= job.min_nodes:
                    assert close(table[k], value(problem, job, k))
                    assert table[k] >= 0.0


@SETTINGS
@given(problems(max_nodes=30, max_jobs=5), st.data())
def test_placement_keeps_bounds_capacity_and_no_migration(problem: Problem,
                                                          data: st.DataObject) -> None:
    counts = dict(solve(problem).counts)
    names = [f"n{i:02d}" for i in range(problem.nodes)]
    current: dict[str, list[str]] = {}
    first = 0
    for job in problem.jobs:
        current[job.id] = names[first:first + job.current_nodes]
        first += job.current_nodes
    lives = data.draw(st.lists(st.one_of(st.none(), st.floats(0, 1e4)),
                               min_size=len(names), max_size=len(names)))
    groups = data.draw(st.lists(st.sampled_from([None, "g0", "g1"]),
                                min_size=len(names), max_size=len(names)))
    nodes = {n: Node(n, g, life) for n, g, life in zip(names, groups, lives)}
    free = [nodes[n] for n in names[first:]]
    result = place(counts, current, free, nodes)
    seen: set[str] = set()
    for job in problem.jobs:
        got = set(result.get(job.id, ()))
        assert len(got) == counts[job.id]
        before = set(current[job.id])
        assert got <= before or before <= got
        assert not got & seen
        seen |= got
    assert seen <= set(names)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems(max_nodes=40, max_jobs=8, constrained=True))
def test_constrained_milp_is_feasible_and_bounded_by_the_dp(problem: Problem) -> None:
    free = Problem(problem.nodes, problem.jobs, problem.lookahead_s, problem.objective)
    relaxed = solve(free, "dp")
    try:
        sol = solve(problem, "milp")
    except InfeasibleError:
        return
    check_counts(problem, dict(sol.counts), sol.objective)
    assert sol.objective <= relaxed.objective + 1e-6 * max(1.0, abs(relaxed.objective))
    if feasible(problem, tuple(relaxed.counts[j.id] for j in problem.jobs)):
        assert close(sol.objective, relaxed.objective)
