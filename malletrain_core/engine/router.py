"""Several engines side by side on disjoint node sets (the paper's multiple trainers).

Every node belongs to the engine ``node_owner`` names the first time the node is seen, and
stays there (None: the node belongs to no engine and is not offered); every job to the engine
``job_owner`` names at submission. Node events are split
by owner, job events go to the job's engine, ticks to all. A burst is split per engine and
each engine re-plans at most once for it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from ..errors import ValidationError
from ..events import (
    Action,
    Event,
    IdleNode,
    JobEnded,
    JobRequest,
    JobSubmitted,
    NodesIdle,
    NodesReclaimed,
    ProgressReport,
    Tick,
    WorkerStarted,
    WorkerStopped,
)
from .config import EngineStats, JobView
from .engine import Engine
from .planner import Planner


class Router:
    """Routes events to engines and merges their actions (engine order, as given); a
    :class:`~malletrain_core.engine.planner.Planner` like one engine."""

    name = "router"

    def __init__(self, engines: Mapping[str, Engine], node_owner: Callable[[str], str | None],
                 job_owner: Callable[[JobRequest], str]) -> None:
        if not engines:
            raise ValidationError("router", "engines", "give at least one engine")
        self.engines = dict(engines)
        self._node_owner = node_owner
        self._job_owner = job_owner
        self._node_engine: dict[str, str] = {}
        self._unowned: set[str] = set()
        self._job_engine: dict[str, str] = {}

    def state_dict(self) -> dict[str, Any]:
        """The routes and every engine's :meth:`Engine.state_dict`, as plain data."""
        return {"routes": {"nodes": dict(self._node_engine), "jobs": dict(self._job_engine),
                           "unowned": sorted(self._unowned)},
                "engines": {name: engine.state_dict() for name, engine in self.engines.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take the state :meth:`state_dict` wrote, of a router over trainers of the same
        names; raises KeyError, TypeError or ValueError on one it cannot read."""
        saved = state.get("engines")
        if not isinstance(saved, dict) or set(saved) != set(self.engines):
            raise ValueError(f"the state holds trainers {sorted(saved or [])}, this router "
                             f"{sorted(self.engines)}")
        for name, engine in self.engines.items():
            engine.load_state_dict(saved[name])
        routes = state["routes"]
        self._node_engine = {str(k): str(v) for k, v in routes["nodes"].items()}
        self._job_engine = {str(k): str(v) for k, v in routes["jobs"].items()}
        self._unowned = {str(n) for n in routes["unowned"]}

    def _engine_for(self, owner: str, what: str) -> str:
        if owner not in self.engines:
            raise ValidationError("router", what, f"owner function chose {owner!r}, which is "
                                  f"not one of the engines {sorted(self.engines)}")
        return owner

    def _split(self, event: Event) -> dict[str, Event]:
        if isinstance(event, NodesIdle):
            parts: dict[str, list[IdleNode]] = {}
            for node in event.nodes:
                name = self._node_engine.get(node.name)
                if name is None and node.name not in self._unowned:
                    owner = self._node_owner(node.name)
                    if owner is None:
                        self._unowned.add(node.name)
                        continue
                    name = self._engine_for(owner, f"node {node.name!r}")
                    self._node_engine[node.name] = name
                if name is not None:
                    parts.setdefault(name, []).append(node)
            return {name: replace(event, nodes=tuple(nodes)) for name, nodes in parts.items()}
        if isinstance(event, NodesReclaimed):
            names: dict[str, list[str]] = {}
            for node_name in event.nodes:
                engine = self._node_engine.get(node_name)
                if engine is not None:
                    names.setdefault(engine, []).append(node_name)
            return {name: replace(event, nodes=tuple(nodes)) for name, nodes in names.items()}
        if isinstance(event, JobSubmitted):
            job_id = event.job.id
            name = self._job_engine.get(job_id)
            if name is None:
                name = self._engine_for(self._job_owner(event.job), f"job {job_id!r}")
                self._job_engine[job_id] = name
            return {name: event}
        if isinstance(event, (JobEnded, ProgressReport, WorkerStarted, WorkerStopped)):
            name = self._job_engine.get(event.job_id)
            return {} if name is None else {name: event}
        if isinstance(event, Tick):
            return {name: event for name in self.engines}
        raise ValidationError("router", "event", f"unknown event type {type(event).__name__}")

    def handle(self, event: Event) -> list[Action]:
        """Route one event; each engine concerned re-plans if it calls for it."""
        return self.handle_many((event,))

    def handle_many(self, events: Sequence[Event]) -> list[Action]:
        """Route a burst: each engine gets its share as one burst (at most one re-plan)."""
        per_engine: dict[str, list[Event]] = {}
        for event in events:
            for name, part in self._split(event).items():
                per_engine.setdefault(name, []).append(part)
        actions: list[Action] = []
        for name, engine in self.engines.items():
            if name in per_engine:
                forgotten = engine.stats.forgotten
                actions.extend(engine.handle_many(per_engine[name]))
                if engine.stats.forgotten != forgotten:  # its finished jobs went: their routes too
                    self._job_engine = {j: e for j, e in self._job_engine.items()
                                        if e != name or engine.knows(j)}
        return actions

    def engine_of_node(self, node: str) -> str | None:
        return self._node_engine.get(node)

    def engine_of_job(self, job_id: str) -> str | None:
        return self._job_engine.get(job_id)

    def trainer_of_job(self, job_id: str) -> str:
        return self._job_engine.get(job_id, "")

    def trainer_of_node(self, node: str) -> str:
        return self._node_engine.get(node, "")

    @property
    def jobs(self) -> Mapping[str, JobView]:
        merged: dict[str, JobView] = {}
        for engine in self.engines.values():
            merged.update(engine.jobs)
        return merged

    @property
    def node_map(self) -> Mapping[str, str]:
        merged: dict[str, str] = {}
        for engine in self.engines.values():
            merged.update(engine.node_map)
        return merged

    @property
    def idle_nodes(self) -> frozenset[str]:
        return frozenset().union(*(e.idle_nodes for e in self.engines.values()))

    @property
    def hole_ends(self) -> Mapping[str, float | None]:
        merged: dict[str, float | None] = {}
        for engine in self.engines.values():
            merged.update(engine.hole_ends)
        return merged

    @property
    def stats(self) -> EngineStats:
        """The engines' counters summed."""
        total = EngineStats()
        for engine in self.engines.values():
            for key, value in vars(engine.stats).items():
                setattr(total, key, getattr(total, key) + value)
        return total


def trainers(engine: Planner) -> dict[str, Engine] | None:
    """A router's engines by trainer name, or None for a single engine (what the daemon's
    status and metrics need to tell the two apart)."""
    return dict(engine.engines) if isinstance(engine, Router) else None
