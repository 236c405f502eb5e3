"""SlurmBackend against Slurm's recorded output, faked at the subprocess boundary only.

The replay tests feed the outputs captured from real Slurm 22.05, 24.11 and 25.11 clusters
(tests/golden/slurm/<release>/) in order and compare the commands the backend ran with the
golden argv lists in tests/golden/slurm/*.argv (the same on every release).
"""

from __future__ import annotations

import json
import logging
import subprocess
import time
from pathlib import Path

import pytest

from malletrain_core.backends.slurm.backend import SlurmBackend, epilog_margin_for
from malletrain_core.backends.slurm.parse import SQUEUE_FORMAT, parse_plan
from malletrain_core.errors import CommandError, CommandNotFound, ValidationError
from malletrain_core.events import (
    Checkpoint,
    EndReason,
    Event,
    Finish,
    Grow,
    IdleNode,
    JobEnded,
    JobSubmitted,
    NodesIdle,
    NodesReclaimed,
    Shrink,
    WorkerStarted,
    WorkerStopped,
)
from malletrain_core.runner import CommandRunner

GOLDEN = Path(__file__).parent / "golden" / "slurm"
CAPTURED = GOLDEN / "22.05"
RELEASES = sorted(p.name for p in GOLDEN.iterdir() if p.is_dir() and p.name[:1].isdigit())
T = 1_800_000_000.0


class FakeSlurm(CommandRunner):
    """Answers the three poll queries from set texts; records and answers every command."""

    def __init__(self) -> None:
        super().__init__()
        self.sinfo = ""
        self.squeue = ""
        self.plan = ""
        self.calls: list[list[str]] = []
        self.answers: dict[tuple[str, ...], tuple[int, str]] = {}
        self.hangs: set[tuple[str, ...]] = set()
        self.captured = CAPTURED

    def load(self, stem: str) -> None:
        self.sinfo = (self.captured / f"{stem}.sinfo").read_text()
        self.squeue = (self.captured / f"{stem}.squeue").read_text()
        self.plan = (self.captured / f"{stem}.plan").read_text()

    def fail(self, prefix: tuple[str, ...], rc: int, stderr: str) -> None:
        self.answers[prefix] = (rc, stderr)

    def commands(self) -> list[list[str]]:
        """The calls that change Slurm (not the three poll queries)."""
        return [c for c in self.calls if c[0] not in ("sinfo", "squeue")]

    def _spawn(self, argv: list[str], timeout_s: float,
               input: str | None) -> subprocess.CompletedProcess[str]:
        self.calls.append(list(argv))
        out = ""
        if argv[0] == "sinfo":
            out = self.sinfo
        elif argv[0] == "squeue":
            out = self.plan if "--start" in argv else self.squeue
        for n in range(len(argv), 0, -1):
            if tuple(argv[:n]) in self.hangs:
                raise subprocess.TimeoutExpired(argv, timeout_s)
            if tuple(argv[:n]) in self.answers:
                rc, err = self.answers[tuple(argv[:n])]
                return subprocess.CompletedProcess(argv, rc, "", err)
        return subprocess.CompletedProcess(argv, 0, out, "")


def task(jid: int, aid: int, idx: int | None, state: str = "PENDING", node: str = "",
         prio: int = 0, reason: str = "JobHeldUser", limit: str = "UNLIMITED",
         tag: str = "malletrain:min=1,max=4", user: str = "alice") -> str:
    """One line of the poll's squeue output, as Slurm 22.05 prints it."""
    index = "N/A" if idx is None else idx
    return f"{jid}|{aid}|{index}|{state}|{node}|{limit}|0|{prio}|{user}|{reason}|{tag}\n"


def held_array(aid: int, n: int, **kw: str) -> str:
    return "".join(task(aid, aid, i, **kw) for i in range(n))  # type: ignore[arg-type]


def nodes(**states: str) -> str:
    return "".join(f"{name}|{state}\n" for name, state in states.items())


def of(events: list[Event], kind: type) -> list:
    return [e for e in events if isinstance(e, kind)]


@pytest.fixture()
def slurm() -> FakeSlurm:
    return FakeSlurm()


@pytest.fixture()
def backend(slurm: FakeSlurm) -> SlurmBackend:
    # Without the unplanned-job rule (its own tests are at the end): the recorded session
    # polls right after submitting a production job and shows the commands of every step.
    return SlurmBackend(slurm, grant_timeout_s=120, unplanned_wait_s=0)


def check_golden(name: str, calls: list[list[str]]) -> None:
    path = GOLDEN / f"{name}.argv"
    expected = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    assert calls == expected, f"commands differ from {path.name}"


# ----------------------------------------------------------------------------- replay
@pytest.mark.parametrize("release", RELEASES)
def test_replay_of_a_recorded_session(slurm: FakeSlurm, backend: SlurmBackend,
                                      release: str) -> None:
    """The same commands on every release's outputs (replay_22.05.argv)."""
    slurm.captured = GOLDEN / release
    (prod,) = [r for r in parse_plan((slurm.captured / "06_planned.plan").read_text())
               if r.partition == "prod"]
    hole = prod.start
    if release == "22.05":
        assert hole == time.mktime(time.strptime("2026-11-21T09:21:20", "%Y-%m-%dT%H:%M:%S"))
    T = hole - 1800  # the session's clock: its hole is about 30 minutes ahead at 06
    slurm.load("01_submitted")
    ev = backend.poll(T)
    subs = [e.job for e in of(ev, JobSubmitted)]
    assert [(j.id, j.min_nodes, j.max_nodes, j.owner, j.model, j.profile) for j in subs] == [
        ("1", 1, 3, "root", "", True), ("2", 2, 2, "root", "resnet50", False)]
    (idle,) = of(ev, NodesIdle)
    assert idle.nodes == tuple(IdleNode(f"n0{i}") for i in range(1, 5))
    assert isinstance(ev[0], JobSubmitted) and ev[-1] is idle

    assert backend.execute([Grow("1", ("n02", "n03"), 3600.0)], T + 1) == []
    slurm.load("02_running_unheld")  # and a prod job started on n01
    ev = backend.poll(T + 3)
    assert ev == [NodesReclaimed(T + 3, ("n01",)), WorkerStarted(T + 3, "1", "n02"),
                  WorkerStarted(T + 3, "1", "n03")]

    slurm.load("03_running")
    assert backend.poll(T + 4) == []

    slurm.load("04_preempted")  # a prod job took n03: task 1_1 is back, held
    assert backend.poll(T + 7) == [NodesReclaimed(T + 7, ("n03",))]
    assert backend.workers == {"1_0": ("1", "n02")}

    assert backend.execute([Checkpoint("1"), Shrink("1", ("n02",))], T + 8) == []
    slurm.load("05_shrunk")
    assert backend.poll(T + 9) == [WorkerStopped(T + 9, "1", "n02")]

    slurm.load("06_planned")  # a 4-node prod job waits: n02, n04 are its holes
    assert backend.poll(T + 13) == [NodesIdle(T + 13, (IdleNode("n02", hole),
                                                       IdleNode("n04", hole)))]
    backend.execute([Grow("2", ("n04",), 1799.0)], T + 14)
    backend.execute([Finish("1")], T + 15)
    check_golden("replay_22.05", slurm.commands())


