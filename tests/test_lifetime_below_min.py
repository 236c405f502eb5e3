"""The lifetime allocator never keeps a job at a node count below its minimum: a reclaim can
leave a job there, and "staying put" then is no solution (found by the journal churn test,
where the engine stopped with "the policy gave job '24' 2 nodes outside 3..3")."""

from __future__ import annotations

from malletrain_core.allocator.lifetime import solve
from malletrain_core.engine.policy import checked_counts
from malletrain_core.model import Curve, Job, Problem


def test_a_job_left_below_its_minimum_is_stopped_or_brought_back() -> None:
    curve = Curve.of([1, 2, 3], [10.0, 19.0, 27.0])
    below = Job("below", 3, 3, curve, 20.0, 12.0, 2)
    other = Job("other", 4, 1, curve, 20.0, 12.0, 1)
    for free in (0, 1, 3):
        problem = Problem(2 + 1 + free, (below, other), 120.0)
        lives = [(100.0, 0.0)] * free
        solution = solve(problem, {"below": [(100.0, 0.0)] * 2, "other": [(100.0, 0.0)]},
                         lives)
        counts = checked_counts(problem, solution)  # raised before the fix
        assert counts["below"] in (0, 3)
        assert sum(counts.values()) <= problem.nodes
