"""The parsers on every Slurm release's output: the poll's three queries captured step by step
on each release's local cluster (tests/golden/slurm/<release>/, capture.py), and the same four
jobs' ``scontrol show job -o`` on 22.05 to 26.05 (tests/golden/slurm/reference/)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from malletrain_core.backends.slurm import parse as sp
from malletrain_core.backends.slurm.release import SlurmRelease
from malletrain_core.backends.states import NodeState, TaskState
from malletrain_core.hostlist import expand

GOLDEN = Path(__file__).parent / "golden" / "slurm"
CAPTURED = sorted(p.name for p in GOLDEN.iterdir() if p.is_dir() and p.name[:1].isdigit())
REFERENCE = sorted(p.name for p in (GOLDEN / "reference").iterdir() if p.is_dir())
STEPS = sorted({p.stem for p in (GOLDEN / "22.05").glob("*.squeue")})


def test_every_release_of_the_matrix_was_captured() -> None:
    assert {"22.05", "24.11", "25.11"} <= set(CAPTURED)
    for release in CAPTURED:
        assert sorted({p.stem for p in (GOLDEN / release).glob("*.squeue")}) == STEPS, release


@pytest.fixture(params=CAPTURED)
def release(request: pytest.FixtureRequest) -> Path:
    return GOLDEN / request.param


def rows(release: Path, step: str) -> dict[str, sp.TaskRow]:
    return {r.key: r for r in sp.parse_squeue((release / f"{step}.squeue").read_text())}


@pytest.mark.parametrize("step", STEPS)
def test_every_line_of_every_step_is_understood(release: Path, step: str,
                                                caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        texts = {s: (release / f"{step}.{s}").read_text() for s in ("squeue", "sinfo", "plan")}
        tasks = sp.parse_squeue(texts["squeue"])
        nodes = sp.parse_sinfo(texts["sinfo"])
        plan = sp.parse_plan(texts["plan"])
    assert not caplog.records, [r.getMessage() for r in caplog.records]
    assert len(tasks) == len(texts["squeue"].splitlines())
    assert len(plan) == len(texts["plan"].splitlines())
    assert sorted(nodes) == ["n01", "n02", "n03", "n04"]
    assert all(r.state is not TaskState.UNKNOWN for r in tasks)
    assert all(n.state is not NodeState.UNKNOWN for n in nodes.values())


def test_one_elastic_job_s_life_reads_the_same(release: Path) -> None:
    sub = rows(release, "01_submitted")
    assert sorted(k for k, r in sub.items() if r.index is not None) == [
        "1_0", "1_1", "1_2", "2_0", "2_1"]
    assert all(sub[k].held and sub[k].reason == "JobHeldUser" for k in ("1_0", "2_1"))
    assert sub["2_0"].admin_comment == "malletrain:min=2,max=2,model=resnet50,profile=no"
    running = rows(release, "02_running_unheld")
    assert running["1_0"].state is TaskState.RUNNING and running["1_0"].node == "n02"
    assert not running["1_0"].held and running["1_0"].time_limit_s == 3600
    held = rows(release, "03_running")["1_0"]
    assert held.state is TaskState.RUNNING and held.held and held.reason == "JobHeldAdmin"
    preempted = rows(release, "04_preempted")["1_1"]
    assert preempted.state is TaskState.PENDING and preempted.held
    assert preempted.restarts == 1 and preempted.nodes == ()
    shrunk = rows(release, "05_shrunk")["1_0"]
    assert shrunk.held and shrunk.state is TaskState.PENDING
    timed_out = rows(release, "09_timeout")["1_2"]
    assert timed_out.state is TaskState.DONE and timed_out.state_code == "TIMEOUT"
    requeued = rows(release, "10_timeout_requeued")["1_2"]
    assert requeued.state is TaskState.PENDING and requeued.held
    cancelled = rows(release, "11_cancelled")
    assert {r.state_code for k, r in cancelled.items() if k.startswith("1_")} == {"CANCELLED"}


def test_the_backfill_plan_names_the_holes(release: Path) -> None:
    nodes = sp.parse_sinfo((release / "06_planned.sinfo").read_text())
    planned = {n for n, r in nodes.items() if r.state is NodeState.PLANNED}
    assert planned and all(nodes[n].usable for n in planned)
    plan = sp.parse_plan((release / "06_planned.plan").read_text())
    (prod,) = [r for r in plan if r.partition == "prod"]
    assert prod.nodes == ("n01", "n02", "n03", "n04") and prod.start is not None
    assert sp.hole_ends(plan, exclude={"1", "2"}) == dict.fromkeys(prod.nodes, prod.start)


def test_a_batched_release_reports_the_bad_tasks(release: Path) -> None:
    errors = sp.parse_scontrol_errors((release / "07_release_errors.stderr").read_text())
    assert [sp.expand_task_ids(k) for k in errors] == [["1_7", "1_8"]]
    assert "Invalid job id" in next(iter(errors.values()))


def test_show_job_of_a_requeue_held_task(release: Path) -> None:
    (rec,) = sp.parse_scontrol_show_job((release / "show_job.txt").read_text())
    assert (rec["JobId"], rec["ArrayJobId"], rec["ArrayTaskId"]) == ("4", "1", "0")
    assert rec["Reason"] == "job_requeued_in_held_state" and rec["Restarts"] == "1"
    assert rec["AdminComment"] == "malletrain:min=1,max=3" and rec["ReqNodeList"] == "n02"
    tres = rec.get("TRES") or rec["ReqTRES"]  # 24.11 split TRES into ReqTRES and AllocTRES
    assert tres.startswith("cpu=1,")
    assert rec["NumNodes"] in ("1", "1-1")  # 24.11 prints a held job's range


# ----------------------------------------------------------------------------- JSON forms
JSON_CAPTURED = [r for r in CAPTURED if (GOLDEN / r / "show_job.json").is_file()]


def _number(value: object) -> object:
    """data_parser's ``{"set", "infinite", "number"}`` → the number (None: unset, infinite)."""
    if isinstance(value, dict):
        return value["number"] if value["set"] and not value["infinite"] else None
    return value


