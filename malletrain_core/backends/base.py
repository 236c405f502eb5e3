"""The one small interface every backend implements (Slurm, PBS, the simulator)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from ..events import Action, Event


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
