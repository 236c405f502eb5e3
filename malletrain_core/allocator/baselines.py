"""Baseline allocation policies to compare the exact allocator with.

Each is a function ``Problem -> Solution`` and can be given to the Engine as its policy. None
looks at rescale costs or the look-ahead; side constraints are ignored.

* :func:`equal_share` — the MalleTrain prototype's heuristic: ⌊N/J⌋ nodes each (within the
  job's bounds), the leftover nodes to jobs in submission order up to their maximum;
* :func:`greedy` — one node at a time to the job whose objective gains most from it;
* :func:`rigid` — first come, first served, every job at exactly its maximum: running jobs
  keep their nodes, waiting ones start in submission order while the next one fits.
"""

from __future__ import annotations

import heapq
import time

import numpy as np

from ..model import Job, Problem, Solution, objective_curve


def _solution(problem: Problem, counts: dict[str, int], solver: str, t0: float) -> Solution:
    """Wrap ``counts`` with their FreeTrain objective (look-ahead gain minus rescale losses)."""
    value = 0.0
    for job in problem.jobs:
        assert job.curve is not None
        k = counts[job.id]
        value += problem.lookahead_s * objective_curve(job.curve, problem.objective).at(k)
        rate = job.rate(problem.objective)
        if rate > 0 and k != job.current_nodes:
            value -= rate * (job.scale_up_s if k > job.current_nodes else job.scale_down_s)
    return Solution(counts=counts, objective=value, solver=solver,
                    solve_ms=(time.perf_counter() - t0) * 1e3)


def _cap(job: Job, capacity: int) -> int:
    return min(job.max_nodes, capacity)


def equal_share(problem: Problem) -> Solution:
    """⌊N/J⌋ nodes per job (0 where that is below its minimum), leftovers FCFS."""
    t0 = time.perf_counter()
    jobs = problem.jobs
    counts = {j.id: 0 for j in jobs}
    if jobs:
        share = problem.nodes // len(jobs)
        for j in jobs:
            k = min(share, j.max_nodes)
            counts[j.id] = k if k >= j.min_nodes else 0
        left = problem.nodes - sum(counts.values())
        for j in jobs:
            if left <= 0:
                break
            k = counts[j.id]
            extra = min(j.max_nodes - k, left)
            if k == 0 and extra < j.min_nodes:
                continue
            counts[j.id] = k + extra
            left -= extra
    return _solution(problem, counts, "equal", t0)


def greedy(problem: Problem) -> Solution:
    """Greedy marginal gain: repeatedly give the next node (or a job's first ``min_nodes``,
    valued per node) to the job that gains the most objective per node."""
    t0 = time.perf_counter()
    counts = {j.id: 0 for j in problem.jobs}
    tables: dict[str, np.ndarray] = {}
    heap: list[tuple[float, int, str, int]] = []
    for order, j in enumerate(problem.jobs):
        assert j.curve is not None
        table = objective_curve(j.curve, problem.objective).table(_cap(j, problem.nodes))
        tables[j.id] = table
        if j.min_nodes < len(table):
            gain = table[j.min_nodes] / j.min_nodes
            heapq.heappush(heap, (-gain, order, j.id, j.min_nodes))
    left = problem.nodes
    while heap and left > 0:
        neg_gain, order, jid, step = heapq.heappop(heap)
        if -neg_gain <= 0:
            break
        if step > left:
            continue
        counts[jid] += step
        left -= step
        k, table = counts[jid], tables[jid]
        if k + 1 < len(table):
            heapq.heappush(heap, (-(table[k + 1] - table[k]), order, jid, 1))
    return _solution(problem, counts, "greedy", t0)


def rigid(problem: Problem) -> Solution:
    """FCFS rigid jobs at their maximum: running full-size jobs keep their nodes, a job that
    lost nodes stops, waiting jobs start in order while the first of them fits."""
    t0 = time.perf_counter()
    counts = {j.id: 0 for j in problem.jobs}
    left = problem.nodes
    for j in problem.jobs:
        if j.current_nodes >= j.max_nodes and left >= j.max_nodes:
            counts[j.id] = j.max_nodes
            left -= j.max_nodes
    for j in problem.jobs:
        if counts[j.id]:
            continue
        if j.max_nodes > left:
            break
        counts[j.id] = j.max_nodes
        left -= j.max_nodes
    return _solution(problem, counts, "rigid", t0)


__all__ = ["equal_share", "greedy", "rigid"]