@pytest.mark.parametrize("name", JSON_CAPTURED)
def test_the_json_forms_say_what_the_text_forms_say(name: str) -> None:
    """``squeue --json`` and ``scontrol show job --json`` (24.11 on), captured at the same
    moments as the text forms the backend reads: every field the backend reads from the text
    has the same value in the JSON (the JSON forms stay usable should the backend switch)."""
    folder = GOLDEN / name
    data = json.loads((folder / "06_planned.squeue.json").read_text())
    assert data["meta"]["slurm"]["version"]["major"] in (name.split(".")[0], int(name[:2]))
    by_task: dict[tuple[str, int | None], dict] = {}
    for j in data["jobs"]:  # squeue --json ignores -r: an array's pending tasks are one record
        aid = str(_number(j["array_job_id"]) or j["job_id"])
        if j["array_task_string"]:
            for key in sp.expand_task_ids(f"{aid}_[{j['array_task_string']}]"):
                by_task[(aid, int(key.split("_")[1]))] = j
        else:
            by_task[(aid, _number(j["array_task_id"]) if _number(j["array_job_id"]) else None)] = j
    text_rows = sp.parse_squeue((folder / "06_planned.squeue").read_text())
    assert sorted(by_task, key=str) == sorted(((r.array_id, r.index) for r in text_rows), key=str)
    for row in text_rows:
        j = by_task[(row.array_id, row.index)]
        assert (j["job_state"][0], j["restart_cnt"], j["user_name"], j["admin_comment"]) == (
            row.state_code, row.restarts, row.user, row.admin_comment)
        if not j["array_task_string"]:
            assert str(j["job_id"]) == row.job_id
        limit = _number(j["time_limit"])
        assert (None if limit is None else 60 * limit) == row.time_limit_s
        assert tuple(expand(j["nodes"]) if j["nodes"] else ()) == row.nodes
        # the text prints the reason's description where there is one
        assert row.reason in (j["state_reason"], j["state_description"])
    (rec,) = sp.parse_scontrol_show_job((folder / "show_job.txt").read_text())
    # ``scontrol show job --json A_0`` prints the whole array: the task is one of its records
    (job,) = [j for j in json.loads((folder / "show_job.json").read_text())["jobs"]
              if str(_number(j["array_task_id"])) == rec["ArrayTaskId"]
              and not j["array_task_string"]]
    assert (str(job["job_id"]), str(_number(job["array_job_id"])),
            str(_number(job["array_task_id"])), str(job["restart_cnt"]),
            job["admin_comment"], job["required_nodes"]) == (
        rec["JobId"], rec["ArrayJobId"], rec["ArrayTaskId"], rec["Restarts"],
        rec["AdminComment"], rec["ReqNodeList"])
    assert rec["Reason"] in (job["state_reason"], job["state_description"].replace(" ", "_"))
    if SlurmRelease.parse(name) >= SlurmRelease(26, 5):
        # 26.05: every job carries its SLUID (the text forms do not print it)
        assert job["step_id"]["sluid"].startswith("s") and job["step_id"]["step_id"] == "entire"


