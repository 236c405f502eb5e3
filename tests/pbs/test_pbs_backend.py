"""The PBS backend on golden ``pbsnodes``/``qstat`` JSON, commands recorded at the boundary."""

from __future__ import annotations

import json
import logging
import subprocess

import pytest
from pbs_testlib import GOLDEN

from malletrain_core.backends.base import Backend
from malletrain_core.backends.pbs import parse as pp
from malletrain_core.backends.pbs.backend import PbsBackend
from malletrain_core.backends.states import NodeState, TaskState
from malletrain_core.errors import CommandError, CommandNotFound, ConfigError
from malletrain_core.events import (
    Checkpoint,
    EndReason,
    Finish,
    Grow,
    IdleNode,
    JobEnded,
    JobRequest,
    JobSubmitted,
    NodesIdle,
    NodesReclaimed,
    Shrink,
    WorkerStarted,
    WorkerStopped,
)
from malletrain_core.runner import CommandRunner

A, B = "123[].pbs-server", "124[].pbs-server"


class RecordingRunner(CommandRunner):
    """Replaces the subprocess: answers per command from golden files, records every argv."""

    def __init__(self) -> None:
        super().__init__()
        self.argv: list[list[str]] = []
        self.answers: dict[str, tuple[int, str, str]] = {}
        self.hang: set[str] = set()

    def set(self, command: str, stdout: str = "", rc: int = 0, stderr: str = "") -> None:
        self.answers[command] = (rc, stdout, stderr)

    def golden(self, pbsnodes: str, qstat: str) -> None:
        self.set("pbsnodes", (GOLDEN / pbsnodes).read_text())
        self.set("qstat", (GOLDEN / qstat).read_text())

    def _spawn(self, argv, timeout_s, input):  # noqa: A002 - the parent's signature
        self.argv.append(list(argv))
        if argv[0] in self.hang:
            raise subprocess.TimeoutExpired(argv, timeout_s)
        if argv[0] not in self.answers and argv[0] not in ("qrun", "qrerun", "qdel"):
            raise FileNotFoundError(argv[0])
        rc, out, err = self.answers.get(argv[0], (0, "", ""))
        return subprocess.CompletedProcess(argv, rc, out, err)


@pytest.fixture
def runner() -> RecordingRunner:
    return RecordingRunner()


def test_pbs_backend_is_a_backend(runner):
    backend: Backend = PbsBackend(runner)
    assert backend.name == "pbs"
    # the [pbs] section's checks, written once in PbsOptions
    with pytest.raises(ConfigError, match="pbs.grant_timeout_s: 0 must be a finite number of "
                       "seconds > 0"):
        PbsBackend(runner, grant_timeout_s=0)
    with pytest.raises(ConfigError, match="pbs.queue is empty"):
        PbsBackend(runner, queue=" ")


def scenario(runner: RecordingRunner) -> list[list]:
    """Four polls and the actions between them; returns the events of each step."""
    be = PbsBackend(runner, group_resource="switch")
    steps = []
    runner.golden("pbsnodes_1.json", "qstat_1.json")
    steps.append(be.poll(1000.0))
    steps.append(be.execute([Shrink(A, ("n02",)), Grow(B, ("n04", "n05")), Checkpoint(A)],
                            1001.0))
    runner.golden("pbsnodes_2.json", "qstat_2.json")
    steps.append(be.poll(1010.0))
    runner.golden("pbsnodes_2.json", "qstat_3.json")
    steps.append(be.poll(1200.0))
    runner.golden("pbsnodes_2.json", "qstat_4.json")
    steps.append(be.poll(1300.0))
    steps.append(be.execute([Finish(B)], 1301.0))
    steps.append(be.poll(1310.0))
    return steps


