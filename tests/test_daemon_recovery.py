"""The first poll after a restart reconciles the replayed engine with the running workers.

A daemon killed between deciding a grow (journalled) and carrying it out comes back with an
engine that holds the node for the job although no worker ever started there; one killed
before a shrink reached the batch system comes back with a worker the engine no longer
gives the job. The live counterpart is tests/slurm/test_faults.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from malletrain_core.daemon.core import Daemon
from malletrain_core.daemon.store import Store
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