# ----------------------------------------------------------------------------- reference
@pytest.mark.parametrize("name", REFERENCE)
def test_show_job_on_every_release(name: str) -> None:
    """Four jobs (running on 4 nodes, pending, pending in another partition, held)."""
    folder = GOLDEN / "reference" / name
    rel = SlurmRelease.parse((folder / "version.txt").read_text())
    assert rel.series == name
    recs = sp.parse_scontrol_show_job((folder / "scontrol_show_job_o.txt").read_text())
    ids = [line.split()[-1] for line in (folder / "submit.txt").read_text().splitlines()]
    assert [r["JobId"] for r in recs] == ids
    fill, pending, other, held = recs
    assert [r["JobName"] for r in recs] == ["fill", "pend_debug", "pend_other", "held"]
    assert fill["JobState"] == "RUNNING" and fill["NodeList"] == "n[1-4]"
    assert pending["Reason"] == "Resources" and other["Partition"] == "other"
    assert held["Reason"] == "JobHeldUser" and held["Priority"] == "0"
    assert held["NumNodes"] == ("1-1" if rel >= SlurmRelease(24, 11) else "1")
    assert held["StdOut"] == f"/home/user/slurm-{held['JobId']}.out"
    assert held["WorkDir"] == "/home/user"
    if rel.submit_line:
        assert fill["SubmitLine"] == "sbatch -N4 --exclusive -t 5 -J fill --wrap sleep 120"
        assert held["SubmitLine"] == "sbatch -H -t 5 -J held --wrap sleep 10"
    else:
        assert "SubmitLine" not in fill


def test_a_submit_line_with_key_value_words_stays_one_value() -> None:
    line = ("JobId=9 JobName=x Comment=a b=c SubmitLine=sbatch --wrap 'X=1 Y=2 run' "
            "--comment=model=m WorkDir=/w StdErr= StdIn=/dev/null StdOut=/w/o\n")
    (rec,) = sp.parse_scontrol_show_job(line)
    assert rec["SubmitLine"] == "sbatch --wrap 'X=1 Y=2 run' --comment=model=m"
    assert rec["Comment"] == "a b=c" and rec["WorkDir"] == "/w"
    assert (rec["StdErr"], rec["StdIn"], rec["StdOut"]) == ("", "/dev/null", "/w/o")
    assert "X" not in rec and "Y" not in rec


@pytest.mark.parametrize("text, series, tested, supported", [
    ("slurm-wlm 22.05.8", "22.05", True, True), ("slurm 25.11.7", "25.11", True, True),
    ("slurm 24.05.1", "24.05", False, True), ("slurm 26.05.5", "26.05", True, True),
    ("slurm 26.11.0", "26.11", False, False),
    ("slurm 20.11.9", "20.11", False, False), ("slurm 25.11.0-0rc1", "25.11", True, True)])
def test_release_support(text: str, series: str, tested: bool, supported: bool) -> None:
    rel = SlurmRelease.parse(text)
    assert (rel.series, rel.tested, rel.supported) == (series, tested, supported)
    assert rel.json_filters == (rel >= SlurmRelease(24, 5))
    with pytest.raises(ValueError, match="no Slurm version"):
        SlurmRelease.parse("scontrol: command not found")


# ----------------------------------------------------------------------------- the switch
def test_the_local_cluster_release_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    from devtools.localcluster import LocalCluster
    from devtools.localcluster.releases import CHROOT, Release, release
    from malletrain_core.errors import ConfigError

    monkeypatch.delenv("MALLETRAIN_SLURM", raising=False)
    assert release().name == "22.05" and not release().chrooted
    assert release().daemon_argv("slurmd", "-N", "n01") == ["slurmd", "-N", "n01"]
    assert release().conf_lines() == "" and release().extra_files() == {}
    monkeypatch.setenv("MALLETRAIN_SLURM", "25.11")
    new = release()
    assert new.name == "25.11" and new.daemon_argv("slurmctld", "-f", "/c") == [
        "chroot", str(CHROOT), "/opt/slurm-25.11/sbin/slurmctld", "-f", "/c"]
    assert new.conf_lines() == f"PluginDir={CHROOT}/opt/slurm-25.11/lib/slurm"
    assert new.extra_files() == {"cgroup.conf": "CgroupPlugin=disabled\n"}
    env = new.env({"PATH": "/usr/bin"})
    assert env["PATH"] == f"{new.bin_dir}:/usr/bin" and new.env(env)["PATH"] == env["PATH"]
    cluster = LocalCluster(nodes=2, root="/nonexistent-root", port_base=24000)
    assert cluster.release.name == "25.11" and cluster.env["PATH"].startswith(str(new.bin_dir))
    assert cluster.render_config().endswith(f"# Slurm 25.11\n{new.conf_lines()}\n")
    monkeypatch.setenv("MALLETRAIN_SLURM", "23.02")
    with pytest.raises(ConfigError, match=r"MALLETRAIN_SLURM='23.02': choose one of "
                                          r"22.05, 24.11, 25.11, 26.05$"):
        release()
    with pytest.raises(ConfigError, match=r"Slurm 99.1 is not set up in .*: run "
                                          r"scripts/setup-slurm-matrix.sh 99.1 \(as root\)$"):
        Release("99.1", prefix="/opt/nowhere").check_installed()


