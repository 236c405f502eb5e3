"""The backend contract (tests/backend_contract.py) on a real batch system.

The scenarios speak of nodes ``n1``, ``n2``, … and owners ``alice`` and ``bob``, and expect
each poll to see what the batch system did after the step before it. A :class:`LiveWorld`
gives them that over a real cluster: the scenario's nodes are the cluster's first nodes and its
owners two real users (the names translated both ways by :class:`LiveBackend`, the nodes it
did not add hidden from the events), and every poll and every read of the cluster first waits
until the batch system has finished what it was doing (:meth:`LiveWorld.settle`): a released
task started, a requeued one back in the queue, a preempting job running.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from malletrain_core import events as ev
from malletrain_core.backends.base import Backend


@pytest.fixture(name="flag_dir")
def flag_dir_fixture() -> Iterator[Path]:
    """A folder the jobs' workers read as any user: a job's training is done when its flag
    file appears there."""
    path = Path(tempfile.mkdtemp(prefix="malletrain-flags-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


class LiveWorld:
    """The part of a contract World every real batch system shares: the names, the backend
    wrapper, settling before each look. A batch system's world adds the changes (submit,
    take, free, complete, cancel) with its own commands, :meth:`settle` and :meth:`_running`."""

    name = "live"

    def __init__(self, real_nodes: Sequence[str], users: dict[str, str],
                 make_backend: Callable[[], Backend]) -> None:
        self.real_nodes = list(real_nodes)
        self.users = users                      # scenario owner -> real user
        self.make_backend = make_backend
        self.nodes: dict[str, str] = {}         # scenario name -> real node
        self.owners: dict[str, str] = {}        # job id -> scenario owner

    # -------------------------------------------------------------- names
    def add_node(self, name: str) -> None:
        """The next of the cluster's nodes stands for ``name`` (idle: the cluster is empty)."""
        self.nodes[name] = self.real_nodes[len(self.nodes)]

    def real(self, name: str) -> str:
        return self.nodes[name]

    def scenario_node(self, real: str) -> str | None:
        """The scenario's name of a real node; None for one the scenario did not add."""
        return next((n for n, r in self.nodes.items() if r == real), None)

    def submitted(self, job_id: str, owner: str) -> str:
        """Note who submitted ``job_id`` (the world's submit calls it); returns the id."""
        self.owners[job_id] = owner
        return job_id

    def scenario_owner(self, job_id: str, real: str) -> str:
        """The scenario's owner of ``job_id`` when ``real`` is the user who submitted it, else
        ``real`` (the contract then sees the wrong owner)."""
        owner = self.owners.get(job_id)
        return owner if owner is not None and self.users[owner] == real else real

    # -------------------------------------------------------------- the contract
    def backend(self) -> Backend:
        return LiveBackend(self, self.make_backend())  # type: ignore[return-value]

    def running(self, job_id: str) -> set[str]:
        self.settle()
        return {n for r in self._running(job_id) if (n := self.scenario_node(r)) is not None}

    def settle(self) -> None:
        """Wait until the batch system is done with what the last step asked of it."""
        raise NotImplementedError

    def acted(self, actions: list[ev.Action]) -> None:
        """The backend has just run ``actions``: wait for those the batch system carries out
        with no sign of it in the meantime (none by default)."""

    def _running(self, job_id: str) -> set[str]:
        """The real nodes where the batch system runs a worker of ``job_id``."""
        raise NotImplementedError


class LiveBackend:
    """A real backend as the scenarios see it: their node and owner names, polls after the
    batch system settled, the cluster's other nodes left out."""

    def __init__(self, world: LiveWorld, backend: Backend) -> None:
        self.world, self.inner = world, backend

    def __getattr__(self, name: str) -> Any:   # jobs, workers, busy(), …
        return getattr(self.inner, name)

    def poll(self, now: float) -> list[ev.Event]:
        self.world.settle()
        return self.events(self.inner.poll(now))

    def execute(self, actions: list[ev.Action], now: float) -> list[ev.Event]:
        real = [dataclasses.replace(a, nodes=tuple(self.world.real(n) for n in a.nodes))
                if isinstance(a, (ev.Grow, ev.Shrink)) else a for a in actions]
        events = self.events(self.inner.execute(real, now))
        self.world.acted(actions)
        return events

    def events(self, events: list[ev.Event]) -> list[ev.Event]:
        named = self.world.scenario_node
        out: list[ev.Event] = []
        for e in events:
            if isinstance(e, ev.NodesIdle):
                idle = tuple(dataclasses.replace(n, name=name) for n in e.nodes
                             if (name := named(n.name)) is not None)
                e = dataclasses.replace(e, nodes=idle) if idle else None  # type: ignore[assignment]
            elif isinstance(e, ev.NodesReclaimed):
                taken = tuple(name for n in e.nodes if (name := named(n)) is not None)
                e = dataclasses.replace(e, nodes=taken) if taken else None  # type: ignore[assignment]
            elif isinstance(e, (ev.WorkerStarted, ev.WorkerStopped)):
                e = dataclasses.replace(e, node=named(e.node) or e.node)
            elif isinstance(e, ev.JobSubmitted):
                e = dataclasses.replace(e, job=dataclasses.replace(
                    e.job, owner=self.world.scenario_owner(e.job.id, e.job.owner)))
            if e is not None:
                out.append(e)
        return out
