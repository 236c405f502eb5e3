"""The allocator: which job gets how many of the idle nodes, then which nodes.

:func:`solve` maximises FreeTrain's objective (throughput over a look-ahead minus rescale
losses) exactly on node counts, and :func:`place` maps counts onto node names by the keep
rule. Solvers:

* ``dp`` — the exact dynamic program, milliseconds at Summit scale; no side constraints;
* ``milp`` — the exact count MILP in HiGHS, for per-user caps, fairness floors and a cap on
  running jobs;
* ``pernode`` — FreeTrain's per-node MILP, a slow reference for tests and benchmarks;
* ``auto`` — ``dp``, or ``milp`` when the problem has side constraints.
"""

from __future__ import annotations

import time

from ..errors import ValidationError
from ..model import Problem, Solution
from . import dp, milp, pernode
from .placement import place

SOLVERS = ("auto", "dp", "milp", "pernode")

__all__ = ["SOLVERS", "place", "solve"]


def solve(problem: Problem, solver: str = "auto", time_limit_s: float | None = None) -> Solution:
    """Best node counts for ``problem``.

    ``time_limit_s`` bounds the HiGHS solvers; the count MILP raises
    :class:`~malletrain_core.errors.SolverError` when it runs out, the per-node MILP returns
    its incumbent with status ``"time_limit"`` and the remaining gap.
    """
    if solver not in SOLVERS:
        raise ValidationError("allocate", "solver", f"{solver!r} is unknown; choose one of "
                              f"{', '.join(SOLVERS)}")
    if time_limit_s is not None and not time_limit_s > 0:
        raise ValidationError("allocate", "time_limit_s", f"{time_limit_s!r} must be > 0 seconds")
    if solver == "auto":
        solver = "milp" if problem.constraints.active else "dp"
    if solver == "dp":
        if problem.constraints.active:
            raise ValidationError("allocate", "solver", "the DP cannot honour side constraints "
                                  "(user_max_nodes, min_share, max_running_jobs); use milp or auto")
        start = time.perf_counter()
        counts, value = dp.solve(problem)
        return Solution(counts, value, "dp", (time.perf_counter() - start) * 1e3)
    if solver == "milp":
        return milp.solve(problem, time_limit_s)
    return pernode.solve(problem, time_limit_s)