def test_scenario_events(runner, caplog):
    with caplog.at_level(logging.WARNING):
        first, grow, second, third, fourth, finish, fifth = scenario(runner)
    bert = JobRequest(B, 1, 4, owner="bob", model="bert", profile=False)
    assert first == [
        JobSubmitted(1000.0, JobRequest(A, 2, 8, owner="alice")),
        JobSubmitted(1000.0, bert),
        NodesIdle(1000.0, (IdleNode("n01", None, "s1"), IdleNode("n02", None, "s1"),
                           IdleNode("n04", None, "s2"), IdleNode("n05", None, "s2"))),
        WorkerStarted(1000.0, A, "n01"), WorkerStarted(1000.0, A, "n02")]
    assert "125[].pbs-server ignored: MALLETRAIN_MIN_NODES=9" in caplog.text
    assert grow == []
    # n01: 123[1] was requeued by a preempting job; n02: our own shrink; n03 fell free.
    assert second == [NodesReclaimed(1010.0, ("n01",)), WorkerStopped(1010.0, A, "n02"),
                      NodesIdle(1010.0, (IdleNode("n03", None, "s1"),)),
                      WorkerStarted(1010.0, B, "n04")]
    # 123[] was deleted by its owner; 124[1] never started on n05 within the grow timeout.
    assert third == [WorkerStopped(1200.0, B, "n05"), JobEnded(1200.0, A, EndReason.CANCELLED)]
    assert fourth == [JobEnded(1300.0, B, EndReason.COMPLETED)]
    assert finish == [] and fifth == []


def test_scenario_commands_match_the_golden_argv(runner):
    scenario(runner)
    golden = [json.loads(line) for line in (GOLDEN / "backend_argv.jsonl").read_text().splitlines()]
    assert runner.argv == golden


def pbsnodes_with(change: dict[str, dict]) -> str:
    """The golden ``pbsnodes_1.json`` with some vnodes' attributes replaced."""
    doc = json.loads((GOLDEN / "pbsnodes_1.json").read_text())
    for name, attrs in change.items():
        doc["nodes"][name].update(attrs)
    return json.dumps(doc)


def qstat_with(change: dict[str, dict]) -> str:
    """The golden ``qstat_1.json`` with some jobs' attributes replaced."""
    doc = json.loads((GOLDEN / "qstat_1.json").read_text())
    for jid, attrs in change.items():
        doc["Jobs"][jid].update(attrs)
    return json.dumps(doc)


FREE = {"state": "free", "jobs": [], "resv": ""}


def test_grow_without_a_queued_subjob_fails_at_once(runner):
    be = PbsBackend(runner)
    runner.golden("pbsnodes_1.json", "qstat_1.json")
    be.poll(1000.0)
    runner.set("pbsnodes", pbsnodes_with({n: FREE for n in ("n06", "n07", "n08")}))
    events = be.execute([Grow(B, ("n04", "n05", "n06", "n07", "n08"))], 1001.0)
    assert events == [WorkerStopped(1001.0, B, "n08")]  # 124[] has four subjobs
    assert be.execute([Grow("999[].pbs-server", ("n08",))], 1001.0) == [
        WorkerStopped(1001.0, "999[].pbs-server", "n08")]


def test_grow_onto_a_vnode_taken_since_the_poll_is_not_started(runner, caplog):
    """qrun -H skips PBS's resource check: a vnode PBS gave to another job after the poll the
    engine decided on is read again before the qrun, and given back instead of shared."""
    be = PbsBackend(runner)
    runner.golden("pbsnodes_1.json", "qstat_1.json")
    be.poll(1000.0)
    runner.set("pbsnodes", pbsnodes_with(
        {"n04": {"state": "job-exclusive", "jobs": ["300.pbs-server/0"]}}))
    runner.argv.clear()
    with caplog.at_level(logging.INFO):
        events = be.execute([Grow(B, ("n04", "n05"))], 1001.0)
    assert events == [WorkerStopped(1001.0, B, "n04"), NodesReclaimed(1001.0, ("n04",))]
    assert runner.argv == [["pbsnodes", "-a", "-F", "json"],
                           ["qrun", "-a", "-H", "(n05)", "124[0].pbs-server"]]
    assert "n04: not started, PBS has taken the vnode" in caplog.text
    assert be.launching == {"124[0].pbs-server": "n05"}
    assert "n04" not in be.offered
    # pbsnodes not answering: the grow goes ahead on the poll's view.
    runner.set("pbsnodes", "", rc=1, stderr="pbsnodes: cannot connect to server")
    runner.argv.clear()
    assert be.execute([Grow(B, ("n04",))], 1002.0) == []
    assert runner.argv[-1] == ["qrun", "-a", "-H", "(n04)", "124[1].pbs-server"]
    # No grow, no pbsnodes.
    runner.argv.clear()
    be.execute([Checkpoint(A)], 1003.0)
    assert runner.argv == []


