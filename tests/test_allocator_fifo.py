"""The ``fifo`` allocation policy: submission order, each job up to its maximum."""

from __future__ import annotations

from malletrain_core.allocator import POLICIES
from malletrain_core.model import Curve, Job, Problem

LINEAR = Curve.of([1, 8], [10.0, 80.0])


def test_fifo_fills_jobs_in_submission_order() -> None:
    jobs = (Job("a", max_nodes=3, curve=LINEAR), Job("b", max_nodes=4, min_nodes=3, curve=LINEAR),
            Job("c", max_nodes=2, curve=LINEAR))
    solution = POLICIES["fifo"](Problem(nodes=5, jobs=jobs))
    assert dict(solution.counts) == {"a": 3, "b": 0, "c": 2}  # b's minimum no longer fits
    assert solution.solver == "fifo" and solution.objective > 0
