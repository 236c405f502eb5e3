"""The first poll after a restart reconciles the replayed engine with the running workers.

A daemon killed between deciding a grow (journalled) and carrying it out comes back with an
engine that holds the node for the job although no worker ever started there; one killed
before a shrink reached the batch system comes back with a worker the engine no longer
gives the job. The live counterpart is tests/slurm/test_faults.py.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import pytest

from malletrain_core import engine as engines
from malletrain_core.daemon.core import Daemon
from malletrain_core.daemon.store import Store, open_checked
from malletrain_core.events import (
    Action,
    Event,
    IdleNode,
    NodesIdle,
    NodesReclaimed,
    Shrink,
    Tick,
    WorkerStarted,
)
from malletrain_core.interfaces import Backend as BackendProtocol


class Engine:
    def __init__(self, node_map: dict[str, str]) -> None:
        self.node_map = node_map
        self.seen: list[Event] = []

    def handle_many(self, events: Sequence[Event]) -> list[Action]:
        self.seen.extend(events)
        return []


class Backend(BackendProtocol):
    name = "fake"

    def __init__(self, polled: list[Event]) -> None:
        self.polled = polled
        self.executed: list[Action] = []

    def poll(self, now: float) -> list[Event]:
        out, self.polled = self.polled, []
        return out

    def execute(self, actions: Sequence[Action], now: float) -> list[Event]:
        self.executed.extend(actions)
        return []


def daemon(tmp_path: Path, engine: Engine, backend: Backend, journal: bool) -> Daemon:
    store = Store(tmp_path / "state")
    if journal:
        store.append([Tick(1.0)])
    d = Daemon(engine, backend, store, clock=lambda: 10.0)
    d.recover()
    engine.seen.clear()
    return d


def reconciled(engine: Engine) -> list[Event]:
    return [e for e in engine.seen if isinstance(e, NodesReclaimed)
            or (isinstance(e, NodesIdle) and e.time == 10.0 and len(e.nodes) == 1)]


def test_a_grow_without_a_worker_is_dropped_after_a_restart(tmp_path: Path) -> None:
    engine = Engine({"n1": "7", "n2": "7", "n4": "7"})
    offered = (IdleNode("n1", None), IdleNode("n2", 99.0), IdleNode("n3", None))
    backend = Backend([NodesIdle(10.0, offered), WorkerStarted(10.0, "7", "n1")])
    d = daemon(tmp_path, engine, backend, journal=True)
    d.cycle()
    # n2 and n4 were never the job's; n2 is offered again (n4 is not idle: it stays out).
    assert reconciled(engine) == [NodesReclaimed(10.0, ("n2", "n4")),
                                  NodesIdle(10.0, (IdleNode("n2", 99.0),))]
    assert backend.executed == []
    engine.seen.clear()
    d.cycle()  # only the first poll after the restart reconciles
    assert reconciled(engine) == []
    d.close()
    d.store.close()


def test_a_shrink_that_never_happened_is_repeated_after_a_restart(tmp_path: Path) -> None:
    engine = Engine({"n1": "7"})
    backend = Backend([WorkerStarted(10.0, "7", "n1"), WorkerStarted(10.0, "7", "n3")])
    d = daemon(tmp_path, engine, backend, journal=True)
    d.cycle()
    assert backend.executed == [Shrink("7", ("n3",))]
    assert reconciled(engine) == []
    d.close()
    d.store.close()


def test_a_fresh_daemon_reconciles_nothing(tmp_path: Path) -> None:
    engine = Engine({"n2": "7"})
    backend = Backend([])
    d = daemon(tmp_path, engine, backend, journal=False)
    d.cycle()
    assert reconciled(engine) == []
    d.close()
    d.store.close()


def test_a_daemon_without_state_shrinks_the_workers_it_did_not_grant(tmp_path: Path) -> None:
    """State lost (a corrupt database moved aside, state_dir removed): tasks still run that
    the fresh engine never granted. They are shrunk, once, and never left on nodes that the
    engine offers to other jobs."""
    engine = Engine({})
    backend = Backend([NodesIdle(10.0, (IdleNode("n1", None), IdleNode("n2", None))),
                       WorkerStarted(10.0, "7", "n1"), WorkerStarted(10.0, "7", "n2")])
    d = daemon(tmp_path, engine, backend, journal=False)
    d.cycle()
    assert backend.executed == [Shrink("7", ("n1", "n2"))]
    assert reconciled(engine) == []
    backend.polled = [WorkerStarted(11.0, "7", "n1")]
    d.cycle()  # only the first poll reconciles
    assert backend.executed == [Shrink("7", ("n1", "n2"))]
    d.close()
    d.store.close()


@pytest.mark.parametrize("saved", ['{"format": 99, "state": {}}', '{"format": 2, "sta'],
                         ids=["unknown format", "not JSON"])
def test_a_snapshot_it_cannot_read_starts_the_daemon_from_the_batch_system(
        tmp_path: Path, saved: str, caplog: pytest.LogCaptureFixture) -> None:
    """A snapshot of a format this version does not read (a later malletraind's) is handled
    as a corrupt one: the database is moved aside, one line says so, and the daemon starts
    empty, taking the nodes and the running workers from its first poll."""
    store = Store(tmp_path / "state")
    store.append([Tick(1.0)])
    store.compact(saved)
    store.append([Tick(2.0)])
    store.close()
    polled = [NodesIdle(10.0, (IdleNode("n1", None), IdleNode("n2", None))),
              WorkerStarted(10.0, "7", "n2")]
    backend = Backend(polled)

    def opened(store: Store) -> Daemon:
        d = Daemon(engines.Engine(), backend, store, clock=lambda: 10.0)
        d.recover()
        return d

    with caplog.at_level(logging.ERROR):
        d = open_checked(tmp_path / "state", opened)
    assert len(list((tmp_path / "state").glob("state.db.corrupt-*"))) == 1
    line = next(r.getMessage() for r in caplog.records if "empty state" in r.getMessage())
    assert "the engine snapshot does not load" in line and "\n" not in line
    assert d.store.snapshot() is None and d.store.journal_length() == 0
    d.cycle()
    assert backend.executed == [Shrink("7", ("n2",))]
    assert d.engine.idle_nodes == frozenset({"n1", "n2"})
    d.close()
    d.store.close()