@pytest.mark.parametrize("release", RELEASES)
def test_time_limit_and_requeue_of_a_timed_out_task(slurm: FakeSlurm, backend: SlurmBackend,
                                                    release: str) -> None:
    slurm.captured = GOLDEN / release
    slurm.load("08_before_timeout")  # as after a daemon restart: workers on n02 and n04
    ev = backend.poll(T)
    assert [e.job.id for e in of(ev, JobSubmitted)] == ["1", "2"]
    assert sorted(e.node for e in of(ev, WorkerStarted)) == ["n02", "n04"]
    assert of(ev, NodesIdle)[0].nodes == (IdleNode("n02"), IdleNode("n03"), IdleNode("n04"))
    slurm.load("09_timeout")
    # The engine drops a node whose worker it did not stop: it is offered again at once.
    assert backend.poll(T + 80) == [WorkerStopped(T + 80, "1", "n04"),
                                    NodesIdle(T + 80, (IdleNode("n04"),))]
    slurm.load("10_timeout_requeued")
    assert backend.poll(T + 82) == []
    slurm.load("11_cancelled")  # the user cancelled the whole array
    assert backend.poll(T + 84) == [JobEnded(T + 84, "1", EndReason.CANCELLED)]
    assert list(backend.jobs) == ["2"]
    check_golden("timeout_22.05", slurm.commands())


# ----------------------------------------------------------------------------- grow
def test_grow_batches_one_update_per_task_and_one_release(slurm: FakeSlurm,
                                                          backend: SlurmBackend) -> None:
    slurm.squeue = held_array(7, 4) + held_array(9, 2, tag="malletrain:min=2,max=2")
    slurm.sinfo = nodes(n01="idle", n02="idle", n03="idle")
    backend.poll(T)
    slurm.calls.clear()
    ev = backend.execute([Grow("7", ("n01", "n02"), 5000.0), Grow("9", ("n03",), None)], T)
    assert ev == []
    assert slurm.commands() == [
        ["scontrol", "update", "JobId=7_0", "ReqNodeList=n01", "StartTime=now", "TimeLimit=82"],
        ["scontrol", "update", "JobId=7_1", "ReqNodeList=n02", "StartTime=now", "TimeLimit=82"],
        ["scontrol", "update", "JobId=9_0", "ReqNodeList=n03", "StartTime=now",
         "TimeLimit=4320"],
        ["scontrol", "release", "7_[0-1],9_0"],
    ]


def test_the_epilog_margin_shortens_a_planned_task(slurm: FakeSlurm) -> None:
    """With a node Epilog the task's limit leaves hole_margin_s + epilog_margin_s of the hole:
    a 123.5 s hole takes two minutes at the local cluster's 3 s margin, one with a 5-s
    Epilog's 35 s on top, and none once fewer than 60 + 38 s remain."""
    plain = SlurmBackend(slurm, grant_timeout_s=120, unplanned_wait_s=0, hole_margin_s=3)
    backend = SlurmBackend(slurm, grant_timeout_s=120, unplanned_wait_s=0, hole_margin_s=3,
                           epilog_margin_s=epilog_margin_for(5))
    assert backend.margin_s == 38
    assert (plain._minutes(123.5), backend._minutes(123.5)) == (2, 1)
    assert backend.fits(T + 98, T) and not backend.fits(T + 97.9, T)
    slurm.squeue = held_array(7, 1)
    slurm.sinfo = nodes(n01="idle")
    backend.poll(T)
    slurm.calls.clear()
    assert backend.execute([Grow("7", ("n01",), 123.5)], T) == []
    assert slurm.commands()[0][-1] == "TimeLimit=1"
    with pytest.raises(ValidationError, match="epilog_margin_s"):
        SlurmBackend(slurm, epilog_margin_s=-1)


def test_grow_failures_come_back_as_worker_stopped(slurm: FakeSlurm,
                                                   backend: SlurmBackend) -> None:
    slurm.squeue = held_array(7, 3)
    slurm.sinfo = nodes(n01="idle", n02="idle", n03="idle", n04="idle")
    backend.poll(T)
    slurm.fail(("scontrol", "update", "JobId=7_1"), 1, "scontrol: error: Invalid node name\n")
    slurm.fail(("scontrol", "release"), 1, "7_0: No error\n7_2: Invalid job id specified\n")
    ev = backend.execute([Grow("7", ("n01", "n02", "n03", "n04"), 600.0),
                          Grow("8", ("n01",), 600.0)], T)
    assert sorted((e.job_id, e.node) for e in of(ev, WorkerStopped)) == [
        ("7", "n02"), ("7", "n03"), ("7", "n04"), ("8", "n01")]
    assert len(ev) == 4
    assert list(backend._launching) == ["7_0"]


def test_grow_into_a_hole_under_a_minute_is_refused(slurm: FakeSlurm,
                                                    backend: SlurmBackend) -> None:
    slurm.squeue = held_array(7, 2)
    slurm.sinfo = nodes(n01="idle")
    backend.poll(T)
    slurm.calls.clear()
    assert backend.execute([Grow("7", ("n01",), 59.0)], T) == [WorkerStopped(T, "7", "n01")]
    assert slurm.commands() == []


def test_a_task_that_does_not_start_is_held_again(slurm: FakeSlurm,
                                                  backend: SlurmBackend) -> None:
    slurm.squeue = held_array(7, 2)
    slurm.sinfo = nodes(n01="idle")
    backend.poll(T)
    backend.execute([Grow("7", ("n01",), 600.0)], T)
    slurm.squeue = task(7, 7, 0, prio=100, reason="Resources") + task(7, 7, 1)
    assert backend.poll(T + 60) == []
    slurm.calls.clear()
    assert backend.poll(T + 121) == [WorkerStopped(T + 121, "7", "n01"),
                                     NodesIdle(T + 121, (IdleNode("n01"),))]
    assert slurm.commands() == [["scontrol", "hold", "7_0"]]


