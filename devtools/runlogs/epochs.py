"""What every reader of the workers' step lines answers the same way, whatever the line format
(examples/train_elastic.py's, the integrations' ``malletrain:`` lines): the epochs seen, the
newest one's world size and ranks, the furthest step."""

from __future__ import annotations

from typing import Any


def latest_epoch(steps: dict[int, list[Any]]) -> tuple[int, int, set[int]] | None:
    """(epoch, world, ranks seen) of the newest epoch in ``steps`` (step lines, each with
    ``world`` and ``rank``, by epoch); None when there are none."""
    if not steps:
        return None
    epoch = max(steps)
    rows = steps[epoch]
    return epoch, max(r.world for r in rows), {r.rank for r in rows}


class EpochSteps:
    """A log whose ``steps`` map an epoch to its step rows (each with ``step``, ``world`` and
    ``rank``) and whose ``starts`` map an epoch to its start rows."""

    steps: dict[int, list[Any]]
    starts: dict[int, list[Any]]

    @property
    def epochs(self) -> list[int]:
        return sorted(set(self.steps) | set(self.starts))

    def latest(self) -> tuple[int, int, set[int]] | None:
        """(epoch, world, ranks that logged steps) of the newest epoch with step lines."""
        return latest_epoch(self.steps)

    def max_step(self) -> int:
        return max((r.step for rows in self.steps.values() for r in rows), default=0)
