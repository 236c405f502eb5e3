"""The DP's exact savings: stages equal, bit for bit, to the plain max-plus recursion; value
tables reused only for the same Job object."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from malletrain_core.allocator import dp, dpbounds
from malletrain_core.allocator.objective import job_values
from malletrain_core.model import Curve, Job, Objective, Problem


def plain_stages(tables: list[np.ndarray], capacity: int) -> list[np.ndarray]:
    """V_j(m) = max_{k ≤ min(m, K_j)} V_{j−1}(m − k) + v_j(k), element by element."""
    cap = min(capacity, sum(len(t) - 1 for t in tables))
    stages = [np.zeros(cap + 1)]
    for table in tables:
        prev = stages[-1]
        new = np.full(cap + 1, -np.inf)
        for m in range(cap + 1):
            for k in range(min(m, len(table) - 1) + 1):
                new[m] = max(new[m], prev[m - k] + table[k])
        stages.append(new)
    return stages


finite = st.floats(-1e6, 1e6, allow_nan=False)


@st.composite
def tables(draw: st.DrawFn) -> np.ndarray:
    """Value tables as the engine makes them: rising, flat tails, peaks, −inf below a minimum."""
    size = draw(st.integers(0, 12))
    values = np.array(draw(st.lists(finite, min_size=size + 1, max_size=size + 1)))
    shape = draw(st.sampled_from(["any", "rising", "flat-tail", "rounded"]))
    if shape == "rising":
        values = np.cumsum(np.abs(values))
    elif shape == "flat-tail" and size > 1:
        values[size // 2:] = values[size // 2]
    elif shape == "rounded":
        values = np.round(values / 1e5)
    low = draw(st.integers(1, max(1, size)))
    if size > 1 and draw(st.booleans()):
        values[1:low] = -np.inf
    return values


@settings(max_examples=150, deadline=None)
@given(st.lists(tables(), max_size=6), st.integers(0, 40))
def test_stages_equal_the_plain_recursion_bit_for_bit(ts: list[np.ndarray], cap: int) -> None:
    got = dp.forward(ts, cap)
    want = plain_stages(ts, cap)
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert a.shape == b.shape and np.array_equal(a, b)


def test_a_flat_tail_is_not_searched_but_still_solved() -> None:
    flat = np.array([0.0, 5.0, 9.0, 9.0, 9.0, 9.0])
    assert dp.useful_top(flat) == 2
    assert dp.useful_top(np.array([0.0, -np.inf, -np.inf])) == 0
    counts, value = dp.solve_counts([flat, np.array([0.0, 4.0, 4.5])], 5)
    assert (counts, value) == ([2, 2], 13.5)


def test_value_tables_are_reused_only_for_the_same_job() -> None:
    curve = Curve.of([1, 8], [10.0, 60.0])
    job = Job("a", 8, curve=curve, scale_up_s=18.0, scale_down_s=12.0, current_nodes=3)
    first = dp.cached_values(job, 16, 120.0, Objective.THROUGHPUT)
    assert dp.cached_values(job, 16, 120.0, Objective.THROUGHPUT) is first
    small = dp.cached_values(job, 5, 120.0, Objective.THROUGHPUT)
    assert np.array_equal(small, job_values(job, 5, 120.0, Objective.THROUGHPUT))
    assert not first.flags.writeable  # shared between calls: nobody may change it
    twin = Job("a", 8, curve=curve, scale_up_s=18.0, scale_down_s=12.0, current_nodes=4)
    assert np.array_equal(dp.cached_values(twin, 16, 120.0, Objective.THROUGHPUT),
                          job_values(twin, 16, 120.0, Objective.THROUGHPUT))
    other = dp.cached_values(job, 16, 60.0, Objective.THROUGHPUT)
    assert np.array_equal(other, job_values(job, 16, 60.0, Objective.THROUGHPUT))


@pytest.mark.parametrize("nodes", [0, 3, 40])
def test_solve_matches_the_plain_recursion(nodes: int) -> None:
    rng = np.random.default_rng(nodes)
    jobs = tuple(Job(f"j{i}", int(rng.integers(1, 9)), curve=Curve.of(
        [1, 4, 8], sorted(rng.uniform(1.0, 50.0, 3))), scale_up_s=18.0, scale_down_s=12.0,
        current_nodes=int(rng.integers(0, 3)) if nodes >= 12 else 0) for i in range(6))
    problem = Problem(nodes, jobs, 120.0)
    counts, value = dp.solve(problem)
    ts = [job_values(j, nodes, 120.0, Objective.THROUGHPUT) for j in jobs]
    assert value == plain_stages(ts, nodes)[-1].max()
    assert sum(counts.values()) <= nodes
    assert value == sum(t[counts[j.id]] for t, j in zip(ts, jobs))



def plain_solve(tables: list[np.ndarray], capacity: int) -> tuple[list[int], float]:
    """The first m reaching the maximum, then at each stage the smallest best count."""
    stages = plain_stages(tables, capacity)
    m = int(np.argmax(stages[-1]))
    value = float(stages[-1][m])
    counts = [0] * len(tables)
    for j in range(len(tables) - 1, -1, -1):
        sums = [stages[j][m - k] + tables[j][k] for k in range(min(m, len(tables[j]) - 1) + 1)]
        counts[j] = int(np.argmax(sums))
        m -= counts[j]
    return counts, value


@settings(max_examples=150, deadline=None)
@given(st.lists(tables(), min_size=1, max_size=6), st.integers(0, 40), st.integers(0, 2))
def test_solve_counts_equals_the_plain_dp_whatever_the_window(
        ts: list[np.ndarray], cap: int, tail: int) -> None:
    # TAIL_STAGES = 0 makes the first pass a single column, so the full pass runs whenever the
    # optimum leaves nodes unused: both paths are checked against the plain recursion.
    old, dp.TAIL_STAGES = dp.TAIL_STAGES, tail
    try:
        want = plain_solve(ts, cap)
        if want[1] == -np.inf:
            return
        assert dp.solve_counts(ts, cap) == want
    finally:
        dp.TAIL_STAGES = old


@settings(max_examples=300, deadline=None)
@given(st.lists(tables(), min_size=1, max_size=7), st.integers(0, 40))
def test_the_bounded_dp_is_the_plain_dp_or_declines(ts: list[np.ndarray], cap: int) -> None:
    """Cells left out by the prices' bounds never change the answer, ties included (the
    "rounded" tables tie often)."""
    want = plain_solve(ts, cap)
    if want[1] == -np.inf:
        return
    for size in (cap, cap // 2, cap):  # the prices move between solves
        small = min(size, sum(len(t) - 1 for t in ts))
        got = dp._solve_within(ts, small, [min(dp.useful_top(t), small) for t in ts])
        assert got is None or got == plain_solve(ts, size)


def test_the_bounds_leave_most_cells_out_of_a_busy_problem() -> None:
    """Forty concave-ish jobs competing for 300 nodes: the DP computes a narrow band of each
    stage and still finds the plain DP's answer."""
    rng = np.random.default_rng(7)
    ts = []
    for i in range(40):
        rate = rng.uniform(50.0, 150.0) * np.arange(33) ** rng.uniform(0.6, 0.95)
        table = 120.0 * rate - np.where(np.arange(33) != i % 5, rng.uniform(0, 800.0), 0.0)
        table[1:1 + i % 3] = -np.inf
        ts.append(table)
    tops = [dp.useful_top(t) for t in ts]
    dpbounds._centre[0] = 1.0  # the prices a fresh process starts from (the last solve moves them)
    bounds = dp.Bounds(ts, 300, tops)
    cols = bounds.windows(bounds.lower)
    assert bounds.ok and cols is not None
    assert sum(hi - lo + 1 for lo, hi in zip(*cols)) < 0.3 * 301 * len(cols[0])
    assert bounds.lower <= plain_solve(ts, 300)[1] <= bounds.upper
    assert dp._solve_within(ts, 300, tops) == plain_solve(ts, 300)


def test_the_table_cache_holds_the_live_jobs_not_every_job_object_ever_seen() -> None:
    """A long-running engine builds a new Job object whenever a job's view changes: the cache
    keeps one table per job id, and the tables of jobs absent from the problems being solved
    (ended) are dropped past a bound, so it does not grow with the daemon's age."""
    curve = Curve((1, 2, 4, 8), (1.0, 1.9, 3.5, 6.0))
    dp._tables.clear()
    for step in range(500):  # the same ten jobs, a fresh Job object for each every time
        jobs = tuple(Job(f"j{i}", max_nodes=8, curve=curve, current_nodes=step % 3)
                     for i in range(10))
        dp.solve(Problem(32, jobs))
    assert len(dp._tables) == 10
    for step in range(2000):  # jobs come and go: at most 20 live at a time
        jobs = tuple(Job(f"k{step + i}", max_nodes=8, curve=curve) for i in range(20))
        dp.solve(Problem(32, jobs))
        assert len(dp._tables) <= len(jobs) + dp._STALE_LIMIT + 1
    dp._tables.clear()