def test_a_launch_lost_to_a_foreign_job_is_reclaimed(slurm: FakeSlurm,
                                                     backend: SlurmBackend) -> None:
    slurm.squeue = held_array(7, 2)
    slurm.sinfo = nodes(n01="idle", n02="idle")
    backend.poll(T)
    backend.execute([Grow("7", ("n01",), 600.0)], T)
    slurm.squeue = task(7, 7, 0, prio=100, reason="Resources") + task(7, 7, 1)
    slurm.sinfo = nodes(n01="allocated", n02="idle")
    slurm.calls.clear()
    assert backend.poll(T + 2) == [NodesReclaimed(T + 2, ("n01",))]
    assert slurm.commands() == [["scontrol", "hold", "7_0"]]


# ----------------------------------------------------------------------------- poll
def test_poll_commands_are_filtered_and_formatted(slurm: FakeSlurm,
                                                  backend: SlurmBackend) -> None:
    """In this order: the plan, then the nodes, then our tasks (see CommandsClient.read)."""
    backend.poll(T)
    assert slurm.calls == [
        ["squeue", "-h", "-t", "PD", "--start", "-o", "%i|%F|%S|%Y|%P|%r|%V"],
        ["sinfo", "-h", "-N", "-p", "preemptable", "-o", "%N|%T"],
        ["squeue", "-h", "-r", "-t", "all", "-p", "preemptable", "-O", SQUEUE_FORMAT],
    ]


def test_daemon_restart_rebuilds_jobs_workers_and_pool(slurm: FakeSlurm,
                                                       backend: SlurmBackend) -> None:
    slurm.squeue = (task(20, 7, 0, "RUNNING", "n02", reason="JobHeldAdmin")
                    + task(7, 7, 1)
                    + task(30, 30, None, "RUNNING", "n03", tag="(null)", prio=5, reason="None"))
    slurm.sinfo = nodes(n01="idle", n02="allocated", n03="allocated", n04="drained")
    ev = backend.poll(T)
    assert [type(e).__name__ for e in ev] == ["JobSubmitted", "NodesIdle", "WorkerStarted"]
    assert of(ev, NodesIdle)[0].nodes == (IdleNode("n01"), IdleNode("n02"))
    assert of(ev, WorkerStarted) == [WorkerStarted(T, "7", "n02")]
    assert slurm.commands() == []  # already admin-held: nothing to do


def test_unheld_tasks_are_held(slurm: FakeSlurm, backend: SlurmBackend) -> None:
    slurm.squeue = (task(20, 7, 0, "RUNNING", "n01", prio=9, reason="None")
                    + task(21, 7, 1, prio=9, reason="BeginTime") + task(7, 7, 2))
    slurm.sinfo = nodes(n01="allocated")
    backend.poll(T)
    assert slurm.commands() == [["scontrol", "hold", "7_[0-1]"]]


def test_foreign_jobs_drains_and_unresponsive_nodes(slurm: FakeSlurm,
                                                    backend: SlurmBackend) -> None:
    slurm.sinfo = nodes(n01="idle", n02="idle", n03="idle", n04="idle*")
    ev = backend.poll(T)
    assert [n.name for n in of(ev, NodesIdle)[0].nodes] == ["n01", "n02", "n03"]
    slurm.sinfo = nodes(n01="allocated", n02="drained", n03="completing", n04="idle")
    ev = backend.poll(T + 1)
    assert ev == [NodesReclaimed(T + 1, ("n01", "n02")), NodesIdle(T + 1, (IdleNode("n04"),))]
    slurm.sinfo = nodes(n01="allocated", n04="idle")  # n03 left the partition
    assert backend.poll(T + 2) == [NodesReclaimed(T + 2, ("n03",))]


def test_hole_end_changes_are_announced_again(slurm: FakeSlurm,
                                              backend: SlurmBackend) -> None:
    slurm.sinfo = nodes(n01="idle", n02="planned")
    ev = backend.poll(T)
    assert of(ev, NodesIdle)[0].nodes == (IdleNode("n01"),)  # a plan without a known end
    slurm.plan = "40|40|1800003600|n[01-02]|prod\n"
    ev = backend.poll(T + 1)
    assert of(ev, NodesIdle)[0].nodes == (IdleNode("n01", 1800003600.0),
                                          IdleNode("n02", 1800003600.0))
    assert backend.poll(T + 2) == []


def test_a_hole_no_task_fits_is_not_offered(slurm: FakeSlurm, backend: SlurmBackend,
                                            caplog: pytest.LogCaptureFixture) -> None:
    """A hole that ends before one minute plus hole_margin_s is not offered (a grant there
    was refused, again at every re-plan, in demo runs); it is once the plan moves the waiting
    job later, and an offered node whose hole shrinks under it is taken back."""
    caplog.set_level(logging.INFO, logger="malletrain_core.backends.slurm.backend")
    margin = backend.hole_margin_s
    slurm.squeue = held_array(7, 2)
    slurm.sinfo = nodes(n01="idle", n02="planned")
    slurm.plan = f"40|40|{T + 60 + margin - 1:.0f}|n02|prod\n"
    assert of(backend.poll(T), NodesIdle)[0].nodes == (IdleNode("n01"),)
    assert backend.poll(T + 1) == []
    logged = [r.getMessage() for r in caplog.records]
    assert logged == [f"node n02: its hole ends in {60 + margin - 1:.0f} s, under the "
                      f"{60 + margin:.0f} s a task needs (Slurm's one-minute time limits plus "
                      "slurm.hole_margin_s): not offered while it stays so"]
    slurm.plan = f"40|40|{T + 600:.0f}|n02|prod\n"  # the waiting job is planned later
    assert backend.poll(T + 2) == [NodesIdle(T + 2, (IdleNode("n02", T + 600),))]
    assert backend.poll(T + 600 - 60 - margin) == []  # still fits, to the second
    assert backend.poll(T + 600 - 60 - margin + 1) == [
        NodesReclaimed(T + 600 - 60 - margin + 1, ("n02",))]
    assert slurm.commands() == []


