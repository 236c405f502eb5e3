"""The engine: events in, actions out, checked on invariants with a fake job model."""

from __future__ import annotations

import random

import pytest
from engine_jobs import FakeCluster, check_actions, curve_truth
from hypothesis import given, settings
from hypothesis import strategies as st

from malletrain_core.engine import Engine, EngineConfig, JobPhase
from malletrain_core.errors import ConfigError, SolverError, ValidationError
from malletrain_core.events import (
    Action,
    Checkpoint,
    EndReason,
    Event,
    Finish,
    Grow,
    IdleNode,
    JobEnded,
    JobRequest,
    JobSubmitted,
    NodesIdle,
    NodesReclaimed,
    ProgressReport,
    Shrink,
    Tick,
    WorkerStarted,
    WorkerStopped,
)
from malletrain_core.model import Curve, Problem

LINEAR = Curve.of([1, 64], [10.0, 640.0])
SUBLINEAR = Curve.of([1, 2, 4, 8, 16, 32], [10, 19, 35, 60, 90, 110])


def names(n: int, prefix: str = "n") -> list[str]:
    return [f"{prefix}{i:03d}" for i in range(n)]


def req(job_id: str, lo: int = 1, hi: int = 16, curve: Curve | None = SUBLINEAR,
        **kw: object) -> JobRequest:
    return JobRequest(job_id, lo, hi, curve=curve, **kw)  # type: ignore[arg-type]


def test_grow_onto_idle_nodes_with_hole_time_limit() -> None:
    engine = Engine()
    engine.handle(NodesIdle(100.0, (IdleNode("a", 400.0), IdleNode("b", 1000.0),
                                    IdleNode("c", None))))
    actions = engine.handle(JobSubmitted(100.0, req("j", hi=2)))
    # longest-lived first; one grow per time limit, so that c (no hole end) is not held to
    # b's hole, which a backend may refuse as too short
    assert actions == [Grow("j", ("c",), engine.config.default_time_limit_s),
                       Grow("j", ("b",), 900.0)]
    assert engine.jobs["j"].phase is JobPhase.RUNNING
    assert engine.idle_nodes == {"a"}
    assert dict(engine.node_map) == {"b": "j", "c": "j"}


def test_time_limit_defaults_when_no_hole_end_is_known() -> None:
    engine = Engine(EngineConfig(default_time_limit_s=3600.0))
    engine.handle(NodesIdle(0.0, tuple(IdleNode(n) for n in names(3))))
    (grow,) = engine.handle(JobSubmitted(0.0, req("j")))
    assert isinstance(grow, Grow) and grow.time_limit_s == 3600.0 and len(grow.nodes) == 3


def test_new_job_takes_nodes_from_a_running_one_with_checkpoint_first() -> None:
    engine = Engine(EngineConfig(lookahead_s=600.0))
    engine.handle(NodesIdle(0.0, tuple(IdleNode(n) for n in names(16))))
    engine.handle(JobSubmitted(0.0, req("a")))
    assert len(engine.jobs["a"].nodes) == 16
    actions = engine.handle(JobSubmitted(10.0, req("b")))
    assert [type(a) for a in actions] == [Checkpoint, Shrink, Grow]
    assert actions[0].job_id == "a" and actions[1].job_id == "a" and actions[2].job_id == "b"
    assert set(actions[1].nodes) == set(actions[2].nodes)  # type: ignore[attr-defined]
    assert len(engine.jobs["a"].nodes) + len(engine.jobs["b"].nodes) == 16


def test_admission_is_fcfs_in_batches_up_to_the_cap() -> None:
    engine = Engine(EngineConfig(max_running_jobs=2))
    engine.handle(NodesIdle(0.0, tuple(IdleNode(n) for n in names(32))))
    engine.handle_many([JobSubmitted(0.0, req(f"j{i}", hi=8)) for i in range(5)])
    phases = {j: v.phase for j, v in engine.jobs.items()}
    assert phases == {"j0": JobPhase.RUNNING, "j1": JobPhase.RUNNING, "j2": JobPhase.QUEUED,
                      "j3": JobPhase.QUEUED, "j4": JobPhase.QUEUED}
    assert not engine.jobs["j2"].nodes
    actions = engine.handle_many([JobEnded(5.0, "j0"), JobEnded(5.0, "j1", EndReason.CANCELLED)])
    assert actions[:2] == [Finish("j0"), Finish("j1")]
    phases = {j: v.phase for j, v in engine.jobs.items()}
    assert phases["j2"] is phases["j3"] is JobPhase.RUNNING  # one batch of P_jmax − N_jrun
    assert phases["j4"] is JobPhase.QUEUED
    assert {a.job_id for a in actions if isinstance(a, Grow)} == {"j2", "j3"}
    assert engine.stats.admitted == 4