def test_grow_onto_the_vnode_of_our_own_worker_being_stopped_goes_ahead(runner, caplog):
    """Shrink and grow on one vnode in one cycle: the leaving worker is ours, not another
    job's, so the qrun is sent (PBS starts it once the vnode is free); a down vnode is not."""
    be = PbsBackend(runner)
    runner.golden("pbsnodes_1.json", "qstat_1.json")
    be.poll(1000.0)
    runner.argv.clear()
    with caplog.at_level(logging.INFO):
        events = be.execute([Shrink(A, ("n02",)), Grow(B, ("n02", "n06"))], 1001.0)
    assert runner.argv == [["qrerun", "123[2].pbs-server"], ["pbsnodes", "-a", "-F", "json"],
                           ["qrun", "-a", "-H", "(n02)", "124[0].pbs-server"]]
    assert events == [WorkerStopped(1001.0, B, "n06")]  # n06 was never offered: no reclaim
    assert "n06: not started, PBS has taken the vnode since the last poll (state down,offline)" \
        in caplog.text


def test_worker_sharing_a_vnode_with_another_job_is_requeued(runner, caplog):
    """A grant that raced a job PBS started on the vnode: ours gives the vnode up."""
    be = PbsBackend(runner)
    runner.golden("pbsnodes_1.json", "qstat_1.json")
    assert WorkerStarted(1000.0, A, "n01") in be.poll(1000.0)
    runner.set("pbsnodes", pbsnodes_with(
        {"n01": {"jobs": ["123[1].pbs-server/0", "300.pbs-server/0"]}}))
    runner.argv.clear()
    with caplog.at_level(logging.WARNING):
        events = be.poll(1010.0)
    assert ["qrerun", "123[1].pbs-server"] in runner.argv
    assert "vnode n01 runs 300.pbs-server and our subjob 123[1].pbs-server" in caplog.text
    assert events == [NodesReclaimed(1010.0, ("n01",))]
    assert "123[1].pbs-server" not in be.workers and be.busy()
    # Still running there at the next poll (SIGTERM, then kill_delay): no second qrerun, and
    # not taken for a new worker.
    runner.argv.clear()
    assert be.poll(1011.0) == []
    assert ["qrerun", "123[1].pbs-server"] not in runner.argv
    # Requeued: the clash is over; n01 comes back when PBS frees it.
    runner.set("qstat", qstat_with({"123[1].pbs-server": {"job_state": "Q"}}))
    runner.set("pbsnodes", pbsnodes_with({"n01": {"jobs": ["300.pbs-server/0"]}}))
    assert be.poll(1012.0) == [] and not be.busy()
    runner.set("pbsnodes", pbsnodes_with({"n01": FREE}))
    assert be.poll(1013.0) == [NodesIdle(1013.0, (IdleNode("n01", None, None),))]


def test_refused_qrun_is_a_failed_grow(runner):
    be = PbsBackend(runner)
    runner.golden("pbsnodes_1.json", "qstat_1.json")
    be.poll(1000.0)
    runner.set("qrun", rc=1, stderr="qrun: Request invalid for state of job 124[0].pbs-server")
    assert be.execute([Grow(B, ("n04",))], 1001.0) == [WorkerStopped(1001.0, B, "n04")]


def test_finish_of_a_job_pbs_already_dropped_is_quiet(runner, caplog):
    be = PbsBackend(runner)
    runner.golden("pbsnodes_1.json", "qstat_1.json")
    be.poll(1000.0)
    runner.set("qdel", rc=35, stderr="qdel: Unknown Job Id 124[].pbs-server")
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        be.execute([Finish(B)], 1001.0)
    assert caplog.text == "" and B not in be.jobs