def test_a_node_planned_by_no_other_job_is_logged_per_episode(
        slurm: FakeSlurm, backend: SlurmBackend, caplog: pytest.LogCaptureFixture) -> None:
    """Such a node is not offered (a demo run left one idle 56 s so): the log says when it
    starts, whose plan names it if ours does, and how long it lasted, every time."""
    caplog.set_level(logging.INFO, logger="malletrain_core.backends.slurm.backend")
    slurm.squeue = held_array(40, 2)
    for start in (T, T + 100):
        slurm.sinfo = nodes(n01="idle", n02="planned")
        slurm.plan = "40_1|40|1800003600|n02|preemptable\n"  # our own task's plan only
        caplog.clear()
        assert of(backend.poll(start), NodesIdle)[0].nodes[-1:] != (IdleNode("n02"),)
        backend.poll(start + 1)
        warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert warned == ["node n02 is planned but no waiting job of another partition plans "
                          "it (our tasks 40_1 do): not offered while it stays so"]
        slurm.sinfo = nodes(n01="idle", n02="idle")
        slurm.plan = ""
        backend.poll(start + 57)
        assert "node n02 was planned with no other job's plan for 57.0 s; now idle" in \
            [r.getMessage() for r in caplog.records]
        slurm.sinfo = nodes(n01="allocated", n02="allocated")
        backend.poll(start + 58)


def test_job_end_reasons(slurm: FakeSlurm, backend: SlurmBackend) -> None:
    slurm.squeue = held_array(1, 2) + held_array(2, 2) + held_array(3, 2)
    backend.poll(T)
    slurm.squeue = (task(1, 1, 0, "COMPLETED") + task(1, 1, 1)
                    + task(2, 2, 0, "CANCELLED") + task(2, 2, 1, "CANCELLED")
                    + task(3, 3, 0, "FAILED") + task(3, 3, 1, "CANCELLED"))
    ev = backend.poll(T + 1)
    assert ev == [JobEnded(T + 1, "1", EndReason.COMPLETED),
                  JobEnded(T + 1, "2", EndReason.CANCELLED),
                  JobEnded(T + 1, "3", EndReason.FAILED)]
    assert backend.jobs == {} and backend.poll(T + 2) == []


def test_a_crashed_worker_stops_but_its_job_goes_on(slurm: FakeSlurm,
                                                    backend: SlurmBackend) -> None:
    slurm.squeue = task(20, 7, 0, "RUNNING", "n01", reason="JobHeldAdmin") + task(7, 7, 1)
    slurm.sinfo = nodes(n01="allocated")
    backend.poll(T)
    slurm.squeue = task(20, 7, 0, "FAILED", "n01") + task(7, 7, 1)
    slurm.sinfo = nodes(n01="idle")
    assert backend.poll(T + 1) == [WorkerStopped(T + 1, "7", "n01"),
                                   NodesIdle(T + 1, (IdleNode("n01"),))]
    assert "7" in backend.jobs and backend.offered == {"n01": None}
    assert ["scontrol", "requeuehold", "7_0"] in slurm.commands()  # the job keeps its task


def test_malformed_tag_is_ignored_and_logged(slurm: FakeSlurm, backend: SlurmBackend,
                                             caplog: pytest.LogCaptureFixture) -> None:
    slurm.squeue = held_array(5, 2, tag="malletrain:min=4,max=2")
    assert backend.poll(T) == [] and backend.poll(T + 1) == []
    assert caplog.text.count("job 5 ignored") == 1


def test_query_failures_are_typed(slurm: FakeSlurm, backend: SlurmBackend) -> None:
    slurm.fail(("squeue",), 1, "squeue: error: Unable to contact slurm controller\n")
    with pytest.raises(CommandError, match="Unable to contact slurm controller"):
        backend.poll(T)


def test_missing_commands_are_typed(backend: SlurmBackend) -> None:
    backend.runner = CommandRunner()
    backend.runner._spawn = lambda *a: (_ for _ in ()).throw(FileNotFoundError())  # type: ignore[method-assign]
    with pytest.raises(CommandNotFound, match="not found"):
        backend.poll(T)


# ----------------------------------------------------------------------------- shrink/finish
def test_shrink_requeue_holds_in_one_call(slurm: FakeSlurm, backend: SlurmBackend) -> None:
    slurm.squeue = "".join(task(20 + i, 7, i, "RUNNING", f"n0{i + 1}", reason="JobHeldAdmin")
                           for i in range(3))
    slurm.sinfo = nodes(n01="allocated", n02="allocated", n03="allocated")
    backend.poll(T)
    assert backend.execute([Shrink("7", ("n01", "n03", "n09"))], T) == []
    assert slurm.commands() == [["scontrol", "requeuehold", "Incomplete", "7_[0,2]"]]
    slurm.squeue = (task(20, 7, 0, reason="job requeued in held state")
                    + task(21, 7, 1, "RUNNING", "n02", reason="JobHeldAdmin")
                    + task(22, 7, 2, reason="job requeued in held state"))
    slurm.sinfo = nodes(n01="idle", n02="allocated", n03="completing")
    assert backend.poll(T + 1) == [WorkerStopped(T + 1, "7", "n01"),
                                   WorkerStopped(T + 1, "7", "n03")]


def test_a_failed_shrink_says_the_worker_is_still_there(slurm: FakeSlurm,
                                                        backend: SlurmBackend) -> None:
    slurm.squeue = task(20, 7, 0, "RUNNING", "n01", reason="JobHeldAdmin")
    slurm.sinfo = nodes(n01="allocated")
    backend.poll(T)
    slurm.fail(("scontrol", "requeuehold"), 1, "7_0: Job is pending execution\n")
    assert backend.execute([Shrink("7", ("n01",))], T) == [WorkerStarted(T, "7", "n01")]


def test_shrink_of_a_task_not_yet_started(slurm: FakeSlurm, backend: SlurmBackend) -> None:
    slurm.squeue = held_array(7, 2)
    slurm.sinfo = nodes(n01="idle")
    backend.poll(T)
    backend.execute([Grow("7", ("n01",), 600.0)], T)
    slurm.calls.clear()
    assert backend.execute([Shrink("7", ("n01",))], T) == [WorkerStopped(T, "7", "n01")]
    assert slurm.commands() == [["scontrol", "hold", "7_0"]]


def test_a_task_shrunk_after_it_started_is_stopped_not_adopted(slurm: FakeSlurm,
                                                               backend: SlurmBackend) -> None:
    """Slurm started the released task before the shrink's hold reached it: the hold leaves
    it running, so the next poll requeue-holds it instead of reporting it as a worker (the
    engine was told WorkerStopped and gives the node to others), and keeps the node offered."""
    slurm.squeue = held_array(7, 2)
    slurm.sinfo = nodes(n01="idle")
    backend.poll(T)
    backend.execute([Grow("7", ("n01",), 600.0)], T)
    assert backend.execute([Shrink("7", ("n01",))], T) == [WorkerStopped(T, "7", "n01")]
    slurm.squeue = task(9, 7, 0, "RUNNING", "n01", reason="JobHeldAdmin") + task(7, 7, 1)
    slurm.sinfo = nodes(n01="allocated")
    slurm.calls.clear()
    assert backend.poll(T + 3) == []
    assert slurm.commands() == [["scontrol", "requeuehold", "7_0"]]
    slurm.squeue = task(9, 7, 0, "COMPLETING", "n01", reason="JobHeldAdmin") + task(7, 7, 1)
    assert backend.poll(T + 4) == [] and backend.workers == {}
    slurm.squeue = task(9, 7, 0, reason="job requeued in held state") + task(7, 7, 1)
    slurm.sinfo = nodes(n01="idle")
    assert backend.poll(T + 5) == []
    slurm.calls.clear()
    assert backend.execute([Grow("7", ("n01",), 600.0)], T + 6) == []
    assert slurm.commands()[-1] == ["scontrol", "release", "7_0"]


