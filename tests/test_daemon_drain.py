"""The drain switch between the batch system's events and the engine (daemon/drain.py); the
live test on real Slurm is tests/slurm/test_drain.py."""

from __future__ import annotations

from pathlib import Path

from malletrain_core.daemon.drain import Drain
from malletrain_core.daemon.store import Store
from malletrain_core.events import (
    IdleNode,
    JobRequest,
    JobSubmitted,
    NodesIdle,
    NodesReclaimed,
    Shrink,
    WorkerStarted,
)


class Engine:
    node_map = {"n1": "7", "n2": "7", "n3": "8"}
    idle_nodes = frozenset({"n4"})
    hole_ends = {"n1": None, "n2": 500.0, "n3": None, "n4": 900.0}


def test_drain_withdraws_shrinks_withholds_and_resume_gives_back(tmp_path: Path) -> None:
    store = Store(tmp_path / "state")
    drain = Drain(store)
    assert drain.filter(Engine(), [], 1.0) == ([], [])  # not drained: nothing changes
    assert drain.set(True, 2.0) and not drain.set(True, 2.0)
    events, actions = drain.filter(Engine(), [], 3.0)
    assert events == [NodesReclaimed(3.0, ("n1", "n2", "n3", "n4"))]
    assert actions == [Shrink("7", ("n1", "n2")), Shrink("8", ("n3",))]
    assert store.get("drain") == {"drained": True, "since": 2.0}
    job = JobSubmitted(4.0, JobRequest("9", min_nodes=1, max_nodes=2))
    events, actions = drain.filter(Engine(), [
        NodesIdle(4.0, (IdleNode("n5", 700.0),)), NodesReclaimed(4.0, ("n4",)), job,
        WorkerStarted(4.0, "7", "n6")], 4.0)
    assert events == [NodesReclaimed(4.0, ("n4",)), job, WorkerStarted(4.0, "7", "n6")]
    assert actions == [Shrink("7", ("n6",))]  # started anyway: stopped at once
    assert sorted(drain.withheld) == ["n1", "n2", "n3", "n5", "n6"]

    assert Drain(store).drained  # a restarted daemon is still drained
    assert drain.set(False, 5.0)
    events, actions = drain.filter(Engine(), [], 6.0)
    assert actions == []
    assert events == [NodesIdle(6.0, (IdleNode("n1"), IdleNode("n2", 500.0), IdleNode("n3"),
                                      IdleNode("n5", 700.0), IdleNode("n6")))]
    assert not Drain(store).drained and drain.withheld == {}
    store.close()