def test_shrink_of_a_worker_still_launching(runner):
    be = PbsBackend(runner)
    runner.golden("pbsnodes_1.json", "qstat_1.json")
    be.poll(1000.0)
    assert be.execute([Grow(B, ("n04",))], 1001.0) == []
    assert be.execute([Shrink(B, ("n04",))], 1002.0) == [WorkerStopped(1002.0, B, "n04")]
    runner.golden("pbsnodes_2.json", "qstat_2.json")
    events = be.poll(1010.0)
    # It started after all: requeued at once, never reported, its vnode neither new nor lost.
    assert ["qrerun", "124[0].pbs-server"] in runner.argv
    assert not [e for e in events if getattr(e, "job_id", None) == B]
    assert not any("n04" in getattr(e, "nodes", ()) for e in events)
    assert "n04" in be.offered


def test_a_refused_shrink_reports_the_worker_still_there(runner):
    be = PbsBackend(runner)
    runner.golden("pbsnodes_1.json", "qstat_1.json")
    be.poll(1000.0)
    runner.set("qrerun", rc=1, stderr="qrerun: Job is not rerunable 123[2].pbs-server")
    assert be.execute([Shrink(A, ("n02",))], 1001.0) == [WorkerStarted(1001.0, A, "n02")]


def test_a_qdel_without_answer_is_tried_again_at_the_next_poll(runner):
    be = PbsBackend(runner)
    runner.golden("pbsnodes_1.json", "qstat_1.json")
    be.poll(1000.0)
    runner.hang.add("qdel")
    be.execute([Finish(A)], 1001.0)
    runner.hang.clear()
    be.poll(1010.0)
    assert runner.argv.count(["qdel", A]) == 2
    be.poll(1020.0)
    assert runner.argv.count(["qdel", A]) == 2


def test_missing_commands_are_not_hidden(runner):
    with pytest.raises(CommandNotFound, match="pbsnodes: not found"):
        PbsBackend(runner).poll(0.0)


def test_no_jobs_at_all(runner):
    runner.golden("pbsnodes_2.json", "qstat_empty.json")
    events = PbsBackend(runner).poll(5.0)
    assert events == [NodesIdle(5.0, tuple(IdleNode(n) for n in ("n02", "n03", "n05")))]


# ---- parsing: the golden files and malformed output ----------------------------------------

def test_parse_pbsnodes_golden():
    nodes = pp.parse_pbsnodes((GOLDEN / "pbsnodes_1.json").read_text())
    assert nodes["n06"].state is NodeState.DOWN and nodes["n06"].words == ("down", "offline")
    assert nodes["n01"].state is NodeState.BUSY and nodes["n01"].jobs == ("123[1].pbs-server",)
    assert nodes["n04"].usable("mt_preemptable")
    assert not nodes["n07"].usable("mt_preemptable")  # free but sharing a job
    assert not nodes["n08"].usable("mt_preemptable")  # reservation


def test_parse_qstat_golden():
    jobs = pp.parse_qstat((GOLDEN / "qstat_1.json").read_text())
    arr, sub = jobs[A], jobs["123[1].pbs-server"]
    assert arr.is_array and arr.indices == "1-8" and arr.state is TaskState.RUNNING
    assert arr.env["MALLETRAIN_MIN_NODES"] == "2" and arr.owner == "alice"
    assert (sub.array_id, sub.index, sub.node, sub.state) == (A, 1, "n01", TaskState.RUNNING)
    assert jobs["123[3].pbs-server"].state is TaskState.PENDING


def test_known_pbs_json_bugs_are_repaired(caplog):
    with caplog.at_level(logging.WARNING):
        jobs = pp.parse_qstat((GOLDEN / "qstat_pbs_json_bugs.json").read_text())
    env = jobs[B].env
    assert env["MYVAR"] == "it's a,b" and env["RUN_ID"] == "005"
    assert "repaired malformed JSON" in caplog.text


@pytest.mark.parametrize("text, fragment", [
    ("", "empty output"),
    ("pbsnodes: Server has no node list\n", "not JSON (Expecting value at line 1 column 1)"),
    ('{"timestamp": 1, "nodes": {"n1": {"state": "free"', "not JSON"),
    ("[1, 2]", "a JSON object expected, got list"),
    ('{"nodes": ["n1"]}', "'nodes' is a list, not an object"),
])
def test_malformed_pbsnodes_is_a_command_error(text, fragment):
    with pytest.raises(CommandError) as err:
        pp.parse_pbsnodes(text, ["pbsnodes", "-a", "-F", "json"])
    msg = str(err.value)
    assert fragment in msg and msg.startswith("command pbsnodes -a -F ... failed")
    assert "\n" not in msg and "run it by hand" in msg


