"""The engine's nodes against the batch system's tasks after every poll
(:func:`malletrain_core.daemon.reconcile.view_fixes`), and grants that wait for their task
instead of failing (:mod:`malletrain_core.backends.slurm.grants`).

Quick: a real engine and the Slurm backend over the simulated Slurm of tests/world_slurm.py.
Seen on real Slurm 22.05 (tests/slurm/test_faults_site.py, the corrupt state database): after
a restart without state the engine grew the job while its requeued tasks were not held yet (a
failed grant and a poll lost), and in one run of two the daemon's task-to-node view then
stayed apart from Slurm's for good.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from pathlib import Path

import pytest
from world_slurm import SlurmSim, Task

from malletrain_core.daemon.core import Daemon
from malletrain_core.daemon.reconcile import view_fixes
from malletrain_core.daemon.store import Store
from malletrain_core.engine import Engine
from malletrain_core.events import Action, Event, Grow, NodesReclaimed, Shrink, WorkerStopped
from malletrain_core.interfaces import TaskView

T = 1_800_000_000.0
WHAT_DIFFERED = "the engine's nodes differed from the batch system's tasks"


def view(running: Collection[tuple[str, str]], offered: Collection[str] = (),
         stopping: Collection[tuple[str, str]] = ()) -> TaskView:
    return TaskView(frozenset(running), frozenset(stopping), frozenset(offered))


def test_agreeing_views_need_nothing(caplog: pytest.LogCaptureFixture) -> None:
    assert view_fixes({"n1": "7"}, view({("7", "n1")}, {"n1"}), T) == ([], [])
    assert WHAT_DIFFERED not in caplog.text


def test_a_task_the_engine_does_not_give_its_job_is_shrunk() -> None:
    events, shrinks = view_fixes({"n1": "7", "n2": "8"},
                                 view({("7", "n1"), ("7", "n2"), ("7", "n3")}), T)
    assert shrinks == [Shrink("7", ("n2", "n3"))]
    assert events == [NodesReclaimed(T, ("n2",))]  # job 8 holds n2 with no task: not offered


def test_a_node_held_with_no_task_is_taken_from_the_job(
        caplog: pytest.LogCaptureFixture) -> None:
    events, shrinks = view_fixes({"n1": "7", "n2": "7"}, view(set(), {"n1"}, {("7", "n2")}), T)
    assert shrinks == []
    assert events == [WorkerStopped(T, "7", "n1"), NodesReclaimed(T, ("n2",))]
    lines = [r.getMessage() for r in caplog.records if WHAT_DIFFERED in r.getMessage()]
    assert lines == [f"{WHAT_DIFFERED}: job 7 holds n1 where none of its tasks runs (taken "
                     "from it); job 7 holds n2 where none of its tasks runs (taken from it)"]


# ------------------------------------------------------------------ a daemon on simulated Slurm
class World:
    """One job (array 1) on the simulated partition, its daemon and a clock."""

    def __init__(self, tmp_path: Path, nodes: Sequence[str], max_nodes: int) -> None:
        self.sim = SlurmSim()
        for node in nodes:
            self.sim.add_node(node)
        self.job = self.sim.submit(1, max_nodes, "alice")
        self.backend = self.sim.backend()
        self.given_back: list[Event] = []
        execute = self.backend.execute

        def recorded(actions: Sequence[Action], now: float) -> list[Event]:
            out = execute(actions, now)
            self.given_back += [e for e in out if isinstance(e, WorkerStopped)]
            return out

        self.backend.execute = recorded  # type: ignore[method-assign]
        self.now = T
        self.daemon = Daemon(Engine(), self.backend, Store(tmp_path / "state"),
                             clock=lambda: self.now, poll_interval_s=1.0)

    def cycle(self, dt: float = 1.0) -> None:
        self.now += dt
        self.daemon.cycle()

    def agree(self) -> bool:
        held = {(job, node) for node, job in self.daemon.engine.node_map.items()}
        return held == set(self.backend.view().running)

    def task(self, key: str) -> Task:
        return self.sim.tasks[key]


def differed(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if WHAT_DIFFERED in r.getMessage()]


def test_a_task_released_behind_the_daemons_back_is_shrunk_in_that_poll(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    w = World(tmp_path, ("n01", "n02", "n03"), max_nodes=2)
    w.cycle()
    w.cycle()
    assert w.sim.running(w.job) == {"n01", "n02"} and w.agree()
    # An administrator's ``scontrol release`` of a task the engine never granted (the array
    # has a third task): Slurm runs it on the idle n03.
    w.sim.tasks["1_2"] = Task("1", "1", "2", "RUNNING", "n03", "UNLIMITED", "0", "1", "alice",
                              "None", "malletrain:min=1,max=2")
    w.sim.nodes["n03"] = "allocated"
    w.cycle()
    assert differed(caplog) == [f"{WHAT_DIFFERED}: job 1 runs on n03, which the engine does not "
                                "give it (shrunk)"]
    assert ["scontrol", "requeuehold", "Incomplete", "1_2"] in w.sim.calls
    assert w.task("1_2").state == "PENDING" and w.sim.nodes["n03"] == "idle"
    assert w.agree()
    w.cycle()
    assert len(differed(caplog)) == 1 and w.daemon.counters.view_fixes == 1


def test_a_worker_the_daemon_lost_track_of_is_taken_from_the_engine(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    w = World(tmp_path, ("n01", "n02"), max_nodes=2)
    w.cycle()
    w.cycle()
    assert w.sim.running(w.job) == {"n01", "n02"} and w.agree()
    # The reverse: the daemon's table says 1_1 runs on n02, Slurm has it held (requeued, and
    # the poll that would have shown it missed): the engine holds n02 with no task there.
    w.backend._workers.pop("1_1")
    w.sim._scontrol("requeuehold", "1_1")
    w.cycle(3.0)  # past the settle: 1_1 may go back to n02
    assert differed(caplog) == [f"{WHAT_DIFFERED}: job 1 holds n02 where none of its tasks runs "
                                "(taken from it)"]
    # n02 is the engine's idle node again, free to plan (a job preempted there is not grown
    # back at once by this engine: its profiler holds the scale it measures).
    assert "n02" in w.daemon.engine.idle_nodes and w.agree()
    w.cycle()
    assert len(differed(caplog)) == 1 and w.agree()


def test_after_a_restart_without_state_no_grow_goes_before_the_shrinks_end(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Three workers running, the daemon started without state: it shrinks them and the engine
    grants the job its nodes again at once. The grants wait, no Slurm command sent, while the
    tasks are being requeued (still COMPLETING at the next poll); the first poll that finds
    them held releases them, each onto another node than the one it just left, and the last
    once the settle is over. No grant fails, the views agree after every cycle."""
    caplog.set_level(logging.INFO)
    w = World(tmp_path, ("n01", "n02", "n03"), max_nodes=3)
    for i, node in enumerate(("n01", "n02", "n03")):
        t = w.task(f"1_{i}")
        t.state, t.node, t.priority, t.reason = "RUNNING", node, "1", "None"
        w.sim.nodes[node] = "allocated"
    w.cycle()
    shrink = ["scontrol", "requeuehold", "Incomplete", "1_[0-2]"]
    assert shrink in w.sim.calls
    assert w.sim.calls[w.sim.calls.index(shrink) + 1:] == []  # the grants wait: no command
    assert dict(w.daemon.engine.node_map) == {"n01": "1", "n02": "1", "n03": "1"} and w.agree()
    for i, node in enumerate(("n01", "n02", "n03")):  # the requeue is not over yet
        t = w.task(f"1_{i}")
        t.state, t.node = "COMPLETING", node
        w.sim.nodes[node] = "completing"
    done = len(w.sim.calls)
    w.cycle(0.5)
    assert [c for c in w.sim.calls[done:] if c[0] == "scontrol"] == []
    assert w.agree()
    for i, node in enumerate(("n01", "n02", "n03")):
        t = w.task(f"1_{i}")
        t.state, t.node, t.priority, t.reason = "PENDING", "", "0", "job requeued in held state"
        w.sim.nodes[node] = "idle"
    w.cycle(0.5)
    assert w.task("1_1").node == "n01" and w.task("1_0").node == "n02"
    assert w.task("1_2").state == "PENDING" and w.agree()  # it left n03 under 2 s ago
    w.cycle(2.5)
    assert w.task("1_2").node == "n03" and w.sim.running(w.job) == {"n01", "n02", "n03"}
    assert w.agree() and w.given_back == [] and differed(caplog) == []
    assert "the grant waits for a task" in caplog.text


