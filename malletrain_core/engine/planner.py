"""What the daemon holds as its engine: the :class:`Planner` protocol.

Two classes satisfy it: one :class:`~malletrain_core.engine.engine.Engine` (a single node set),
and a :class:`~malletrain_core.engine.router.Router` over one engine per ``[[trainer]]``. The
daemon's cycle, the drain switch and the journal snapshots use these members only (a snapshot
is :meth:`Planner.state_dict` written as JSON); the status and the metrics also read each
trainer's engine of a router (:func:`~malletrain_core.engine.router.trainers`). So a newcomer
can tell what the daemon may touch; mypy checks both classes against it
(``tests/test_protocols.py`` too, at run time).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from ..events import Action, Event
from .config import EngineStats, JobView


class Planner(Protocol):
    """Events in, actions out, and the read-only views the daemon reports."""

    name: str
    """The trainer's name (``"default"`` for a single engine)."""

    def handle(self, event: Event) -> list[Action]:
        """One event; a re-plan when it calls for one."""
        ...

    def handle_many(self, events: Sequence[Event]) -> list[Action]:
        """A burst of events, at most one re-plan."""
        ...

    @property
    def jobs(self) -> Mapping[str, JobView]:
        """Every job known, as read-only snapshots."""
        ...

    @property
    def node_map(self) -> Mapping[str, str]:
        """Node → id of the job holding it."""
        ...

    @property
    def idle_nodes(self) -> frozenset[str]:
        """Offered nodes that no job holds."""
        ...

    @property
    def hole_ends(self) -> Mapping[str, float | None]:
        """Offered node → the end of its idle hole (``None``: unknown)."""
        ...

    @property
    def stats(self) -> EngineStats:
        """The counters (summed over the trainers of a router)."""
        ...

    def trainer_of_job(self, job_id: str) -> str:
        """The trainer that holds ``job_id`` (``""``: a single engine, or unknown)."""
        ...

    def trainer_of_node(self, node: str) -> str:
        """The trainer a node belongs to (``""``: a single engine, or unknown)."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """Everything the events built, as plain JSON-ready data (not the configuration)."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take a :meth:`state_dict` into a fresh planner of the same configuration."""
        ...