def test_finish_cancels_and_is_retried(slurm: FakeSlurm, backend: SlurmBackend) -> None:
    slurm.squeue = held_array(7, 2) + held_array(12, 1)
    backend.poll(T)
    slurm.fail(("scancel",), 1, "scancel: error: Unable to contact slurm controller\n")
    assert backend.execute([Finish("12"), Finish("7")], T) == []
    slurm.answers.clear()
    slurm.squeue = task(7, 7, 0, "CANCELLED") + task(7, 7, 1) + task(12, 12, 0)
    assert backend.poll(T + 1) == []  # no events for finished jobs
    assert [c for c in slurm.commands() if c[0] == "scancel"] == [["scancel", "7", "12"]] * 2


def test_default_time_limit_must_be_a_minute() -> None:
    with pytest.raises(ValidationError, match="one-minute"):
        SlurmBackend(FakeSlurm(), default_time_limit_s=30)


def test_a_release_that_times_out_is_settled_by_the_next_poll(slurm: FakeSlurm,
                                                              backend: SlurmBackend) -> None:
    slurm.squeue = held_array(7, 2)
    slurm.sinfo = nodes(n01="idle")
    backend.poll(T)
    slurm.hangs.add(("scontrol", "release"))
    assert backend.execute([Grow("7", ("n01",), 600.0)], T) == []  # no verdict yet
    slurm.hangs.clear()
    slurm.squeue = task(20, 7, 0, "RUNNING", "n01", prio=9, reason="None") + task(7, 7, 1)
    slurm.sinfo = nodes(n01="allocated")
    assert backend.poll(T + 2) == [WorkerStarted(T + 2, "7", "n01")]


def test_scancel_of_an_already_finished_job_is_not_retried(slurm: FakeSlurm,
                                                           backend: SlurmBackend) -> None:
    slurm.squeue = held_array(7, 1)
    backend.poll(T)
    slurm.fail(("scancel",), 1, "scancel: error: Kill job error on job id 7: "
                                "Job/step already completing or completed\n")
    backend.execute([Finish("7")], T)
    backend.poll(T + 1)
    assert [c for c in slurm.commands() if c[0] == "scancel"] == [["scancel", "7"]]


# ----------------------------------------------------------------------------- unplanned jobs
def test_no_grant_while_a_job_of_another_partition_waits_unplanned(slurm: FakeSlurm) -> None:
    """A production job Slurm has not planned yet may start on any idle node: newly idle
    nodes are not offered, grows are held back (the node is withdrawn, offered again by
    the first poll without such a job) and a released task not started yet is held again;
    once planned, its nodes are holes and grants go on;
    one that stays unplanned holds grants back for ``unplanned_wait_s`` only."""
    backend = SlurmBackend(slurm, grant_timeout_s=120, unplanned_wait_s=30)
    slurm.squeue = held_array(7, 4)
    slurm.sinfo = nodes(n01="idle", n02="idle")
    assert of(backend.poll(T), NodesIdle)[0].nodes == (IdleNode("n01"), IdleNode("n02"))
    slurm.plan = "40|40|N/A|(null)|prod\n2_[0-1]|2|N/A|(null)|preemptable\n"
    slurm.sinfo = nodes(n01="idle", n02="idle", n03="idle")
    assert backend.poll(T + 1) == []  # n03 is not offered
    assert backend.busy()
    slurm.calls.clear()
    ev = backend.execute([Grow("7", ("n01",), None)], T + 1)
    # every idle node is withdrawn, so the engine does not try the next one at once
    assert ev == [WorkerStopped(T + 1, "7", "n01"), NodesReclaimed(T + 1, ("n01", "n02"))]
    assert slurm.commands() == []
    slurm.plan = "40|40|1800000600|n[01,03]|prod\n"  # planned: its nodes are holes
    ev = backend.poll(T + 2)
    assert of(ev, NodesIdle)[0].nodes == (IdleNode("n01", T + 600), IdleNode("n02"),
                                          IdleNode("n03", T + 600))
    ev = backend.execute([Grow("7", ("n02",), None)], T + 2)
    assert ev == [] and slurm.commands()[-1] == ["scontrol", "release", "7_0"]
    # Another job comes while 7_0 is released but not started: it is held again, its grow
    # failed; that job is held by its user, say: never planned, so it waits 30 s at most.
    slurm.squeue = task(7, 7, 0, prio=100, reason="Resources") + "".join(
        task(7, 7, i) for i in range(1, 4))
    slurm.plan = "41|41|N/A|(null)|prod\n"
    slurm.sinfo = nodes(n01="idle", n02="idle", n03="idle", n04="idle")
    slurm.calls.clear()
    assert backend.poll(T + 3) == [NodesReclaimed(T + 3, ("n02",)),  # not offered now
                                   WorkerStopped(T + 3, "7", "n02"),
                                   NodesIdle(T + 3, (IdleNode("n01"), IdleNode("n03")))]
    assert slurm.commands() == [["scontrol", "hold", "7_0"]]
    slurm.squeue = held_array(7, 4)
    assert backend.poll(T + 20) == []
    assert backend.poll(T + 40) == [NodesIdle(T + 40, (IdleNode("n02"), IdleNode("n04")))]


def test_a_submission_announced_after_the_poll_holds_that_cycles_grows(
        slurm: FakeSlurm) -> None:
    seen = [0]
    backend = SlurmBackend(slurm, grant_timeout_s=120)
    backend.submits_seen = lambda: seen[0]
    slurm.squeue = held_array(7, 2)
    slurm.sinfo = nodes(n01="idle", n02="idle")
    backend.poll(T)
    seen[0] += 1  # job_submit.lua's datagram for a production job, after the poll
    slurm.calls.clear()
    assert backend.execute([Grow("7", ("n01", "n02"), None)], T) == [
        WorkerStopped(T, "7", "n01"), WorkerStopped(T, "7", "n02"),
        NodesReclaimed(T, ("n01", "n02"))]
    assert slurm.commands() == []
    assert of(backend.poll(T + 1), NodesIdle)[0].nodes == (IdleNode("n01"), IdleNode("n02"))
    backend.execute([Grow("7", ("n01",), None)], T + 1)
    assert slurm.commands()[-1] == ["scontrol", "release", "7_0"]