# ----------------------------------------------------------------------------- pyslurm path
@pytest.mark.parametrize("state, code, usable", [
    ("IDLE", "idle", True), ("IDLE+PLANNED", "planned", True),
    ("IDLE+NOT_RESPONDING", "idle*", False), ("ALLOCATED", "allocated", False),
    ("MIXED+COMPLETING", "completing", False), ("IDLE+DRAIN", "drained", False),
    ("ALLOCATED+DRAIN", "draining", False), ("IDLE+POWERED_DOWN", "idle~", False),
    ("DOWN+NOT_RESPONDING", "down*", False)])
def test_pyslurm_node_states_read_as_sinfo_prints_them(state: str, code: str,
                                                       usable: bool) -> None:
    from malletrain_core.backends.slurm.pyslurm_rpc import node_code
    assert node_code(state) == code
    (row,) = sp.parse_sinfo(f"n01|{node_code(state)}\n").values()
    assert row.usable == usable


def test_pyslurm_snapshot_in_the_commands_formats() -> None:
    """A stand-in for pyslurm's Nodes/Jobs (the live test compares with real output)."""
    from types import SimpleNamespace as NS

    from malletrain_core.backends.slurm.pyslurm_rpc import snapshot

    def job(**kw: object) -> NS:
        base = dict(array_id=None, array_task_id=None, array_tasks_waiting=None,
                    state="PENDING", allocated_nodes=None, time_limit=None, requeue_count=0,
                    priority=0, user_name="alice", state_reason="JobHeldUser",
                    admin_comment="malletrain:min=1,max=3", partition="preemptable",
                    start_time=0, scheduled_nodes=None, submit_time=1_700_000_000)
        return NS(**{**base, **kw})

    nodes = {"n02": NS(name="n02", state="IDLE+PLANNED", partitions=["prod", "preemptable"]),
             "n01": NS(name="n01", state="ALLOCATED", partitions=["prod", "preemptable"]),
             "x1": NS(name="x1", state="IDLE", partitions=["other"])}
    jobs = {1: job(id=1, array_id=1, array_tasks_waiting="1-2"),
            3: job(id=3, array_id=1, array_task_id=None, state="RUNNING",
                   allocated_nodes="n03", time_limit=60, priority=0,
                   state_reason="JobHeldAdmin", requeue_count=1),
            7: job(id=7, partition="prod", start_time=1_800_000_000,
                   scheduled_nodes="n[01-02]", admin_comment=None, state_reason="Resources")}
    fake = NS(Nodes=NS(load=lambda: nodes), Jobs=NS(load=lambda: jobs))
    got = snapshot(fake, "preemptable")
    assert got["sinfo"] == "n01|allocated\nn02|planned\n"
    rows = {r.key: r for r in sp.parse_squeue(got["squeue"])}
    assert sorted(rows) == ["1_0", "1_1", "1_2"]  # task 0 of pyslurm reads as "not set"
    assert rows["1_0"].node == "n03" and rows["1_0"].held and rows["1_0"].restarts == 1
    assert rows["1_0"].time_limit_s == 3600 and rows["1_1"].time_limit_s is None
    plan = sp.parse_plan(got["plan"])
    assert [(r.job_id, r.array_id) for r in plan] == [("1_[1-2]", "1"), ("7", "7")]
    assert [(r.reason, r.submit) for r in plan] == [("JobHeldUser", 1.7e9), ("Resources", 1.7e9)]
    assert sp.hole_ends(plan, exclude={"1"}) == {"n01": 1.8e9, "n02": 1.8e9}


def test_pyslurm_setting() -> None:
    from malletrain_core.backends.slurm.pyslurm_reader import source_for
    assert source_for("off") is None and source_for("") is None
    # A helper is started and asked for both versions when it is chosen: one that does not
    # start means the commands (the line says why).
    assert source_for("chroot /srv/x /opt/pyslurm-24.11/bin/python") is None
