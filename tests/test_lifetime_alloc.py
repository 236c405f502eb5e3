"""The lifetime-aware count solver: exact for its objective, FreeTrain's when every node lives
the look-ahead, and the policies run end to end in the simulator."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from malletrain_core.allocator import dp
from malletrain_core.allocator import lifetime as lt
from malletrain_core.allocator.objective import evaluate as fixed_value
from malletrain_core.errors import ValidationError
from malletrain_core.model import Constraints, Curve, Job, Objective, Problem
from malletrain_core.sim.bounds import BoundJob, compute_bounds
from malletrain_core.sim.perfmodel import PerfParams
from malletrain_core.sim.replay import replay
from malletrain_core.sim.sources import synthetic
from malletrain_core.sim.workloads import SimJob

RISK = {0.0: 1.0, 15.0: 1.0, 40.0: 0.5, 80.0: 0.25, 120.0: 0.0}
"""A node's risk as a function of its life, so that nodes of equal life share their risk."""


def reference_value(job: Job, lives: list[tuple[float, float]], objective: Objective) -> float:
    """v_j(k) straight from the definition for the k nodes given (sorting, groups)."""
    assert job.curve is not None
    k = len(lives)
    o = job.curve.table(max(k, job.current_nodes, 1))
    if objective is Objective.SPEEDUP:
        o = o / job.curve.at(1)
    ordered = sorted(lives, key=lambda x: -x[0])
    value = sum(life * (o[i + 1] - o[i]) for i, (life, _) in enumerate(ordered))
    risk_of = {}
    for life, risk in lives:
        risk_of.setdefault(life, risk)
    survive = float(np.prod([1.0 - q for q in risk_of.values()])) if lives else 1.0
    value -= job.scale_down_s * o[k] * (1.0 - survive)
    rate = o[job.current_nodes] if job.current_nodes >= job.min_nodes else 0.0
    if rate > 0 and k > job.current_nodes:
        value -= rate * job.scale_up_s
    if rate > 0 and k < job.current_nodes:
        value -= rate * job.scale_down_s
    return value


def brute_force(problem: Problem, held: dict[str, list], free: list) -> float:
    """The best total of the reference values over every count vector."""
    free_sorted = sorted(free, key=lambda x: -x[0])
    all_held = sorted([x for j in problem.jobs for x in held[j.id]], key=lambda x: x[0])
    pool = free_sorted + all_held
    # Nodes taken from shrinking jobs (after the free ones) count with at most the life, at
    # least the risk, of the node taken before them.
    for i in range(max(1, len(free_sorted)), len(pool)):
        pool[i] = (min(pool[i][0], pool[i - 1][0]), max(pool[i][1], pool[i - 1][1]))
    choices = []
    for job in problem.jobs:
        mine = sorted(held[job.id], key=lambda x: -x[0])
        options = []
        for k in range(0, min(job.max_nodes, problem.nodes) + 1):
            if 0 < k < job.min_nodes:
                continue
            lives = mine[:k] if k <= job.current_nodes else \
                mine + pool[:k - job.current_nodes]
            options.append((k, reference_value(job, lives, problem.objective)))
        choices.append(options)
    best = -np.inf
    for combo in itertools.product(*choices):
        if sum(k for k, _ in combo) <= problem.nodes:
            best = max(best, sum(v for _, v in combo))
    return best


def random_instance(rng: np.random.Generator, objective: Objective = Objective.THROUGHPUT):
    lives = list(RISK)
    n_jobs = int(rng.integers(1, 4))
    jobs, held = [], {}
    for i in range(n_jobs):
        pts = sorted(rng.choice(np.arange(1, 7), size=int(rng.integers(1, 4)), replace=False))
        thr = np.cumsum(rng.uniform(1.0, 10.0, len(pts)))
        cur = int(rng.integers(0, 3))
        lo = int(rng.integers(1, 3))
        hi = int(rng.integers(max(lo, cur, 1), 6))
        if 0 < cur < lo:
            cur = lo
        jobs.append(Job(f"j{i}", hi, lo, Curve.of(pts, thr), float(rng.uniform(0, 30)),
                        float(rng.uniform(0, 20)), cur))
        held[f"j{i}"] = [(x, RISK[x]) for x in rng.choice(lives, cur)]
    free = [(float(x), RISK[float(x)]) for x in rng.choice(lives, int(rng.integers(0, 5)))]
    nodes = len(free) + sum(j.current_nodes for j in jobs)
    return Problem(nodes, tuple(jobs), 120.0, objective), held, free