def test_a_burst_is_one_replan() -> None:
    engine = Engine()
    burst: list[Event] = [NodesIdle(float(i), (IdleNode(f"n{i}"),)) for i in range(10)]
    burst += [JobSubmitted(10.0, req(f"j{i}", hi=4)) for i in range(3)]
    actions = engine.handle_many(burst)
    assert engine.stats.replans == 1
    assert sum(len(a.nodes) for a in actions if isinstance(a, Grow)) == 10
    assert all(2 <= len(v.nodes) <= 4 for v in engine.jobs.values())


def test_reports_ticks_and_confirmations_do_not_replan() -> None:
    engine = Engine()
    engine.handle(NodesIdle(0.0, tuple(IdleNode(n) for n in names(4))))
    engine.handle(JobSubmitted(0.0, req("a")))
    replans = engine.stats.replans
    for event in (ProgressReport(10.0, "a", 100.0, 4), WorkerStarted(10.0, "a", "n000"),
                  Tick(20.0), ProgressReport(30.0, "a", 900.0, 4), ProgressReport(9.0, "x", 1, 1)):
        assert engine.handle(event) == []
    assert engine.stats.replans == replans


def test_reclaim_removes_every_reclaimed_node_from_its_job() -> None:
    engine = Engine()
    engine.handle(NodesIdle(0.0, tuple(IdleNode(n) for n in names(8))))
    engine.handle(JobSubmitted(0.0, req("a", hi=8)))
    lost = ("n001", "n004", "n006")
    actions = engine.handle(NodesReclaimed(50.0, lost + ("elsewhere",)))
    view = engine.jobs["a"]
    assert not set(lost) & set(view.nodes) and len(view.nodes) == 5
    assert not set(lost) & set(engine.node_map) and not set(lost) & engine.idle_nodes
    assert all(not set(lost) & set(getattr(a, "nodes", ())) for a in actions)
    assert engine.stats.preemptions == 1
    # Nodes reclaimed from the free pool alone call for no re-plan.
    engine.handle(NodesIdle(60.0, (IdleNode("x"),)))
    replans = engine.stats.replans
    engine.handle(JobSubmitted(61.0, req("b", lo=2, hi=2, curve=Curve.of([2], [0.0]))))
    engine.handle(NodesReclaimed(70.0, tuple(sorted(engine.idle_nodes))))
    assert engine.stats.replans == replans + 1


def test_job_end_finishes_and_frees_its_nodes_for_others() -> None:
    engine = Engine()
    engine.handle(NodesIdle(0.0, tuple(IdleNode(n) for n in names(8))))
    engine.handle_many([JobSubmitted(0.0, req("a", hi=4, curve=Curve.of([1, 4], [20, 80]))),
                        JobSubmitted(0.0, req("b", lo=2, hi=8, curve=LINEAR))])
    held_a = set(engine.jobs["a"].nodes)
    assert len(held_a) == 4
    actions = engine.handle(JobEnded(100.0, "a"))
    assert actions[0] == Finish("a")
    grows = [a for a in actions if isinstance(a, Grow)]
    assert grows and grows[0].job_id == "b" and set(grows[0].nodes) == held_a
    assert engine.jobs["a"].phase is JobPhase.DONE and not engine.jobs["a"].nodes
    assert engine.handle(JobEnded(101.0, "a")) == []


def test_queued_job_can_end_before_admission() -> None:
    engine = Engine(EngineConfig(max_running_jobs=1))
    engine.handle_many([JobSubmitted(0.0, req("a")), JobSubmitted(0.0, req("b"))])
    assert engine.handle(JobEnded(1.0, "b"))[0] == Finish("b")
    assert engine.jobs["b"].phase is JobPhase.DONE


def test_unexpected_worker_stop_frees_the_node_and_plans_again_at_once() -> None:
    """A worker the engine did not stop (its task failed, its grant was not carried out)
    frees the node, and the allocation is made again at once: the node, idle, goes back to a
    job that wants it (it stayed idle until some other event came: 4 min in bench/e2e.py)."""
    engine = Engine(EngineConfig(profiling=False))
    engine.handle(NodesIdle(0.0, tuple(IdleNode(n) for n in names(4))))
    engine.handle(JobSubmitted(0.0, req("a", hi=4, curve=LINEAR)))
    assert len(engine.jobs["a"].nodes) == 4
    acts = engine.handle(WorkerStopped(5.0, "a", "n002"))
    assert [a.nodes for a in acts if isinstance(a, Grow)] == [("n002",)]
    assert "n002" not in engine.idle_nodes and len(engine.jobs["a"].nodes) == 4
    engine.handle(WorkerStopped(6.0, "b", "n002"))  # not b's node: nothing happens
    assert len(engine.jobs["a"].nodes) == 4


