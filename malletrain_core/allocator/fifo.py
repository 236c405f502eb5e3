"""``fifo``: elastic first come, first served — the worked example of docs/extending.md.

Jobs in submission order each take as many of the idle nodes as they can use (up to their
maximum) while at least their minimum is left; a job whose minimum no longer fits waits, and
later, smaller jobs may still start. Rescale costs and the look-ahead are not looked at.
"""

from __future__ import annotations

import time

from ..model import Problem, Solution
from .objective import evaluate


def fifo(problem: Problem) -> Solution:
    """Node counts in submission order, each job up to its maximum."""
    t0 = time.perf_counter()
    left = problem.nodes
    counts: dict[str, int] = {}
    for job in problem.jobs:
        k = min(job.max_nodes, left)
        counts[job.id] = k if k >= job.min_nodes else 0
        left -= counts[job.id]
    return Solution(counts, evaluate(problem, counts), "fifo", (time.perf_counter() - t0) * 1e3)
