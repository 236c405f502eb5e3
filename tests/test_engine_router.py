"""Several engines on disjoint node sets behind one router."""

from __future__ import annotations

import pytest

from malletrain_core.engine import Engine, EngineConfig, JobPhase, Router
from malletrain_core.errors import ValidationError
from malletrain_core.events import (
    Grow,
    IdleNode,
    JobEnded,
    JobRequest,
    JobSubmitted,
    NodesIdle,
    NodesReclaimed,
    ProgressReport,
    Tick,
)
from malletrain_core.model import Curve, Objective

CURVE = Curve.of([1, 8], [10.0, 60.0])


def make_router() -> Router:
    engines = {"gpu": Engine(name="gpu"),
               "cpu": Engine(EngineConfig(objective=Objective.SPEEDUP), name="cpu")}
    return Router(engines, node_owner=lambda n: "gpu" if n.startswith("g") else "cpu",
                  job_owner=lambda r: "gpu" if r.owner == "vision" else "cpu")


def test_nodes_and_jobs_go_to_their_engine_and_never_mix() -> None:
    router = make_router()
    idle = tuple(IdleNode(n) for n in ("g1", "g2", "g3", "c1", "c2"))
    actions = router.handle_many([
        NodesIdle(0.0, idle),
        JobSubmitted(0.0, JobRequest("v", 1, 8, owner="vision", curve=CURVE)),
        JobSubmitted(0.0, JobRequest("t", 1, 8, owner="text", curve=CURVE)),
    ])
    grows = {a.job_id: set(a.nodes) for a in actions if isinstance(a, Grow)}
    assert grows == {"v": {"g1", "g2", "g3"}, "t": {"c1", "c2"}}
    gpu, cpu = router.engines["gpu"], router.engines["cpu"]
    assert set(gpu.jobs) == {"v"} and set(cpu.jobs) == {"t"}
    assert gpu.stats.replans == 1 and cpu.stats.replans == 1  # one re-plan per engine
    assert set(gpu.node_map).isdisjoint(cpu.node_map)
    assert router.node_map == {"g1": "v", "g2": "v", "g3": "v", "c1": "t", "c2": "t"}
    assert router.engine_of_node("c2") == "cpu" and router.engine_of_job("v") == "gpu"


def test_events_for_one_engine_leave_the_other_alone() -> None:
    router = make_router()
    router.handle(NodesIdle(0.0, (IdleNode("g1"), IdleNode("c1"), IdleNode("c2"))))
    router.handle(JobSubmitted(0.0, JobRequest("t", 1, 8, owner="text", curve=CURVE)))
    gpu_replans = router.engines["gpu"].stats.replans
    router.handle(NodesReclaimed(5.0, ("c1", "unknown")))
    router.handle(ProgressReport(6.0, "t", 10.0, 1))
    router.handle(JobEnded(7.0, "t"))
    assert router.engines["gpu"].stats.replans == gpu_replans
    assert router.engines["cpu"].jobs["t"].phase is JobPhase.DONE
    assert router.idle_nodes == {"g1", "c2"}
    router.handle(Tick(8.0))  # ticks reach every engine; nothing due
    assert router.stats.replans == gpu_replans + router.engines["cpu"].stats.replans


def test_a_node_stays_with_its_first_engine() -> None:
    owner = {"n1": "gpu"}
    router = Router({"gpu": Engine(name="gpu"), "cpu": Engine(name="cpu")},
                    node_owner=lambda n: owner[n], job_owner=lambda r: "cpu")
    router.handle(NodesIdle(0.0, (IdleNode("n1"),)))
    owner["n1"] = "cpu"  # the owner function changes its mind: the node does not move
    router.handle(NodesReclaimed(1.0, ("n1",)))
    router.handle(NodesIdle(2.0, (IdleNode("n1"),)))
    assert router.engines["gpu"].idle_nodes == {"n1"} and not router.engines["cpu"].idle_nodes


def test_unknown_engine_names_are_refused() -> None:
    router = Router({"a": Engine()}, node_owner=lambda n: "b", job_owner=lambda r: "a")
    with pytest.raises(ValidationError, match="not one of the engines"):
        router.handle(NodesIdle(0.0, (IdleNode("x"),)))
    with pytest.raises(ValidationError, match="at least one engine"):
        Router({}, node_owner=lambda n: "a", job_owner=lambda r: "a")
