"""The Slurm backend's client seam: which calls each implementation makes, and the one way a
grow that is not carried out gives its node back.

The commands client is seen through the argv lists a recording runner gets; the pyslurm
clients through a recording pyslurm source (the RPCs themselves are tested on real Slurm in
tests/slurm/test_pyslurm_*.py).
"""

from __future__ import annotations

import logging
import subprocess
from collections.abc import Callable, Sequence

import pytest
from test_slurm_backend import FakeSlurm, T, held_array, nodes

from malletrain_core.backends.slurm import parse as sp
from malletrain_core.backends.slurm.backend import SlurmBackend
from malletrain_core.backends.slurm.client import (
    CommandsClient,
    PyslurmClient,
    PyslurmReadsClient,
    Reading,
    client_for,
)
from malletrain_core.errors import CommandError
from malletrain_core.events import Event, Grow, NodesReclaimed, WorkerStopped
from malletrain_core.runner import CommandRunner

ROW = "20|7|0|RUNNING|n01|60|0|0|alice|None|malletrain:min=1,max=2\n"


class Recording(CommandRunner):
    """Records every argv; answers squeue with one task row, sinfo with one node."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[list[str]] = []

    def _spawn(self, argv: list[str], timeout_s: float,
               input: str | None) -> subprocess.CompletedProcess[str]:
        self.calls.append(list(argv))
        out = {"squeue": "" if "--start" in argv else ROW, "sinfo": "n01|idle\n"}
        return subprocess.CompletedProcess(argv, 0, out.get(argv[0], ""), "")


class NoCommands(CommandRunner):
    def _spawn(self, argv: list[str], timeout_s: float,
               input: str | None) -> subprocess.CompletedProcess[str]:
        raise AssertionError(f"a command was started: {argv}")


class Source:
    """A pyslurm source that records its calls and answers as PyslurmSource does."""

    def __init__(self, acts: bool) -> None:
        self.acts = acts
        self.calls: list[tuple[object, ...]] = []

    def snapshot(self, partition: str) -> dict[str, str]:
        self.calls.append(("snapshot", partition))
        return {"sinfo": "n01|idle\n", "squeue": ROW, "plan": ""}

    def tasks(self, arrays: Sequence[str]) -> str:
        self.calls.append(("tasks", list(arrays)))
        return ROW

    def scontrol(self, verb: str, jobs: str) -> None:
        self.calls.append(("scontrol", verb, jobs))

    def grow(self, key: str, node: str, minutes: int) -> None:
        self.calls.append(("grow", key, node, minutes))

    def cancel(self, arrays: Sequence[str]) -> None:
        self.calls.append(("cancel", list(arrays)))


def exercise(client: CommandsClient) -> tuple[Reading, list[sp.TaskRow]]:
    """Every call of the protocol, once."""
    reading = client.read("preemptable")
    rows = client.tasks(["7", "12"])
    client.scontrol("requeuehold Incomplete", ["7_2", "7_0", "12_1"])
    client.grow("7_1", "n03", 42)
    client.cancel(["7", "12"])
    return reading, rows


def test_the_commands_client_runs_one_command_per_call() -> None:
    runner = Recording()
    client = client_for(runner)
    assert type(client) is CommandsClient
    reading, rows = exercise(client)
    assert runner.calls == [
        ["squeue", "-h", "-t", "PD", "--start", "-o", sp.PLAN_FORMAT],
        ["sinfo", "-h", "-N", "-p", "preemptable", "-o", sp.SINFO_FORMAT],
        ["squeue", "-h", "-r", "-t", "all", "-p", "preemptable", "-O", sp.SQUEUE_FORMAT],
        ["squeue", "-h", "-r", "-t", "all", "-j", "7,12", "-O", sp.SQUEUE_FORMAT],
        ["scontrol", "requeuehold", "Incomplete", "7_[0,2],12_1"],
        ["scontrol", "update", "JobId=7_1", "ReqNodeList=n03", "StartTime=now", "TimeLimit=42"],
        ["scancel", "7", "12"]]
    assert list(reading.nodes) == ["n01"] and [r.key for r in reading.tasks] == ["7_0"]
    assert reading.plan == [] and [r.key for r in rows] == ["7_0"]


def test_the_pyslurm_client_starts_no_command() -> None:
    source = Source(acts=True)
    client = client_for(NoCommands(), source)
    assert type(client) is PyslurmClient
    reading, rows = exercise(client)
    assert source.calls == [("snapshot", "preemptable"), ("tasks", ["7", "12"]),
                            ("scontrol", "requeuehold Incomplete", "7_[0,2],12_1"),
                            ("grow", "7_1", "n03", 42), ("cancel", ["7", "12"])]
    assert list(reading.nodes) == ["n01"] and [r.key for r in rows] == ["7_0"]


def test_a_source_that_only_reads_leaves_the_actions_to_the_commands() -> None:
    source, runner = Source(acts=False), Recording()
    client = client_for(runner, source)
    assert type(client) is PyslurmReadsClient
    exercise(client)
    assert source.calls == [("snapshot", "preemptable"), ("tasks", ["7", "12"])]
    assert [c[:2] for c in runner.calls] == [["scontrol", "requeuehold"],
                                             ["scontrol", "update"], ["scancel", "7"]]


def test_the_backend_uses_the_client_chosen_at_its_start() -> None:
    source = Source(acts=True)
    backend = SlurmBackend(NoCommands(), source=source)
    backend.poll(T)
    assert source.calls[0] == ("snapshot", "preemptable")
    backend.runner = Recording()  # the runner follows into the client
    assert backend.client.runner is backend.runner


# ------------------------------------------------------------------ a grow's give-back
Scenario = Callable[[FakeSlurm, SlurmBackend], list[Event]]


def not_live(slurm: FakeSlurm, backend: SlurmBackend) -> list[Event]:
    return backend.execute([Grow("99", ("n01",), None)], T + 1)


def hole_too_short(slurm: FakeSlurm, backend: SlurmBackend) -> list[Event]:
    return backend.execute([Grow("7", ("n01",), 30.0)], T + 1)


def no_task_left(slurm: FakeSlurm, backend: SlurmBackend) -> list[Event]:
    return backend.execute([Grow("7", ("n01", "n02", "n03"), None)], T + 1)


def refused(slurm: FakeSlurm, backend: SlurmBackend) -> list[Event]:
    slurm.fail(("scontrol", "update"), 1, "scontrol: error: Access/permission denied\n")
    return backend.execute([Grow("7", ("n01",), None)], T + 1)


def timed_out(slurm: FakeSlurm, backend: SlurmBackend) -> list[Event]:
    slurm.hangs.add(("scontrol", "update"))
    return backend.execute([Grow("7", ("n01", "n02"), None)], T + 1)


def release_refused(slurm: FakeSlurm, backend: SlurmBackend) -> list[Event]:
    slurm.fail(("scontrol", "release"), 1, "scontrol: error: Invalid job id specified\n")
    return backend.execute([Grow("7", ("n01", "n02"), None)], T + 1)


SCENARIOS: dict[str, tuple[Scenario, list[Event]]] = {
    "not a live job": (not_live, [WorkerStopped(T + 1, "99", "n01")]),
    "hole under a minute": (hole_too_short, [WorkerStopped(T + 1, "7", "n01")]),
    "no held task left": (no_task_left, [WorkerStopped(T + 1, "7", "n03")]),
    "update refused": (refused, [WorkerStopped(T + 1, "7", "n01")]),
    "update timed out": (timed_out, [
        WorkerStopped(T + 1, "7", "n01"), NodesReclaimed(T + 1, ("n01", "n02", "n03")),
        WorkerStopped(T + 1, "7", "n02"), NodesReclaimed(T + 1, ("n02",))]),
    "release refused": (release_refused, [WorkerStopped(T + 1, "7", "n01"),
                                          WorkerStopped(T + 1, "7", "n02")]),
}


def run(scenario: Scenario, caplog: pytest.LogCaptureFixture) -> tuple[list[Event], list[str]]:
    """The scenario's last execute on a job 7 of two held tasks and three idle nodes: its
    events and the backend's log lines of that call."""
    slurm = FakeSlurm()
    slurm.squeue = held_array(7, 2)
    slurm.sinfo = nodes(n01="idle", n02="idle", n03="idle")
    backend = SlurmBackend(slurm, grant_timeout_s=120, unplanned_wait_s=0)
    backend.poll(T)
    caplog.set_level(logging.DEBUG, logger="malletrain_core.backends.slurm.backend")
    last = backend.execute
    marks: list[int] = []

    def execute(actions: Sequence[object], now: float) -> list[Event]:
        marks.append(len(caplog.records))
        return last(actions, now)  # type: ignore[arg-type]

    backend.execute = execute  # type: ignore[method-assign]
    events = scenario(slurm, backend)
    lines = [r.getMessage() for r in caplog.records[marks[-1]:]
             if r.name == "malletrain_core.backends.slurm.backend"]
    return events, lines


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_every_grow_that_is_not_carried_out_gives_its_node_back_one_way(
        name: str, caplog: pytest.LogCaptureFixture) -> None:
    """WorkerStopped for the job and node (NodesReclaimed after it when the node is withdrawn
    until a later poll), and one line ``grow of job J on N: why`` per node given back."""
    scenario, expected = SCENARIOS[name]
    events, lines = run(scenario, caplog)
    assert events == expected
    given_back = [f"grow of job {e.job_id} on {e.node}: " for e in events
                  if isinstance(e, WorkerStopped)]
    assert [g for g in given_back if not any(line.startswith(g) for line in lines)] == []


def test_a_refused_update_says_what_slurm_said(caplog: pytest.LogCaptureFixture) -> None:
    _, lines = run(refused, caplog)
    assert any(line.startswith("grow of job 7 on n01: ") and "permission denied" in line
               for line in lines)


def test_a_refusal_of_the_client_is_a_command_error() -> None:
    slurm = FakeSlurm()
    slurm.fail(("scontrol", "update"), 1, "scontrol: error: Access/permission denied\n")
    with pytest.raises(CommandError, match="Access/permission denied"):
        CommandsClient(slurm).grow("7_0", "n01", 1)
