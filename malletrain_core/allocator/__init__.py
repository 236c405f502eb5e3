"""The allocator: which job gets how many of the idle nodes, then which nodes.

:func:`solve` maximises FreeTrain's objective (throughput over a look-ahead minus rescale
losses) exactly on node counts, and :func:`place` maps counts onto node names by the keep
rule. Solvers:

* ``dp`` — the exact dynamic program, milliseconds at Summit scale; no side constraints;
* ``milp`` — the exact count MILP in HiGHS, for per-user caps, fairness floors and a cap on
  running jobs;
* ``pernode`` — FreeTrain's per-node MILP, a slow reference for tests and benchmarks;
* ``auto`` — ``dp``, or ``milp`` when the problem has side constraints.

:data:`POLICIES` is the one registry of allocation policies (``Problem -> Solution``): the
solvers above and the baselines of :mod:`.baselines`. The daemon (``allocator.solver``), the
engine, ``malletrain allocate --solver`` and the simulator's run policies all read it; a new
policy is one module and one line in it (docs/extending.md).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable

from ..errors import ValidationError
from ..model import Problem, Solution
from . import baselines, dp, fifo, milp, pernode
from .placement import place

SOLVERS = ("auto", "dp", "milp", "pernode")
"""The exact solvers of FreeTrain's objective (see :func:`solve`)."""

__all__ = ["POLICIES", "SOLVERS", "place", "policy", "solve"]


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


POLICIES: dict[str, Callable[[Problem], Solution]] = {
    **{name: functools.partial(solve, solver=name) for name in SOLVERS},
    "equal": baselines.equal_share,
    "greedy": baselines.greedy,
    "rigid": baselines.rigid,
    "fifo": fifo.fifo,
}
"""Every allocation policy by name."""


def policy(name: str) -> Callable[[Problem], Solution]:
    """The registered policy ``name``; a one-line error naming the choices otherwise."""
    try:
        return POLICIES[name]
    except KeyError:
        raise ValidationError("allocator", "policy", f"{name!r} is unknown; choose one of "
                              f"{', '.join(POLICIES)}") from None