def test_a_submission_holds_released_tasks_at_once(slurm: FakeSlurm) -> None:
    """job_submit.lua's datagram for another partition's job holds again, without waiting for
    a poll, the tasks released for grows that have not started; the next poll ends those grows
    (failed, their nodes offered again later); one that started before the hold is a worker."""
    backend = SlurmBackend(slurm, grant_timeout_s=120, unplanned_wait_s=30)
    slurm.squeue = held_array(7, 3)
    slurm.sinfo = nodes(n01="idle", n02="idle")
    backend.poll(T)
    assert backend.other_submitted() == 0  # nothing released: no command
    backend.execute([Grow("7", ("n01", "n02"), None)], T)
    slurm.calls.clear()
    assert backend.other_submitted() == 2
    assert backend.other_submitted() == 0  # already held
    assert slurm.commands() == [["scontrol", "hold", "7_[0-1]"]]
    # 7_0 started before the hold reached it; 7_1 waits, held
    slurm.squeue = task(20, 7, 0, "RUNNING", "n01", prio=0, reason="None") + task(7, 7, 1) \
        + task(7, 7, 2)
    slurm.sinfo = nodes(n01="allocated", n02="idle")
    slurm.plan = "40|40|1800000600|n02|prod|Resources|1800000000\n"
    slurm.calls.clear()
    ev = backend.poll(T + 2)
    assert WorkerStarted(T + 2, "7", "n01") in ev and WorkerStopped(T + 2, "7", "n02") in ev
    assert ["scontrol", "hold", "7_1"] not in slurm.commands()
    unplanned_off = SlurmBackend(slurm, grant_timeout_s=120, unplanned_wait_s=0)
    assert unplanned_off.other_submitted() == 0


def test_a_submission_confined_to_its_nodes_holds_only_tasks_there(slurm: FakeSlurm) -> None:
    """A production job that can run only on the nodes it names (sbatch -w) takes none of the
    others: the tasks released onto those go on starting."""
    backend = SlurmBackend(slurm, grant_timeout_s=120, unplanned_wait_s=30)
    slurm.squeue = held_array(7, 3)
    slurm.sinfo = nodes(n01="idle", n02="idle", n03="idle")
    backend.poll(T)
    backend.execute([Grow("7", ("n01", "n02", "n03"), None)], T)
    slurm.calls.clear()
    assert backend.other_submitted(("n02", "n09")) == 1
    assert slurm.commands() == [["scontrol", "hold", "7_1"]]
    assert backend.other_submitted() == 2  # one that may run anywhere: every other one
    assert slurm.commands()[-1] == ["scontrol", "hold", "7_[0,2]"]


def test_only_jobs_that_could_start_now_hold_grants_back(slurm: FakeSlurm) -> None:
    """A site's queue is full of jobs that cannot start now (held, waiting on a dependency or
    behind others, beyond the backfill's depth: never planned): they must not stop grants. A
    job Slurm has not looked at yet (reason None) or that waits for nodes does, for at most
    ``unplanned_wait_s`` after its submission time, whenever the daemon first saw it."""
    backend = SlurmBackend(slurm, grant_timeout_s=120, unplanned_wait_s=30)
    slurm.squeue = held_array(7, 4)
    slurm.sinfo = nodes(n01="idle")
    cannot = "".join(f"{40 + i}|{40 + i}|N/A|(null)|prod|{reason}|{int(T) - 5}\n"
                     for i, reason in enumerate(["JobHeldUser", "JobHeldAdmin", "Dependency",
                                                 "Priority", "BeginTime",
                                                 "QOSMaxNodePerUserLimit"]))
    slurm.plan = cannot + f"50|50|N/A|(null)|prod|None|{int(T) - 31}\n"  # submitted 31 s ago
    assert of(backend.poll(T), NodesIdle)[0].nodes == (IdleNode("n01"),)
    slurm.calls.clear()
    assert backend.execute([Grow("7", ("n01",), None)], T) == []
    assert slurm.commands()[-1] == ["scontrol", "release", "7_0"]
    for reason in ("None", "Resources"):
        fresh = SlurmBackend(slurm, grant_timeout_s=120, unplanned_wait_s=30)
        slurm.squeue, slurm.sinfo = held_array(7, 4), nodes(n01="idle")
        slurm.plan = cannot + f"51|51|N/A|(null)|prod|{reason}|{int(T) - 25}\n"
        assert of(fresh.poll(T), NodesIdle) == [], reason  # 25 s after its submission
        assert of(fresh.poll(T + 6), NodesIdle)[0].nodes == (IdleNode("n01"),), reason


def test_plan_rows_read_the_reason_and_submit_time() -> None:
    from malletrain_core.backends.slurm.parse import parse_plan
    old, new, odd = parse_plan("40|40|N/A|(null)|prod\n"
                               "41|41|N/A|(null)|prod|Resources|1800000000\n"
                               "42|42|N/A|(null)|prod|bad|description|1800000001\n")
    assert (old.reason, old.submit) == ("", None)
    assert (new.reason, new.submit) == ("Resources", 1.8e9)
    assert (odd.reason, odd.submit) == ("bad|description", 1800000001.0)


# ----------------------------------------------------------------------------- liveness
def test_a_grant_not_running_by_its_deadline_is_taken_back_and_planned_again(
        slurm: FakeSlurm, caplog: pytest.LogCaptureFixture) -> None:
    """The task is held again, the node is offered again in the same poll (the engine plans
    at once) and one line says why, with Slurm's pending reason."""
    backend = SlurmBackend(slurm, grant_timeout_s=13, unplanned_wait_s=0)
    slurm.squeue = held_array(7, 2)
    slurm.sinfo = nodes(n01="idle")
    backend.poll(T)
    backend.execute([Grow("7", ("n01",), None)], T)
    slurm.squeue = task(7, 7, 0, prio=100, reason="Priority") + task(7, 7, 1)
    assert backend.poll(T + 12) == []
    slurm.calls.clear()
    caplog.set_level(logging.WARNING)
    assert backend.poll(T + 13) == [WorkerStopped(T + 13, "7", "n01"),
                                    NodesIdle(T + 13, (IdleNode("n01"),))]
    assert slurm.commands() == [["scontrol", "hold", "7_0"]]
    assert [r.getMessage() for r in caplog.records] == [
        "grant of n01 to job 7 (task 7_0) not running after 13 s (Slurm: Priority): task "
        "held again, node offered again"]


