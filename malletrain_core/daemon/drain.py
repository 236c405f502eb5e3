"""``malletrain admin drain`` / ``resume``: the administrator's switch that takes MalleTrain off
the cluster without stopping the daemon.

Drained, the engine is left with no node: every node it held or had free is withdrawn from it
(one ``NodesReclaimed``), every job is shrunk to zero through the backend (through the epoch
bridge, so rank 0 checkpoints first; Slurm: ``requeuehold``, the tasks go back to held), and
the nodes the batch system offers later are kept from it. Jobs stay queued: Slurm keeps their
held tasks, the engine keeps their records. A worker that starts anyway (a grow already in
flight) is shrunk as soon as it is seen. Resumed, the engine is offered every node still
withheld, and allocates as before.

The switch is kept in the daemon's state store, so a restarted daemon stays drained; the
replayed journal already holds the withdrawal, and the first poll after the restart finds any
worker still running a node the engine no longer gives it and shrinks it again
(:meth:`~malletrain_core.daemon.core.Daemon._after_recovery`).

Everything the engine sees goes through :meth:`Drain.filter` before it is journalled, so a
replay decides exactly as the live daemon did.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from ..engine.planner import Planner
from ..events import (
    Event,
    IdleNode,
    NodesIdle,
    NodesReclaimed,
    Shrink,
    WorkerStarted,
)
from .store import Store

log = logging.getLogger(__name__)

KEY = "drain"


class Drain:
    """The drain switch and the nodes it keeps from the engine (see the module doc)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        saved = store.get(KEY) or {}
        self.drained = bool(saved.get("drained", False))
        self.since: float | None = saved.get("since")
        self.withheld: dict[str, IdleNode] = {}
        self._pending: str | None = None

    def set(self, drained: bool, now: float | None = None) -> bool:
        """Drain (True) or resume (False); returns whether that changed anything. The next
        cycle (brought forward by the caller) persists it and carries it out: the state store
        belongs to the cycle's thread."""
        if drained == self.drained:
            return False
        self.drained = drained
        self.since = (now if now is not None else time.time()) if drained else None
        self._pending = "drain" if drained else "resume"
        log.warning("MalleTrain %s by an administrator", "drained" if drained else "resumed")
        return True

    def state(self) -> dict[str, Any]:
        return {"drained": self.drained, "since": self.since,
                "withheld_nodes": len(self.withheld),
                "pending": self._pending or ""}

    def filter(self, engine: Planner, events: Sequence[Event],
               now: float) -> tuple[list[Event], list[Shrink]]:
        """The events the engine may see this cycle, and the shrinks to carry out."""
        front: list[Event] = []
        actions: list[Shrink] = []
        if self._pending is not None:
            self.store.put(KEY, {"drained": self.drained, "since": self.since})
        if self._pending == "drain":
            held = dict(engine.node_map)
            free = set(engine.idle_nodes)
            ends = engine.hole_ends
            for name in set(held) | free:
                self.withheld[name] = IdleNode(name, ends.get(name))
            if self.withheld:
                front.append(NodesReclaimed(now, tuple(sorted(set(held) | free))))
            by_job: dict[str, list[str]] = {}
            for name, job in held.items():
                by_job.setdefault(job, []).append(name)
            actions += [Shrink(job, tuple(sorted(nodes))) for job, nodes in sorted(by_job.items())]
        elif self._pending == "resume" and self.withheld:
            front.append(NodesIdle(now, tuple(node for _, node in
                                              sorted(self.withheld.items()))))
            self.withheld.clear()
        self._pending = None
        if not self.drained:
            return front + list(events), actions
        out = front
        for event in events:
            if isinstance(event, NodesIdle):
                for node in event.nodes:
                    self.withheld[node.name] = node
                continue
            if isinstance(event, NodesReclaimed):
                for name in event.nodes:
                    self.withheld.pop(name, None)
            elif isinstance(event, WorkerStarted):
                actions.append(Shrink(event.job_id, (event.node,)))
                self.withheld.setdefault(event.node, IdleNode(event.node))
            out.append(event)
        return out, actions