@pytest.mark.parametrize("objective", list(Objective))
def test_the_solver_is_exact_against_brute_force(objective: Objective) -> None:
    rng = np.random.default_rng(11)
    for _ in range(120):
        problem, held, free = random_instance(rng, objective)
        solution = lt.solve(problem, held, free, rounds=0)  # the DP alone
        best = brute_force(problem, held, free)
        assert solution.objective == pytest.approx(best, rel=1e-9, abs=1e-9)
        assert lt.evaluate(problem, held, free, solution.counts) == \
            pytest.approx(solution.objective, rel=1e-9, abs=1e-9)


@pytest.mark.parametrize("seed", range(40))
def test_every_node_living_the_lookahead_is_freetrain(seed: int) -> None:
    rng = np.random.default_rng([seed, 5])
    problem, held, free = random_instance(rng, list(Objective)[seed % 2])
    la = float(rng.choice([10.0, 120.0, 600.0]))
    problem = Problem(problem.nodes, problem.jobs, la, problem.objective)
    held = {j: [(la, 0.0)] * len(v) for j, v in held.items()}
    free = [(la, 0.0)] * len(free)
    solution = lt.solve(problem, held, free)
    _, best = dp.solve(problem)
    assert solution.objective == pytest.approx(best, rel=1e-9, abs=1e-6)
    assert fixed_value(problem, solution.counts) == pytest.approx(best, rel=1e-9, abs=1e-6)
    for job, table in zip(problem.jobs, lt.value_tables(problem, held, free)):
        fixed = [fixed_value(Problem(problem.nodes, (job,), la, problem.objective), {job.id: k})
                 if np.isfinite(table[k]) else -np.inf for k in range(len(table))]
        assert table == pytest.approx(fixed)


def test_an_expensive_job_does_not_grow_onto_nodes_about_to_be_reclaimed() -> None:
    curve = Curve.of([1, 64], [100.0, 6400.0])
    big = Job("big", 64, 1, curve, scale_up_s=18.0, scale_down_s=12.0, current_nodes=32)
    held = {"big": [(120.0, 0.0)] * 32}
    # 16 nodes for 20 s: 20 s · 1,600/s gained < 18 s · 3,200/s to scale up + a restart.
    short = lt.solve(Problem(48, (big,)), held, [(20.0, 1.0)] * 16)
    assert short.counts["big"] == 32
    long = lt.solve(Problem(48, (big,)), held, [(120.0, 0.0)] * 16)
    assert long.counts["big"] == 48
    # A job that is not running yet pays no rescale: short-lived nodes are still worth it.
    small = Job("small", 8, 1, curve, scale_up_s=18.0, scale_down_s=12.0)
    both = lt.solve(Problem(48, (big, small)), {**held, "small": []}, [(20.0, 1.0)] * 16)
    assert both.counts == {"big": 32, "small": 8}


def test_a_costly_job_grows_onto_long_lived_nodes_only() -> None:
    curve = Curve.of([1, 64], [100.0, 6400.0])
    big = Job("big", 64, 1, curve, 18.0, 12.0, current_nodes=32)
    little = Job("little", 64, 1, curve, 18.0, 12.0, current_nodes=2)
    held = {"big": [(120.0, 0.0)] * 32, "little": [(120.0, 0.0)] * 2}
    free = [(120.0, 0.0)] * 16 + [(15.0, 1.0)] * 16
    problem = Problem(66, (big, little))
    tables = lt.value_tables(problem, held, free)
    assert tables[0][48] > tables[0][32]  # big grows onto the 16 long-lived nodes …
    assert tables[0][64] < tables[0][48]  # … but not onto the short-lived ones too
    # Alone, little's table would take the long-lived nodes too; handed out, big gets them and
    # little would get the 15 s ones: 16 · 15 s · 100/s < its rescale and the restart.
    assert lt.solve(problem, held, free, rounds=0).counts == {"big": 48, "little": 18}
    assert lt.solve(problem, held, free).counts == {"big": 48, "little": 2}