def test_a_task_that_fails_at_start_is_requeued_held_and_the_job_keeps_it(
        slurm: FakeSlurm, backend: SlurmBackend) -> None:
    """Seen on the local cluster: two tasks grown back onto the nodes they had just left
    ended FAILED 3 ms after their start. The tasks are requeued held (not lost: the job can
    grow to its whole range again) and the nodes are offered again at once."""
    slurm.squeue = task(20, 7, 0, "RUNNING", "n01", reason="JobHeldAdmin") + task(7, 7, 1) \
        + task(7, 7, 2)
    slurm.sinfo = nodes(n01="allocated", n02="idle", n03="idle")
    backend.poll(T)
    backend.execute([Grow("7", ("n02", "n03"), None)], T)
    slurm.squeue = (task(20, 7, 0, "RUNNING", "n01", reason="JobHeldAdmin")
                    + task(21, 7, 1, "FAILED", "n02", reason="NonZeroExitCode")
                    + task(22, 7, 2, "FAILED", "n03", reason="NonZeroExitCode"))
    slurm.calls.clear()
    assert backend.poll(T + 1) == [WorkerStopped(T + 1, "7", "n02"),
                                   WorkerStopped(T + 1, "7", "n03"),
                                   NodesIdle(T + 1, (IdleNode("n02"), IdleNode("n03")))]
    assert slurm.commands() == [["scontrol", "requeuehold", "7_[1-2]"]]
    assert slurm.calls[-1] == ["squeue", "-h", "-r", "-t", "all", "-j", "7", "-O",
                               SQUEUE_FORMAT]  # a user's scancel meanwhile is not undone
    assert "7" in backend.jobs
    slurm.squeue = task(20, 7, 0, "RUNNING", "n01", reason="JobHeldAdmin") + "".join(
        task(20 + i, 7, i, reason="job requeued in held state") for i in (1, 2))
    assert backend.poll(T + 2) == []
    slurm.calls.clear()
    assert backend.execute([Grow("7", ("n02", "n03"), None)], T + 8) == []
    assert slurm.commands()[-1] == ["scontrol", "release", "7_[1-2]"]


def test_a_job_whose_tasks_keep_failing_is_stopped_with_one_line(
        slurm: FakeSlurm, caplog: pytest.LogCaptureFixture) -> None:
    """Each failure is requeued held until the job's tasks have failed task_failures_max
    times within the window: the job then ends FAILED and is cancelled. A node fault does not
    count, nor does a failure older than the window."""
    backend = SlurmBackend(slurm, grant_timeout_s=60, unplanned_wait_s=0, task_failures_max=3,
                           task_failure_window_s=100)
    slurm.squeue = held_array(7, 2)
    slurm.sinfo = nodes(n01="idle")
    backend.poll(T)

    def fails(t: float, code: str = "FAILED", restarts: int = 0) -> list[Event]:
        backend.execute([Grow("7", ("n01",), None)], t)
        slurm.squeue = (f"20|7|0|{code}|n01|UNLIMITED|{restarts}|0|alice|NonZeroExitCode|"
                        "malletrain:min=1,max=4\n" + task(7, 7, 1))
        ev = backend.poll(t + 1)
        slurm.squeue = (f"20|7|0|PENDING||UNLIMITED|{restarts + 1}|0|alice|job requeued in "
                        "held state|malletrain:min=1,max=4\n" + task(7, 7, 1))
        ev += backend.poll(t + 2)
        return ev

    caplog.set_level(logging.WARNING)
    fails(T, restarts=0)                # 1 (forgotten by T + 150)
    fails(T + 150, restarts=1)          # 1
    fails(T + 160, "NODE_FAIL", 2)      # a node fault: not counted
    assert "7" in backend.jobs
    fails(T + 170, restarts=3)          # 2
    slurm.calls.clear()
    ev = fails(T + 180, restarts=4)     # 3: stopped
    assert JobEnded(T + 181, "7", EndReason.FAILED) in ev and "7" not in backend.jobs
    assert ["scancel", "7"] in slurm.commands()
    assert not [c for c in slurm.commands() if c[:2] == ["scontrol", "requeuehold"]]
    stopped = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert stopped == ["job 7 stopped: its tasks failed 3 times within 100 s (last: task 7_0 "
                       "on n01: FAILED); its output files say why (slurm.task_failures_max)"]


def test_a_task_is_not_released_again_onto_the_node_it_just_left(slurm: FakeSlurm,
                                                                 backend: SlurmBackend) -> None:
    """Shrunk off n01 and n02 and grown back within a second: the tasks swap nodes. A grant
    whose job has no other free task waits, with no command sent, and the first poll after the
    settle releases the task there."""
    slurm.squeue = (task(20, 7, 0, "RUNNING", "n01", reason="JobHeldAdmin")
                    + task(21, 7, 1, "RUNNING", "n02", reason="JobHeldAdmin"))
    slurm.sinfo = nodes(n01="allocated", n02="allocated")
    backend.poll(T)
    backend.execute([Shrink("7", ("n01", "n02"))], T + 1)
    slurm.squeue = "".join(task(20 + i, 7, i, reason="job requeued in held state")
                           for i in (0, 1))
    slurm.sinfo = nodes(n01="idle", n02="idle")
    backend.poll(T + 1.5)
    slurm.calls.clear()
    assert backend.execute([Grow("7", ("n01", "n02"), None)], T + 2) == []
    assert slurm.commands()[:2] == [
        ["scontrol", "update", "JobId=7_1", "ReqNodeList=n01", "StartTime=now",
         "TimeLimit=4320"],
        ["scontrol", "update", "JobId=7_0", "ReqNodeList=n02", "StartTime=now",
         "TimeLimit=4320"]]
    backend.execute([Shrink("7", ("n01",))], T + 3)  # 7_1 leaves n01 before it started
    slurm.squeue = (task(20, 7, 0, "RUNNING", "n02", reason="JobHeldAdmin")
                    + task(21, 7, 1, reason="JobHeldAdmin"))
    slurm.sinfo = nodes(n01="idle", n02="allocated")
    backend.poll(T + 3.2)
    slurm.calls.clear()
    assert backend.execute([Grow("7", ("n01",), None)], T + 3.5) == []  # the grant waits
    assert slurm.commands() == []
    assert ("7", "n01") in backend.view().running and backend.busy()
    assert backend.poll(T + 4) == []  # 7_1 left n01 a second ago: it waits on
    assert "release" not in {c[1] for c in slurm.commands()}
    assert backend.poll(T + 5.5) == []
    assert slurm.commands()[-1] == ["scontrol", "release", "7_1"]
    assert backend.launching == {"7_1": "n01"}


