"""The default allocation policy: the allocator's ``solve`` with the configured solver."""

from __future__ import annotations

import functools
import importlib
import time

from ..allocator import dp
from ..errors import ConfigError
from ..model import Problem, Solution
from .config import Policy


def _dp_policy(problem: Problem) -> Solution:
    """The exact count DP (used where the allocator package offers no ``solve``)."""
    start = time.perf_counter()
    counts, value = dp.solve(problem)
    return Solution(counts, value, "dp", (time.perf_counter() - start) * 1000.0)


def default_policy(solver: str = "auto") -> Policy:
    """``malletrain_core.allocator.solve(problem, solver=solver)``, else the plain DP."""
    try:
        allocator = importlib.import_module("..allocator", __package__)
    except ImportError:
        allocator = None
    solve = getattr(allocator, "solve", None)
    if solve is None:
        return _dp_policy
    solvers = getattr(allocator, "SOLVERS", None)
    if solvers is not None and solver not in solvers:
        raise ConfigError(f"engine: solver = {solver!r}: choose one of {', '.join(solvers)}")
    return functools.partial(solve, solver=solver)