def test_bad_input_is_refused_with_a_clear_message() -> None:
    engine = Engine()
    with pytest.raises(ValidationError, match="max_nodes"):
        engine.handle(JobSubmitted(0.0, JobRequest("bad", 4, 2)))
    with pytest.raises(ValidationError, match="not a malletrain_core.events event"):
        engine.handle(object())  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="max_running_jobs"):
        EngineConfig(max_running_jobs=0)
    with pytest.raises(ConfigError, match="profile_window_s"):
        EngineConfig(profile_window_s=0.0)
    engine.handle(JobSubmitted(0.0, req("a")))
    assert engine.handle(JobSubmitted(1.0, req("a", hi=2))) == []  # a repeat is ignored
    assert engine.jobs["a"].max_nodes == 16


def test_solver_failure_keeps_the_current_map() -> None:
    calls = []

    def failing(problem: Problem):  # type: ignore[no-untyped-def]
        calls.append(problem)
        raise SolverError("no optimum proved")

    engine = Engine(policy=failing)
    engine.handle(NodesIdle(0.0, tuple(IdleNode(n) for n in names(4))))
    assert engine.handle(JobSubmitted(0.0, req("a"))) == []
    assert calls and engine.stats.solver_failures == 1 and engine.idle_nodes == set(names(4))


def test_policy_that_breaks_bounds_is_an_error() -> None:
    from malletrain_core.model import Solution

    engine = Engine(policy=lambda p: Solution({j.id: 99 for j in p.jobs}, 0.0, "bad", 0.0))
    engine.handle(NodesIdle(0.0, tuple(IdleNode(n) for n in names(4))))
    with pytest.raises(SolverError, match="outside"):
        engine.handle(JobSubmitted(0.0, req("a")))


def _scenario(seed: int) -> list[Action]:
    """A random but reproducible life: idle nodes, reclaims, jobs, ends, reports."""
    rng = random.Random(seed)
    engine = Engine(EngineConfig(max_running_jobs=rng.choice([None, 2, 3]), profile_window_s=30.0,
                                 default_scale_up_s=rng.choice([5.0, 20.0])))
    cluster = FakeCluster(engine)
    pool = names(24)
    idle: set[str] = set()
    for step in range(80):
        roll = rng.random()
        if roll < 0.3:
            fresh = rng.sample([n for n in pool if n not in idle], k=min(4, len(pool) - len(idle)))
            cluster.idle(fresh, hole_s=rng.choice([None, 300.0, 3000.0]))
            idle |= set(fresh)
        elif roll < 0.45 and idle:
            gone = rng.sample(sorted(idle), k=rng.randint(1, min(6, len(idle))))
            cluster.reclaim(gone)
            idle -= set(gone)
        elif roll < 0.6:
            lo = rng.randint(1, 3)
            curve = rng.choice([None, SUBLINEAR, LINEAR])
            cluster.submit(req(f"j{step}", lo, rng.randint(lo, 12), curve,
                               profile=rng.random() < 0.8, model=rng.choice(["", "m1", "m2"])),
                           curve_truth(SUBLINEAR))
        elif roll < 0.67:
            live = [j for j, v in engine.jobs.items() if v.phase is not JobPhase.DONE]
            if live:
                cluster.send(JobEnded(cluster.now, rng.choice(live)))
        else:
            cluster.run(rng.choice([10.0, 40.0, 90.0]))
    return cluster.actions


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10_000))
def test_invariants_hold_in_random_scenarios(seed: int) -> None:
    _scenario(seed)  # FakeCluster.send checks every batch of actions


def test_engine_is_deterministic() -> None:
    assert _scenario(7) == _scenario(7)
    assert _scenario(7) != _scenario(8)


def test_check_actions_catches_a_broken_batch() -> None:
    engine = Engine()
    with pytest.raises(AssertionError, match="neither free"):
        check_actions(engine, frozenset(), {}, [Grow("a", ("ghost",), 10.0)])
    with pytest.raises(AssertionError, match="keep rule"):
        check_actions(engine, frozenset({"x"}), {"y": "a"}, [Checkpoint("a"), Shrink("a", ("y",)),
                                                             Grow("a", ("x",), 1.0)])


def test_decisions_do_not_depend_on_hash_order() -> None:
    """Sets of node names iterate in hash order; the actions must not."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    here = Path(__file__).resolve().parent
    code = "import test_engine as t; print(repr(t._scenario(11)) + repr(t._scenario(12)))"
    outputs = set()
    for seed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=seed,
                   PYTHONPATH=os.pathsep.join([str(here), str(here.parent)]))
        run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, timeout=120, check=True)
        outputs.add(run.stdout)
    assert len(outputs) == 1 and "Grow(" in outputs.pop()


def test_unknown_solver_is_refused_at_construction() -> None:
    with pytest.raises(ConfigError, match="solver"):
        Engine(EngineConfig(solver="simplex-by-hand"))
    engine = Engine(EngineConfig(solver="dp"))
    engine.handle(NodesIdle(0.0, (IdleNode("n"),)))
    assert engine.handle(JobSubmitted(0.0, req("a")))[0] == Grow("a", ("n",), 72 * 3600.0)
