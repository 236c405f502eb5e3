"""Parsing of Slurm's output, against golden outputs captured from Slurm 22.05."""

from __future__ import annotations

import logging
import re
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from malletrain_core.backends.slurm import parse as sp
from malletrain_core.backends.states import NodeState, TaskState
from malletrain_core.errors import ValidationError

GOLDEN = Path(__file__).parent / "golden" / "slurm" / "22.05"


def golden(name: str) -> str:
    return (GOLDEN / name).read_text()


def local(stamp: str) -> float:
    return time.mktime(time.strptime(stamp, "%Y-%m-%dT%H:%M:%S"))


# ----------------------------------------------------------------------------- squeue
def test_squeue_submitted_arrays_are_held_tagged_tasks() -> None:
    rows = {r.key: r for r in sp.parse_squeue(golden("01_submitted.squeue"))}
    live = {k: r for k, r in rows.items() if r.state is not TaskState.DONE}
    assert sorted(live) == ["1_0", "1_1", "1_2", "2_0", "2_1"]
    t = live["1_1"]
    assert (t.array_id, t.index, t.state_code, t.nodes, t.user) == ("1", 1, "PENDING", (), "root")
    assert t.held and t.priority == 0 and t.reason == "JobHeldUser"
    assert t.time_limit_s is None  # UNLIMITED
    assert live["2_0"].admin_comment == "malletrain:min=2,max=2,model=resnet50,profile=no"


def test_squeue_running_then_admin_held() -> None:
    before = {r.key: r for r in sp.parse_squeue(golden("02_running_unheld.squeue"))}
    after = {r.key: r for r in sp.parse_squeue(golden("03_running.squeue"))}
    assert before["1_0"].state is TaskState.RUNNING and before["1_0"].nodes == ("n02",)
    assert before["1_0"].job_id == "4" and before["1_0"].time_limit_s == 3600
    assert not before["1_0"].held
    assert after["1_0"].held and after["1_0"].reason == "JobHeldAdmin"
    assert after["1_1"].node == "n03"


def test_squeue_preempted_task_comes_back_held_with_a_restart() -> None:
    rows = {r.key: r for r in sp.parse_squeue(golden("04_preempted.squeue"))}
    t = rows["1_1"]
    assert t.state is TaskState.PENDING and t.held and t.restarts == 1 and t.nodes == ()
    shrunk = {r.key: r for r in sp.parse_squeue(golden("05_shrunk.squeue"))}
    assert shrunk["1_0"].reason == "job requeued in held state" and shrunk["1_0"].held


def test_squeue_skips_garbage_and_keeps_pipes_in_the_comment(
        caplog: pytest.LogCaptureFixture) -> None:
    text = ("garbage line\n"
            "5|5|0|RUNNING|n[01]|1-00:00:00|0|7|bob|None|malletrain:min=1,max=2,model=a|b\n"
            "6|6|N/A|PENDING|(null)|NOT_SET|0|1|bob|Priority|(null)\n")
    with caplog.at_level(logging.WARNING):
        rows = sp.parse_squeue(text)
    assert [r.key for r in rows] == ["5_0", "6"]
    assert rows[0].admin_comment == "malletrain:min=1,max=2,model=a|b"
    assert rows[0].time_limit_s == 86400 and rows[0].nodes == ("n01",)
    assert rows[1].index is None and rows[1].admin_comment == ""
    assert "not understood" in caplog.text
    long = "malletrain:min=1,max=2,model=" + "x" * 300
    (row,) = sp.parse_squeue(f"8|7|0|PENDING||1:00|0|0|bob|JobHeldUser|{long}\n")
    assert row.admin_comment == long


def test_unknown_task_state_maps_to_unknown_and_is_logged_once(
        caplog: pytest.LogCaptureFixture) -> None:
    line = "5|5|0|TELEPORTING||UNLIMITED|0|0|bob|None|malletrain:min=1,max=1\n"
    with caplog.at_level(logging.WARNING):
        rows = sp.parse_squeue(line * 3)
        sp.parse_squeue(line)
    assert all(r.state is TaskState.UNKNOWN for r in rows)
    assert caplog.text.count("TELEPORTING") == 1


# ----------------------------------------------------------------------------- sinfo / plan
def test_sinfo_states_and_usability() -> None:
    nodes = sp.parse_sinfo(golden("06_planned.sinfo"))
    assert {n: r.state for n, r in nodes.items()} == {
        "n01": NodeState.BUSY, "n02": NodeState.PLANNED, "n03": NodeState.BUSY,
        "n04": NodeState.PLANNED}
    assert [n for n, r in nodes.items() if r.usable] == ["n02", "n04"]


@pytest.mark.parametrize("code, usable, completing", [
    ("idle", True, False), ("planned", True, False), ("idle*", False, False),
    ("idle~", False, False), ("idle#", False, False), ("down*", False, False),
    ("drained", False, False), ("completing", False, True), ("mixed", False, False),
    ("allocated+", False, False), ("reserved", False, False),
])
def test_node_flags(code: str, usable: bool, completing: bool) -> None:
    row = sp.parse_sinfo(f"n01|{code}\n")["n01"]
    assert (row.usable, row.completing) == (usable, completing)


def test_sinfo_keeps_first_line_per_node_and_skips_garbage() -> None:
    nodes = sp.parse_sinfo("n01|idle\nn01|allocated\nn[02-03]|idle\nnonsense\n\n")
    assert list(nodes) == ["n01"] and nodes["n01"].state is NodeState.IDLE


