"""The toy batch system (malletrain_core.backends.toy) as a world of the backend contract suite:
the daemon's backend built from the registry, its state in a file the world changes from outside,
as a user at a shell would."""

from __future__ import annotations

import tempfile
from pathlib import Path

from malletrain_core.backends.base import Backend
from malletrain_core.backends.registry import BATCH_SYSTEMS
from malletrain_core.backends.toy import FREE, RUNNING, TAKEN, ToyCluster
from malletrain_core.config import Config, DaemonConfig


class ToyWorld:
    name = "toy"

    def __init__(self) -> None:
        self._dir = tempfile.TemporaryDirectory()
        self.config = Config(daemon=DaemonConfig(batch_system="toy", state_dir=self._dir.name))
        self.cluster = ToyCluster(Path(self._dir.name) / "toy-cluster.json")

    def backend(self) -> Backend:
        return BATCH_SYSTEMS["toy"].backend(self.config)

    def add_node(self, name: str) -> None:
        self.cluster.set_node(name, FREE)

    def submit(self, min_nodes: int, max_nodes: int, owner: str) -> str:
        return self.cluster.submit(min_nodes, max_nodes, owner)

    def take(self, node: str) -> None:
        self.cluster.set_node(node, TAKEN)

    def free(self, node: str) -> None:
        self.cluster.set_node(node, FREE)

    def complete(self, job_id: str) -> None:
        self.cluster.end(job_id, "completed")

    def cancel(self, job_id: str) -> None:
        self.cluster.end(job_id, "cancelled")

    def running(self, job_id: str) -> set[str]:
        tasks = self.cluster.read().jobs[job_id].tasks.values()
        return {node for state, node in tasks if state == RUNNING}
