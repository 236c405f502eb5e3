"""The one small interface every backend implements (Slurm, PBS, the simulator)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from ..events import Action, Event, IdleNode, NodesIdle, NodesReclaimed


class Backend(Protocol):
    """A batch system as the engine needs it.

    ``poll`` reconciles with the batch system (the truth) and returns what changed since the
    last poll as events; ``execute`` carries out the engine's actions and returns any events
    they caused at once (for example a grow that failed).
    """

    name: str

    def poll(self, now: float) -> list[Event]:
        ...

    def execute(self, actions: Sequence[Action], now: float) -> list[Event]:
        ...


@dataclass
class PollEvents:
    """What one poll found, gathered by kind and emitted in the order the engine relies on."""

    submitted: list[Event] = field(default_factory=list)
    reclaimed: list[str] = field(default_factory=list)
    stopped: list[Event] = field(default_factory=list)
    ended: list[Event] = field(default_factory=list)
    started: list[Event] = field(default_factory=list)

    def ordered(self, now: float, idle: Sequence[IdleNode]) -> list[Event]:
        """New jobs, then nodes taken back, workers stopped and jobs ended (so freed nodes are
        known before they are offered), then newly idle nodes, then confirmed starts."""
        events: list[Event] = list(self.submitted)
        if self.reclaimed:
            events.append(NodesReclaimed(now, tuple(sorted(set(self.reclaimed)))))
        events += self.stopped + self.ended
        if idle:
            events.append(NodesIdle(now, tuple(idle)))
        return events + self.started