def test_odd_entries_are_skipped_not_fatal(caplog):
    text = json.dumps({"nodes": {"n1": "free", "n2": {"state": 3}, "n3": {"state": "free"}}})
    with caplog.at_level(logging.WARNING):
        nodes = pp.parse_pbsnodes(text)
    assert list(nodes) == ["n3"] and "'n1' has no readable state" in caplog.text
    jobs = pp.parse_qstat(json.dumps({"Jobs": {"1.s": {"job_state": None}, "2.s": {
        "job_state": "R", "exec_vnode": "(a:ncpus=1)+(b:ncpus=1)"}}}))
    assert list(jobs) == ["2.s"] and jobs["2.s"].nodes == ("a", "b")


def test_a_failing_qstat_says_why(runner):
    runner.set("pbsnodes", (GOLDEN / "pbsnodes_1.json").read_text())
    runner.set("qstat", rc=170, stderr="qstat: Unknown queue mt_preemptable\n")
    with pytest.raises(CommandError, match="Unknown queue mt_preemptable"):
        PbsBackend(runner).poll(0.0)


@pytest.mark.parametrize("words, state", [
    (("free",), NodeState.IDLE), (("job-busy",), NodeState.BUSY),
    (("down", "offline"), NodeState.DOWN), (("job-exclusive", "offline"), NodeState.DOWN),
    (("resv-exclusive",), NodeState.BUSY), (("sleep",), NodeState.DOWN),
    (("brand-new-state",), NodeState.UNKNOWN), ((), NodeState.UNKNOWN),
])
def test_node_state_table(words, state):
    assert pp.pbs_node_state(words) is state


def test_job_state_table():
    assert [pp.pbs_task_state(c) for c in "QHRBEXF"] == [
        TaskState.PENDING, TaskState.HELD, TaskState.RUNNING, TaskState.RUNNING,
        TaskState.ENDING, TaskState.DONE, TaskState.DONE]
    assert pp.pbs_task_state("Z") is TaskState.UNKNOWN


def test_array_ranges():
    assert [pp.array_size(s) for s in ("1-32", "0-15:1", "1-10:3", "5-1", "x", "")] == \
        [32, 16, 4, 0, 0, 0]


def test_a_subjob_pbs_requeued_at_its_start_is_a_failed_grant_at_once(runner, caplog):
    """qrun'd, started (run_count 0 → 1) and back in the queue on a vnode still free: the
    grant failed (a mom that refused it, a prologue that failed); it comes back at the next
    poll instead of at the grant timeout, with one line, and the vnode stays offered."""
    be = PbsBackend(runner)
    runner.golden("pbsnodes_1.json", "qstat_1.json")
    be.poll(1000.0)
    runner.set("pbsnodes", pbsnodes_with({"n04": FREE}))
    assert be.execute([Grow(A, ("n04",))], 1001.0) == []
    assert be.launching == {"123[3].pbs-server": "n04"}
    runner.set("qstat", qstat_with({"123[3].pbs-server": {"run_count": 1}}))
    with caplog.at_level(logging.WARNING):
        events = be.poll(1002.0)
    assert events == [WorkerStopped(1002.0, A, "n04")]
    assert "subjob 123[3].pbs-server started and PBS requeued it (run_count 0 → 1)" \
        in caplog.text
    assert be.launching == {} and "n04" in be.offered