def test_a_worker_slurm_shows_on_another_node_is_not_kept_where_the_table_had_it(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    w = World(tmp_path, ("n01", "n02", "n03"), max_nodes=2)
    w.cycle()
    w.cycle()
    assert w.sim.running(w.job) == {"n01", "n02"}
    # 1_1 requeued and started again on n03 between two polls (its restart count not read).
    w.task("1_1").node = "n03"
    w.sim.nodes["n02"], w.sim.nodes["n03"] = "idle", "allocated"
    w.cycle()  # gone from n02: the engine no longer holds it there
    assert dict(w.daemon.engine.node_map) == {"n01": "1"} and w.agree()
    w.cycle()  # seen on n03, which the engine never gave the job: shrunk
    assert differed(caplog) == [f"{WHAT_DIFFERED}: job 1 runs on n03, which the engine does not "
                                "give it (shrunk)"]
    assert w.sim.running(w.job) == {"n01"} and w.agree()


def test_a_waiting_grant_is_given_back_when_its_hole_became_too_short_meanwhile(
        caplog: pytest.LogCaptureFixture) -> None:
    """A grant into a hole ending in 130 s waits for a task being requeued; 20 s later no task
    fits the 110 s left (Slurm's one-minute limits plus the hole margin): given back, no
    command sent, rather than a task running past the planned start."""
    sim = SlurmSim()
    sim.add_node("n01")
    job = sim.submit(1, 1, "alice")
    backend = sim.backend()
    t = sim.tasks[f"{job}_0"]
    t.state, t.node, t.priority, t.reason = "RUNNING", "n01", "1", "None"
    sim.nodes["n01"] = "allocated"
    backend.poll(T)
    backend.execute([Shrink(job, ("n01",))], T)
    t.state, t.node = "COMPLETING", "n01"  # the requeue is not over
    sim.nodes["n01"] = "completing"
    assert backend.execute([Grow(job, ("n01",), 130.0)], T + 0.5) == []  # waits
    t.state, t.node, t.priority, t.reason = "PENDING", "", "0", "job requeued in held state"
    sim.nodes["n01"] = "idle"
    done = len(sim.calls)
    events = backend.poll(T + 20.5)
    assert WorkerStopped(T + 20.5, job, "n01") in events
    assert [c for c in sim.calls[done:] if c[:2] in (["scontrol", "update"],
                                                     ["scontrol", "release"])] == []
    assert f"grow of job {job} on n01: hole under one minute" in caplog.text