def test_plan_and_hole_ends() -> None:
    plan = sp.parse_plan(golden("06_planned.plan"))
    prod = [r for r in plan if r.partition == "prod"]
    assert len(prod) == 1 and prod[0].nodes == ("n01", "n02", "n03", "n04")
    assert prod[0].start == local("2026-11-21T09:21:20")
    mine = [r for r in plan if r.array_id == "1"]
    assert mine and all(r.nodes == () for r in mine)
    assert mine[0].start == local("2026-11-21T08:51:31")  # a requeued task's BeginTime
    ends = sp.hole_ends(plan, exclude={"1", "2"})
    assert ends == {n: local("2026-11-21T09:21:20") for n in ("n01", "n02", "n03", "n04")}


def test_hole_end_is_the_earliest_planned_start() -> None:
    plan = sp.parse_plan("30|30|1800000000|n[01-02]|prod\n31|31|1700000000|n02|prod\n"
                         "32|32|N/A|n03|prod\n33|33|1600000000|n04|preemptable\n")
    ends = sp.hole_ends(plan, exclude={"33"})
    assert ends == {"n01": 1.8e9, "n02": 1.7e9}


# ----------------------------------------------------------------------------- scalars
@pytest.mark.parametrize("text, seconds", [
    ("UNLIMITED", None), ("INFINITE", None), ("NOT_SET", None), ("N/A", None),
    ("1:00", 60.0), ("10:00", 600.0), ("1:00:00", 3600.0), ("2-03:04:05", 183845.0),
    ("30", 1800.0), ("bogus", None), ("1:2:3:4", None),
])
def test_parse_duration(text: str, seconds: float | None) -> None:
    assert sp.parse_duration(text) == seconds


def test_parse_time() -> None:
    assert sp.parse_time("N/A") is None and sp.parse_time("Unknown") is None
    assert sp.parse_time("1700000000") == 1.7e9
    assert sp.parse_time("2026-11-21T09:16:12") == local("2026-11-21T09:16:12")
    assert sp.parse_time("Tomorr 08:00") is None


@pytest.mark.parametrize("seconds, minutes", [(59.9, 0), (60, 1), (3599, 59), (7200.5, 120)])
def test_minutes_within_never_overruns(seconds: float, minutes: int) -> None:
    assert sp.minutes_within(seconds) == minutes


# ----------------------------------------------------------------------------- tag
def test_parse_tag() -> None:
    assert sp.parse_tag("") is None and sp.parse_tag("user comment") is None
    tag = sp.parse_tag("malletrain:min=2,max=8,model=resnet50,profile=no")
    assert tag is not None
    assert (tag.min_nodes, tag.max_nodes, tag.model, tag.profile) == (2, 8, "resnet50", False)
    plain = sp.parse_tag("malletrain:min=1,max=1")
    assert plain is not None and plain.profile and plain.model == ""


@pytest.mark.parametrize("text, problem", [
    ("malletrain:min=3,max=2", "1 <= min <= max"),
    ("malletrain:min=0,max=2", "1 <= min <= max"),
    ("malletrain:max=2", "min= is missing"),
    ("malletrain:min=a,max=2", "whole numbers"),
    ("malletrain:min=1,max=2,oops", "not key=value"),
])
def test_bad_tags_say_what_is_wrong(text: str, problem: str) -> None:
    with pytest.raises(ValidationError, match=problem):
        sp.parse_tag(text)


# ----------------------------------------------------------------------------- scontrol
def test_scontrol_errors_from_a_batched_release() -> None:
    errors = sp.parse_scontrol_errors(golden("07_release_errors.stderr"))
    assert errors == {"1_7-8": "Invalid job id specified"}
    assert sp.expand_task_ids("1_7-8") == ["1_7", "1_8"]
    mixed = sp.parse_scontrol_errors("7_1: No error\n7_5: Invalid job id specified\n")
    assert mixed == {"7_5": "Invalid job id specified"}
    assert sp.parse_scontrol_errors("scontrol: error: Invalid job id\n") == {
        "": "scontrol: error: Invalid job id"}


def test_scontrol_show_job() -> None:
    (rec,) = sp.parse_scontrol_show_job(golden("show_job.txt"))
    assert rec["JobId"] == "4" and rec["ArrayJobId"] == "1" and rec["ArrayTaskId"] == "0"
    assert rec["Reason"] == "job_requeued_in_held_state" and rec["ReqNodeList"] == "n02"
    assert rec["AdminComment"] == "malletrain:min=1,max=3" and rec["NodeList"] == ""
    assert rec["AllocNode:Sid"] == "localhost:3266" and rec["TRES"].startswith("cpu=1,")
    assert sp.parse_scontrol_show_job("Command=/a b/c.sh WorkDir=/x\n") == [
        {"Command": "/a b/c.sh", "WorkDir": "/x"}]


@pytest.mark.parametrize("keys, text", [
    (["9_0", "9_2", "10_1"], "9_[0,2],10_1"),
    (["7_3", "7_1", "7_2", "7_0", "7_9"], "7_[0-3,9]"),
    (["12"], "12"),
])
def test_fold_tasks(keys: list[str], text: str) -> None:
    assert sp.fold_tasks(keys) == text


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.integers(1, 99999), st.sets(st.integers(0, 999), min_size=1,
                                                      max_size=30), min_size=1, max_size=4))
def test_fold_tasks_round_trips(arrays: dict[int, set[int]]) -> None:
    keys = [f"{a}_{i}" for a, idxs in arrays.items() for i in idxs]
    folded = sp.fold_tasks(keys)
    pieces = re.findall(r"\d+_\[[^\]]*\]|\d+_\d+", folded)
    assert ",".join(pieces) == folded
    expanded = [k for piece in pieces for k in sp.expand_task_ids(piece)]
    assert sorted(expanded) == sorted(keys)