def test_a_subjob_is_not_started_again_on_the_vnode_it_just_left(runner, caplog):
    """Shrunk off n01 and grown back there within a second: another queued subjob is
    started; a job with no other subjob left gives the vnode back for a few seconds."""
    be = PbsBackend(runner)
    runner.golden("pbsnodes_1.json", "qstat_1.json")
    be.poll(1000.0)
    assert be.execute([Shrink(A, ("n01",))], 1001.0) == []
    runner.set("qstat", qstat_with({"123[1].pbs-server": {"job_state": "Q", "run_count": 1}}))
    runner.set("pbsnodes", pbsnodes_with({"n01": FREE}))
    be.poll(1001.5)
    runner.argv.clear()
    assert be.execute([Grow(A, ("n01",))], 1002.0) == []
    assert runner.argv[-1] == ["qrun", "-a", "-H", "(n01)", "123[3].pbs-server"]
    one = PbsBackend(runner)
    one._subjobs = {k: v for k, v in be._subjobs.items()}
    one._jobs = dict(be._jobs)
    one._left = {"123[1].pbs-server": ("n05", 1002.0)}
    free = ["123[1].pbs-server"]
    assert one._pick(free, "n05", 1003.0) is None and free == ["123[1].pbs-server"]
    assert one._pick(free, "n05", 1005.5) == "123[1].pbs-server"


def test_a_vnode_granted_again_while_the_shrunk_subjob_leaves_it(runner):
    """Shrunk off n01 and granted n01 again before PBS is done with the shrunk subjob: the
    engine's next order for n01 is about the subjob granted there since, and the shrunk one's
    leaving is not reported as the loss of the new one (the engine would grant the vnode a
    third time, to a subjob that could never start there)."""
    be = PbsBackend(runner)
    runner.golden("pbsnodes_1.json", "qstat_1.json")
    be.poll(1000.0)
    assert be.execute([Shrink(A, ("n01",))], 1001.0) == []
    assert be.execute([Grow(A, ("n01",))], 1001.0) == []
    assert be.launching == {"123[3].pbs-server": "n01"}
    runner.argv.clear()
    assert be.execute([Shrink(A, ("n01",))], 1001.5) == [WorkerStopped(1001.5, A, "n01")]
    assert runner.argv == [] and be.launching == {}
    assert be.execute([Grow(A, ("n01",))], 1002.0) == []  # 123[3] is unwanted until it runs
    runner.set("qstat", qstat_with({
        "123[1].pbs-server": {"job_state": "Q", "exec_vnode": None, "exec_host": None},
        "123[4].pbs-server": {"job_state": "R", "exec_vnode": "(n01:ncpus=64:ngpus=4)",
                              "exec_host": "n01/0*64", "run_count": 1}}))
    events = be.poll(1003.0)
    assert WorkerStarted(1003.0, A, "n01") in events
    assert WorkerStopped(1003.0, A, "n01") not in events


def test_a_worker_pbs_is_requeuing_is_reclaimed_at_once(runner):
    """A worker's subjob shown active in a rerun substate (60-63: PBS requeuing it after a
    preemption; E/60 on the local complex at the jobobit hook, Q 0.9 s later) is taken as
    preempted at that poll, and not as started again while it still shows E. A worker the
    daemon itself shrank (qrerun) is waited for until it leaves, as before."""
    be = PbsBackend(runner)
    runner.golden("pbsnodes_1.json", "qstat_1.json")
    be.poll(1000.0)
    assert be.execute([Shrink(A, ("n02",))], 1000.5) == []
    rerun = {"job_state": "E", "substate": 60}
    runner.set("qstat", qstat_with({"123[1].pbs-server": rerun, "123[2].pbs-server": rerun}))
    assert be.poll(1001.0) == [NodesReclaimed(1001.0, ("n01",))]
    rerun = {"job_state": "E", "substate": 63}
    runner.set("qstat", qstat_with({"123[1].pbs-server": rerun, "123[2].pbs-server": rerun}))
    assert be.poll(1001.5) == []
    queued = {"job_state": "Q", "substate": 10, "exec_vnode": None, "exec_host": None,
              "run_count": 1}
    runner.set("qstat", qstat_with({"123[1].pbs-server": queued, "123[2].pbs-server": queued}))
    assert be.poll(1002.0) == [WorkerStopped(1002.0, A, "n02")]


def test_a_rerun_substate_is_read():
    jobs = pp.parse_qstat(qstat_with({"123[1].pbs-server": {"job_state": "E", "substate": 61}}))
    assert jobs["123[1].pbs-server"].substate == 61
    assert jobs["123[3].pbs-server"].substate == 10
