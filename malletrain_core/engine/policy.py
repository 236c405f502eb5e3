"""The engine's allocation policy, by its registered name, and the check of its answers."""

from __future__ import annotations

from ..allocator import POLICIES, policy
from ..errors import ConfigError, SolverError, ValidationError
from ..model import Problem, Solution
from .config import Policy


def default_policy(solver: str = "auto") -> Policy:
    """The registered allocation policy ``solver`` (``malletrain_core.allocator.POLICIES``)."""
    try:
        return policy(solver)
    except ValidationError:
        raise ConfigError(f"engine: solver = {solver!r}: choose one of "
                          f"{', '.join(POLICIES)}") from None


def checked_counts(problem: Problem, solution: Solution) -> dict[str, int]:
    """The solution's count for every job, refused if a policy broke bounds or capacity."""
    counts = {j.id: int(solution.counts.get(j.id, 0)) for j in problem.jobs}
    for j in problem.jobs:
        k = counts[j.id]
        if k != 0 and not j.min_nodes <= k <= j.max_nodes:
            raise SolverError(f"the policy gave job {j.id!r} {k} nodes outside "
                              f"{j.min_nodes}..{j.max_nodes}; fix the policy")
    if sum(counts.values()) > problem.nodes:
        raise SolverError(f"the policy used {sum(counts.values())} nodes of {problem.nodes}; "
                          "fix the policy")
    return counts
