"""Finished jobs are forgotten after ``done_retention_s`` of event time: the engine's state (and
so the daemon's memory and snapshots) stays bounded on a long run, a restart from a compacted
journal still gives the engine a full replay gives, and a router drops the routes of the jobs
its engines forgot.

The daemon runs for real (Store on disk, Daemon.cycle) against the seeded stand-in backend
:class:`~malletrain_core.sim.churn.ChurnBackend`, as in tests/test_journal_compaction.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from malletrain_core.config import from_mapping
from malletrain_core.daemon import main as daemon_main
from malletrain_core.daemon import snapshot as snapshots
from malletrain_core.daemon.core import Daemon
from malletrain_core.daemon.store import Store
from malletrain_core.engine import Engine, EngineConfig, JobPhase
from malletrain_core.engine.router import Router
from malletrain_core.errors import ConfigError
from malletrain_core.events import (
    Action,
    EndReason,
    IdleNode,
    JobEnded,
    JobRequest,
    JobSubmitted,
    NodesIdle,
    ProgressReport,
    Tick,
)
from malletrain_core.sim.churn import ChurnBackend

RETENTION_S = 200.0


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def run(state: Path, cycles: int, bound: int | None, retention: float | None, seed: int = 1,
        start: float = 1000.0) -> tuple[Daemon, list[int], list[Action]]:
    """A daemon on ``state`` driven ``cycles`` cycles, 2 s apart; it, the engine's job count
    after every cycle, and every action it executed."""
    clock = Clock(start)
    engine = Engine(EngineConfig(done_retention_s=retention))
    daemon = Daemon(engine, ChurnBackend(seed), Store(state), clock=clock,
                    tick_interval_s=5.0, journal_max_events=bound)
    daemon.recover()
    jobs: list[int] = []
    actions: list[Action] = []
    for _ in range(cycles):
        actions += daemon.cycle()
        jobs.append(len(engine._jobs))  # not Engine.jobs: its views fill the curve caches
        clock.t += 2.0
    return daemon, jobs, actions


def recovered(state: Path, retention: float | None) -> Engine:
    store = Store(state)
    engine = Engine(EngineConfig(done_retention_s=retention))
    Daemon(engine, ChurnBackend(0), store).recover()
    store.close()
    return engine


def test_a_finished_job_is_forgotten_after_its_retention_and_its_late_events_are_ignored(
        ) -> None:
    engine = Engine(EngineConfig(done_retention_s=50.0))
    engine.handle(NodesIdle(0.0, (IdleNode("n1"), IdleNode("n2"))))
    engine.handle(JobSubmitted(1.0, JobRequest("a", 1, 2, profile=False)))
    engine.handle(JobSubmitted(1.0, JobRequest("b", 1, 2, profile=False)))
    engine.handle(JobEnded(100.0, "a", EndReason.CANCELLED))
    assert engine.jobs["a"].phase is JobPhase.DONE
    engine.handle(Tick(150.0))  # ended 50 s ago: kept up to and including the retention
    assert engine.knows("a") and engine.stats.forgotten == 0
    engine.handle(Tick(150.5))
    assert not engine.knows("a") and "a" not in engine.jobs
    assert "a" not in engine._pool.held and "b" in engine._pool.held
    assert engine.stats.forgotten == 1
    assert engine.knows("b") and engine.jobs["b"].phase is not JobPhase.DONE
    assert engine.handle(JobEnded(151.0, "a", EndReason.CANCELLED)) == []
    assert engine.handle(ProgressReport(152.0, "a", 100.0, 1, 1)) == []
    assert not engine.knows("a") and engine.stats.forgotten == 1


def test_without_a_retention_finished_jobs_stay() -> None:
    engine = Engine(EngineConfig())
    engine.handle(JobSubmitted(1.0, JobRequest("a", 1, 2, profile=False)))
    engine.handle(JobEnded(2.0, "a", EndReason.COMPLETED))
    engine.handle(Tick(1e9))
    assert engine.jobs["a"].phase is JobPhase.DONE and engine.stats.forgotten == 0


def test_the_engine_state_stays_bounded_and_a_compacted_restart_equals_a_full_replay(
        tmp_path: Path) -> None:
    kept, _, _ = run(tmp_path / "kept", 1500, None, None)
    full, jobs_full, _ = run(tmp_path / "full", 1500, None, RETENTION_S)
    compacted, jobs_comp, _ = run(tmp_path / "compacted", 1500, 1000, RETENTION_S)
    assert compacted.compactions >= 10
    forgotten = compacted.engine.stats.forgotten
    assert forgotten > 80, forgotten  # 98 (over 100 before profiles stepped by powers of two)
    # Without a retention every job ever seen stays; with it, only the live ones and those
    # that ended within the last 200 s (100 cycles) of event time.
    assert len(kept.engine._jobs) > 2 * max(jobs_comp[-500:]), (len(kept.engine._jobs),
                                                               max(jobs_comp[-500:]))
    assert max(jobs_comp[500:]) <= max(jobs_comp[:500]) + 10
    assert len(compacted.engine._pool.held) <= len(compacted.engine._jobs)  # no empty sets left
    assert jobs_full == jobs_comp
    live = snapshots.canonical(full.engine)
    assert snapshots.canonical(compacted.engine) == live
    for d in (kept, full, compacted):
        d.store.close()
    assert snapshots.canonical(recovered(tmp_path / "full", RETENTION_S)) == live
    assert snapshots.canonical(recovered(tmp_path / "compacted", RETENTION_S)) == live
    # ... and the restarted daemons go on to decide alike, forgetting alike.
    again_full, _, acts_full = run(tmp_path / "full", 300, None, RETENTION_S, seed=2,
                                   start=5000.0)
    again_comp, _, acts_comp = run(tmp_path / "compacted", 300, 1000, RETENTION_S, seed=2,
                                   start=5000.0)
    assert len(acts_full) > 50
    assert acts_full == acts_comp
    assert again_comp.engine.stats.forgotten > forgotten
    assert snapshots.canonical(again_full.engine) == snapshots.canonical(again_comp.engine)
    again_full.store.close()
    again_comp.store.close()


def test_a_router_drops_the_routes_of_forgotten_jobs() -> None:
    engines = {name: Engine(EngineConfig(done_retention_s=10.0), name=name)
               for name in ("a", "b")}
    router = Router(engines, node_owner=lambda n: "a" if n.startswith("a") else "b",
                    job_owner=lambda req: req.trainer or "a")
    router.handle_many([JobSubmitted(1.0, JobRequest("1", 1, 1, profile=False)),
                        JobSubmitted(1.0, JobRequest("2", 1, 1, profile=False, trainer="b"))])
    router.handle(JobEnded(2.0, "1", EndReason.COMPLETED))
    assert router.engine_of_job("1") == "a"
    router.handle(Tick(20.0))
    assert router.engine_of_job("1") is None and router.engine_of_job("2") == "b"
    assert router.stats.forgotten == 1
    assert "1" not in router.jobs and "2" in router.jobs


def test_the_daemon_setting_reaches_the_engine_and_is_validated() -> None:
    engine = daemon_main.make_engine(
        from_mapping({"daemon": {"finished_job_retention_s": 120.0}}).validate())
    assert isinstance(engine, Engine) and engine.config.done_retention_s == 120.0
    default = daemon_main.make_engine(from_mapping({}).validate())
    assert isinstance(default, Engine) and default.config.done_retention_s == 600.0
    with pytest.raises(ConfigError, match="finished_job_retention_s"):
        from_mapping({"daemon": {"finished_job_retention_s": -1.0}}).validate()
    with pytest.raises(ConfigError, match="done_retention_s"):
        EngineConfig(done_retention_s=float("inf"))