def test_bad_inputs_are_refused_in_one_line() -> None:
    job = Job("a", 4, 1, Curve.of([1], [1.0]), current_nodes=1)
    with pytest.raises(ValidationError, match="one per node"):
        lt.solve(Problem(2, (job,)), {"a": []}, [(1.0, 0.0)])
    with pytest.raises(ValidationError, match="one life per node"):
        lt.solve(Problem(3, (job,)), {"a": [(1.0, 0.0)]}, [(1.0, 0.0)])
    constrained = Problem(2, (job,), constraints=Constraints(min_share=0.5))
    with pytest.raises(ValidationError, match="side constraints"):
        lt.solve(constrained, {"a": [(1.0, 0.0)]}, [(1.0, 0.0)])


def test_the_lifetime_policies_run_in_the_simulator() -> None:
    trace = synthetic(nodes=16, days=0.1, seed=4, idle_fraction=0.5,
                      fragments=np.array([60, 200, 400, 900, 1800, 3600]))
    curve = Curve.of([1, 2, 4, 8], [100.0, 190.0, 350.0, 600.0])
    jobs = [SimJob(f"j{i}", "fast", curve.scaled(1 + i / 4), 1, 8, 18.0, 12.0, None, 0.0)
            for i in range(3)]
    ub = compute_bounds(trace, [BoundJob(j.curve, 1, 8) for j in jobs]).ub_oracle
    shares = {}
    for policy in ("malletrain", "malletrain-lifetime", "malletrain-clairvoyant"):
        run = replay(trace, jobs, policy, seed=0, params=PerfParams(noise=0.0))
        assert run.invalid_actions == 0
        assert run.engine["solver_failures"] == 0
        assert 0.0 < run.net_samples <= ub
        shares[policy] = run.net_samples / ub
    assert shares["malletrain-clairvoyant"] > 0.3


def test_a_comparison_learns_on_the_first_days_and_replays_the_next() -> None:
    from malletrain_core.sim.compare import SimOptions, compare

    opts = SimOptions(trace="synthetic", synthetic_nodes=16, days=0.05, learn_days=0.1, jobs=3,
                      policies=("malletrain", "malletrain-lifetime", "oracle"))
    result = compare(opts)
    assert result.results["learn_days"] == 0.1
    # The replay starts at the last trace event of the learning days.
    assert 0.1 * 86400.0 - 3600.0 < result.trace.start <= 0.1 * 86400.0
    assert result.trace.span_s == pytest.approx(0.05 * 86400.0)
    shares = [result.results["policies"][p]["ub_oracle_share"]
              for p in ("malletrain", "malletrain-lifetime")]
    assert all(0 < s <= 1 for s in shares)


def test_two_growers_do_not_both_count_the_one_long_lived_node() -> None:
    # One node stays 120 s, the other is reclaimed in 5 s (a restart: 10 s of the rate). Each
    # table alone believes it gets the long-lived one; the DP gives both jobs a node; handed
    # out, the second job starts on the doomed node and loses.
    jobs = tuple(Job(name, 2, 1, Curve.of([1, 2], [10.0, 20.0]), 20.0, 10.0, 0)
                 for name in ("a", "b"))
    problem = Problem(2, jobs, 120.0, Objective.THROUGHPUT)
    free = [(120.0, 0.0), (5.0, 1.0)]
    naive = lt.solve(problem, {}, free, rounds=0)
    assert naive.counts == {"a": 1, "b": 1}
    assert lt.handed_out(problem, {}, free, naive.counts) == pytest.approx(1200 + 50 - 100)
    checked = lt.solve(problem, {}, free)
    assert sorted(checked.counts.values()) == [0, 2] or sorted(checked.counts.values()) == [0, 1]
    assert checked.objective == pytest.approx(lt.handed_out(problem, {}, free, checked.counts))
    assert checked.objective > lt.handed_out(problem, {}, free, naive.counts)


@pytest.mark.parametrize("seed", range(30))
def test_checked_counts_never_lose_to_staying_put(seed: int) -> None:
    rng = np.random.default_rng([seed, 9])
    problem, held, free = random_instance(rng, list(Objective)[seed % 2])
    solution = lt.solve(problem, held, free)
    stay = {j.id: j.current_nodes for j in problem.jobs}
    assert solution.objective == pytest.approx(lt.handed_out(problem, held, free,
                                                             solution.counts))
    assert solution.objective >= lt.handed_out(problem, held, free, stay) - 1e-9
    assert sum(solution.counts.values()) <= problem.nodes