def test_the_time_from_a_grant_to_its_task_running_is_counted(slurm: FakeSlurm,
                                                              backend: SlurmBackend) -> None:
    assert backend.grant_starts() == {"count": 0}
    slurm.squeue = held_array(7, 2)
    slurm.sinfo = nodes(n01="idle", n02="idle")
    backend.poll(T)
    backend.execute([Grow("7", ("n01",), None)], T)
    backend.execute([Grow("7", ("n02",), None)], T + 1)
    slurm.squeue = (task(20, 7, 0, "RUNNING", "n01", reason="JobHeldAdmin")
                    + task(21, 7, 1, "RUNNING", "n02", reason="JobHeldAdmin"))
    backend.poll(T + 3)
    assert backend.grant_starts() == {"count": 2, "median": 3.0, "p95": 3.0, "max": 3.0}


@pytest.mark.parametrize("release", RELEASES)
def test_a_preempted_task_still_completing_is_reclaimed_at_once(slurm: FakeSlurm,
                                                                  backend: SlurmBackend,
                                                                  release: str) -> None:
    """Slurm wakes the daemon (EpilogSlurmctld) at a preemption's requeue, while the task
    still shows COMPLETING, one restart up: that poll names the node lost, not the next one;
    the task is not seen as a worker again while it completes. COMPLETING with no restart
    (the script's own exit) still waits for the end."""
    slurm.captured = GOLDEN / release
    slurm.load("02_running_unheld")
    backend.poll(T)
    slurm.load("03_running")
    assert backend.poll(T + 1) == []
    running = slurm.squeue
    on_n03 = next(line for line in running.splitlines() if "|n03|" in line)
    cols = on_n03.split("|")
    cols[3], cols[6] = "COMPLETING", str(int(cols[6]) + 1)
    slurm.squeue = running.replace(on_n03, "|".join(cols))
    assert backend.poll(T + 2) == [NodesReclaimed(T + 2, ("n03",))]
    assert backend.workers == {"1_0": ("1", "n02")}
    assert backend.poll(T + 3) == []  # still completing: not a worker that started
    slurm.load("04_preempted")
    assert backend.poll(T + 4) == []
    assert backend.workers == {"1_0": ("1", "n02")}

    on_n02 = next(line for line in slurm.squeue.splitlines() if "|n02|" in line)
    cols = on_n02.split("|")
    cols[3] = "COMPLETING"  # its own end: the same restart count
    slurm.squeue = slurm.squeue.replace(on_n02, "|".join(cols))
    assert backend.poll(T + 5) == []
    assert backend.workers == {"1_0": ("1", "n02")}


def test_a_task_preempted_where_it_started_may_go_back_there_at_once(slurm: FakeSlurm) -> None:
    """The settle is for a node our own task just left; a node another job took in between
    is clean by the time it is free (bench/e2e.py's phase 2 waited 2 s more per round)."""
    backend = SlurmBackend(slurm, grant_timeout_s=120, unplanned_wait_s=30)
    slurm.squeue = held_array(7, 1, tag="malletrain:min=1,max=1")
    slurm.sinfo = nodes(n01="idle")
    backend.poll(T)
    backend.execute([Grow("7", ("n01",), None)], T)
    # A prod job is submitted as the task starts: held again (other_submitted), preempted.
    backend.submits_seen = lambda: 1
    assert backend.other_submitted() == 1
    slurm.squeue = task(20, 7, 0, reason="JobHeldAdmin", tag="malletrain:min=1,max=1")
    slurm.sinfo = nodes(n01="allocated")
    assert backend.poll(T + 1) == [NodesReclaimed(T + 1, ("n01",)),
                                   WorkerStopped(T + 1, "7", "n01")]
    slurm.sinfo = nodes(n01="idle")
    assert backend.poll(T + 2) == [NodesIdle(T + 2, (IdleNode("n01"),))]
    slurm.calls.clear()
    assert backend.execute([Grow("7", ("n01",), None)], T + 2.1) == []
    assert slurm.commands()[-1] == ["scontrol", "release", "7_0"]


def test_a_job_whose_every_task_failed_at_once_keeps_them(slurm: FakeSlurm,
                                                         backend: SlurmBackend) -> None:
    """No task left running is not the end while the failures are within the budget (the
    user cancelling some of them is: test_job_end_reasons)."""
    slurm.squeue = held_array(7, 2)
    slurm.sinfo = nodes(n01="idle", n02="idle")
    backend.poll(T)
    backend.execute([Grow("7", ("n01", "n02"), None)], T)
    slurm.squeue = (task(20, 7, 0, "FAILED", "n01", reason="NonZeroExitCode")
                    + task(21, 7, 1, "FAILED", "n02", reason="NonZeroExitCode"))
    slurm.calls.clear()
    ev = backend.poll(T + 1)
    assert not of(ev, JobEnded) and "7" in backend.jobs
    assert ["scontrol", "requeuehold", "7_[0-1]"] in slurm.commands()


def test_a_hung_scontrol_gives_back_every_idle_node_and_waits_for_a_poll(
        slurm: FakeSlurm, backend: SlurmBackend) -> None:
    """After one grow's scontrol timed out, the batch's other grows are not tried (each would
    wait the command timeout again, the daemon's lock held: its API stopped answering in
    tests/slurm/test_faults.py), and every idle node is withdrawn, so the engine, planning
    again at once, does not try the next ones either; the next poll offers them again."""
    slurm.squeue = held_array(7, 3)
    slurm.sinfo = nodes(n01="idle", n02="idle", n03="idle")
    backend.poll(T)
    slurm.hangs.add(("scontrol", "update"))
    slurm.calls.clear()
    ev = backend.execute([Grow("7", ("n01", "n02"), None)], T)
    assert [c[:2] for c in slurm.commands()] == [["scontrol", "update"]]
    assert of(ev, WorkerStopped) == [WorkerStopped(T, "7", "n01"), WorkerStopped(T, "7", "n02")]
    assert {n for e in of(ev, NodesReclaimed) for n in e.nodes} == {"n01", "n02", "n03"}
    assert backend.offered == {}
    slurm.hangs.clear()
    assert of(backend.poll(T + 1), NodesIdle)[0].nodes == (
        IdleNode("n01"), IdleNode("n02"), IdleNode("n03"))
