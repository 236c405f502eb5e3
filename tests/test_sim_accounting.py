"""Reading a site's own accounting: sacct --json and -P, PBS accounting logs, and the idle
trace they give. The fixtures under tests/golden/accounting were captured from the local
Slurm cluster (accounting mode) and the local PBS complex (see their README)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from malletrain_core.errors import InputFileError
from malletrain_core.sim.accounting import (
    MAX_NOTED,
    AccountingFilter,
    JobRun,
    load_accounting_trace,
    read_accounting,
    runs_to_trace,
)
from malletrain_core.sim.sources import load_trace

GOLDEN = Path(__file__).parent / "golden" / "accounting"
SACCT_JSON = GOLDEN / "sacct_22.05.json"
SACCT_P = GOLDEN / "sacct_22.05.txt"
PBS_LOG = GOLDEN / "pbs_accounting_20261127"
T0 = 1795745752.0  # 2026-11-27T02:15:52 UTC, the first start in the sacct fixtures


@pytest.fixture(autouse=True)
def utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """sacct -P and PBS record times are local: the fixtures were taken under UTC."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def busy(trace, node: str) -> list[tuple[float, float]]:
    """A node's busy spans in a trace, relative to T0."""
    i = trace.node_names.index(node)
    idle = i in set(trace.initial.tolist())
    spans, since = [], None if idle else trace.start
    for t, added, removed in trace.iter_steps():
        if i in removed:
            since = t
        elif i in added and since is not None:
            spans.append((since - T0, t - T0))
            since = None
    if since is not None:
        spans.append((since - T0, trace.end - T0))
    return spans


def test_sacct_json_and_parsable_give_the_same_runs() -> None:
    quiet: list[str] = []
    js, ps = read_accounting(SACCT_JSON, quiet.append), read_accounting(SACCT_P, quiet.append)
    assert quiet == []
    assert (js.kind, ps.kind) == ("sacct --json", "sacct -P")
    key = sorted((r.job, r.start, r.end, r.nodes, r.partition, r.state) for r in js.runs)
    assert key == sorted((r.job, r.start, r.end, r.nodes, r.partition, r.state)
                         for r in ps.runs)
    assert len(key) == 8 and (js.not_run, ps.not_run) == (1, 1)  # 8_0 requeued, never rerun
    runs = {r.job: r for r in js.runs}
    assert runs["2"].nodes == ("n02", "n03") and runs["2"].end - runs["2"].start == 6
    assert runs["8_0"].state == "PREEMPTED" and runs["8_0"].partition == "preemptable"
    assert runs["10"].reservation == "#1"  # 22.05's JSON names no reservation, only its id


def test_each_node_idle_between_its_own_jobs() -> None:
    trace = load_accounting_trace(SACCT_P, AccountingFilter.of(skip_partitions=["preemptable"]),
                                  warn=None)
    assert trace.node_names == ("n01", "n02", "n03", "n04")
    assert (trace.start, trace.end) == (T0, T0 + 52)
    assert busy(trace, "n01") == [(0, 4), (17, 20), (39, 42)]
    assert busy(trace, "n02") == busy(trace, "n03") == [(0, 6)]
    assert busy(trace, "n04") == [(0, 2), (49, 52)]
    assert trace.idle_node_seconds() == 4 * 52 - (10 + 6 + 6 + 5)
    elastic_too = load_accounting_trace(SACCT_JSON, warn=None)
    assert busy(elastic_too, "n01") == [(0, 4), (17, 20), (31, 42)]  # 5_0, 8_0, 9 back to back


def test_filters_partitions_and_reservations() -> None:
    only = load_accounting_trace(SACCT_JSON, AccountingFilter.of(partitions=["preemptable"]),
                                 nodes=["n02"], warn=None)
    assert only.node_names == ("n01", "n02") and busy(only, "n02") == []
    skip = load_accounting_trace(SACCT_JSON, AccountingFilter.of(
        skip_partitions=["preemptable"], skip_reservations=["#1"]), warn=None)
    assert busy(skip, "n04") == [(0, 2)]
    with pytest.raises(InputFileError, match="no run left after the filter.*prod"):
        load_accounting_trace(SACCT_JSON, AccountingFilter.of(partitions=["gpu"]), warn=None)


def test_overlapping_runs_merge_and_running_jobs_hold_to_the_end() -> None:
    runs = [JobRun("1", 10, 30, ("a", "b")), JobRun("2", 20, 40, ("a",)),
            JobRun("3", 40, 50, ("a",)), JobRun("4", 60, None, ("b",), state="RUNNING"),
            JobRun("5", 0, 100, ("c",))]
    trace = runs_to_trace("t", runs, nodes=["d"], end=100)
    global T0
    saved, T0 = T0, 0.0
    try:
        assert busy(trace, "a") == [(10, 50)]
        assert busy(trace, "b") == [(10, 30), (60, 100)]
        assert busy(trace, "c") == [(0, 100)]
        assert busy(trace, "d") == []
    finally:
        T0 = saved
    assert trace.idle_node_seconds() == 400 - 40 - 60 - 100


def test_pbs_accounting_log() -> None:
    log = read_accounting(PBS_LOG, warn=None)
    assert log.kind == "PBS accounting" and log.skipped == 0
    runs = {r.job: r for r in log.runs}
    assert runs["1.pbsserver"].nodes == ("n02", "n03")
    rerun = [r for r in log.runs if r.state == "RERUN"]
    assert rerun and all(r.partition == "preemptable" for r in rerun)  # preempted, requeued
    assert "4.pbsserver" not in runs  # deleted while queued: never ran
    trace = load_accounting_trace(PBS_LOG, AccountingFilter.of(skip_partitions=["preemptable"]),
                                  warn=None)
    assert trace.node_names == ("n01", "n02", "n03") and trace.idle_node_seconds() > 0


def test_pbs_start_zero_is_not_started(tmp_path: Path) -> None:
    """The server clears a job's start when it sends it and sets it when the MOM reports it
    running: requeued in between, the R record says start=0 (seen on the live server)."""
    head = "11/27/2026 04:45:{s:02d};{k};{j};queue=preemptable start={t} end=1795800000 " \
        "exec_vnode=(n03:ncpus=2)"
    path = tmp_path / "acct"
    path.write_text("\n".join([
        head.format(s=20, k="R", j="0.s", t=0),  # requeued before it started
        head.format(s=21, k="S", j="1.s", t=1795799990),
        head.format(s=29, k="R", j="1.s", t=0),  # started, then its R says 0: the S's start
        "11/27/2026 04:45:30;E;2.s;queue=prod start=1795799000 end=1795800000 "
        "exec_vnode=(n01:ncpus=2)"]) + "\n")
    said: list[str] = []
    log = read_accounting(path, said.append)
    assert said == [] and log.not_run == 1
    assert [(r.job, r.start, r.state) for r in log.runs] == [
        ("1.s", 1795799990, "RERUN"), ("2.s", 1795799000, "ENDED")]


def test_malformed_records_are_one_line_each_and_counted(tmp_path: Path) -> None:
    lines = SACCT_P.read_text().splitlines()
    bad = [lines[0], lines[1], "12|x|prod||COMPLETED|n01|2026-13-45T99:00:00|"
           "2026-11-27T02:15:56|1", "13|only|three", "14|y|prod||COMPLETED|n[01|"
           "2026-11-27T02:15:52|2026-11-27T02:15:56|1", "15|z|prod||COMPLETED|n01|"
           "2026-11-27T02:15:59|2026-11-27T02:15:52|1"]
    path = tmp_path / "sacct.txt"
    path.write_text("\n".join(bad) + "\n")
    said: list[str] = []
    log = read_accounting(path, said.append)
    assert [r.job for r in log.runs] == ["1"] and log.skipped == 4 and len(said) == 4
    assert all("\n" not in s and s.startswith(f"{path}:") for s in said)
    assert ":3: skipped" in said[0] and "before it starts" in said[3]


def test_past_the_cap_only_counted(tmp_path: Path) -> None:
    head = SACCT_P.read_text().splitlines()[:2]
    path = tmp_path / "sacct.txt"
    path.write_text("\n".join(head + ["x|y"] * (MAX_NOTED + 7)) + "\n")
    said: list[str] = []
    assert read_accounting(path, said.append).skipped == MAX_NOTED + 7
    assert len(said) == MAX_NOTED + 1 and f"{MAX_NOTED + 7} malformed" in said[-1]


@pytest.mark.parametrize("body, says", [
    ("JobID|State\n1|COMPLETED\n", "no NODELIST, START, END column"),
    ("JobID|NodeList|Start|End\n1|None assigned|None|None\n", "no usable record"),
    ('{"jobs": []}', "no usable record"),
    ('{"jobs": [', "not JSON"),
    ('{"meta": {}}', 'no "jobs" list'),
    ("11/27/2026 02:18:27;Q;0.s;queue=prod\n", "no usable record"),
])
def test_logs_with_nothing_usable_say_what_was_expected(tmp_path: Path, body: str,
                                                        says: str) -> None:
    path = tmp_path / "log"
    path.write_text(body)
    with pytest.raises(InputFileError) as err:
        read_accounting(path, warn=None)
    assert says in str(err.value) and "\n" not in str(err.value)


def test_newer_sacct_json_layouts(tmp_path: Path) -> None:
    """23.02+ wrap numbers in {"set", "number"} and 23.11+ make state.current a list."""
    job = {"job_id": 7, "array": {"job_id": 0, "task_id": {"set": False, "number": 0}},
           "nodes": "g[1-2]", "partition": "gpu", "reservation": {"id": 0, "name": ""},
           "state": {"current": ["COMPLETED"]},
           "time": {"start": {"set": True, "number": 100}, "end": {"set": True, "number": 160}}}
    path = tmp_path / "new.json"
    path.write_text(json.dumps({"jobs": [job]}))
    (run,) = read_accounting(path, warn=None).runs
    assert (run.job, run.start, run.end, run.nodes, run.state) == \
        ("7", 100.0, 160.0, ("g1", "g2"), "COMPLETED")


def test_load_trace_and_simulate_read_accounting(capsys: pytest.CaptureFixture[str]) -> None:
    from malletrain_core.cli import main

    trace = load_trace(str(SACCT_JSON), accounting=AccountingFilter.of(
        skip_partitions=["preemptable"]))
    assert trace.idle_node_seconds() == 181
    assert main(["simulate", "--trace", str(SACCT_P), "--skip-partition", "preemptable",
                 "--jobs", "2", "--policies", "malletrain,oracle", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["idle_node_seconds"] == 181 and out["trace"]["nodes"] == 4
    assert out["policies"]["malletrain"]["net_samples"] > 0


def test_what_if_report_and_plots(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from malletrain_core.cli import main

    assert main(["admin", "what-if", str(PBS_LOG), "--skip-partition", "preemptable",
                 "--jobs", "2", "--out", str(tmp_path), "--json", "--compare"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert set(report["cost_models"]) == {"restart", "inplace", "inplace-gpu"}
    assert report["cost_model_choice"]["why"] == "every cost model (--compare)"
    idle_h = report["idle_node_hours"]
    for m in report["cost_models"].values():
        assert 0 < m["harvested_node_hours"] <= idle_h + 1e-9
        assert np.isclose(m["harvested_share"], m["harvested_node_hours"] / idle_h)
        assert 0 < m["ub_oracle_share"] <= 1
    assert {p.name for p in tmp_path.iterdir()} == {"whatif.json", "whatif.md", "idle.png",
                                                   "share.png"}
    assert "| inplace |" in (tmp_path / "whatif.md").read_text()


def test_what_if_figures_do_not_depend_on_the_processes() -> None:
    """The cost models compared (--compare) replay side by side by default; one process
    gives the same figures."""
    from malletrain_core.sim.costs import COST_MODELS
    from malletrain_core.sim.whatif import WhatIfOptions, default_workers, what_if

    opts = WhatIfOptions(trace=str(PBS_LOG), jobs=2, cost_models=tuple(COST_MODELS),
                         accounting=AccountingFilter.of(skip_partitions=["preemptable"]))
    one, side = what_if(opts, workers=1).report, what_if(opts, workers=5).report
    assert one["timing_s"]["workers"] == 1 and side["timing_s"]["workers"] == 3

    def figures(report: dict) -> dict:
        return {c: {k: v for k, v in m.items() if k not in ("replay_wall_s", "replay_cpu_s")}
                for c, m in report["cost_models"].items()}

    assert figures(one) == figures(side)
    assert all(m["replay_cpu_s"] > 0 and m["replans"] > 0 for m in side["cost_models"].values())
    assert 1 <= default_workers(3) <= 3 and default_workers(1) == 1


@pytest.mark.parametrize("workers", [1, 3])
def test_what_if_tells_how_far_each_replay_is(workers: int,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Plain lines on stderr (no terminal) from the reading on, each cost model's share, up to
    100 % for all: in one process and with the replays side by side (their shares read every
    few milliseconds here, as the fixture's replays take a fraction of a second)."""
    import io

    from malletrain_core.sim import whatif
    from malletrain_core.sim.compare import Progress
    from malletrain_core.sim.whatif import WhatIfOptions, what_if

    monkeypatch.setattr(whatif, "PROGRESS_EVERY_S", 0.002)
    stream = io.StringIO()
    opts = WhatIfOptions(trace=str(PBS_LOG), jobs=2, cost_models=("restart", "inplace"),
                         accounting=AccountingFilter.of(skip_partitions=["preemptable"]))
    what_if(opts, workers=workers, progress=Progress(2, stream, every_s=0.0, name="what-if"))
    lines = stream.getvalue().splitlines()
    assert lines[0].startswith("what-if:   0.0% reading the accounting")
    assert lines[-1].startswith("what-if: 100.0% restart 100% inplace 100%")
    shares = [float(line.split()[1].rstrip("%")) for line in lines]
    assert shares == sorted(shares) and len(lines) >= 3


def test_the_gpus_a_run_held_are_read_from_each_kind_of_log(tmp_path: Path) -> None:
    """sacct -P's AllocTRES, sacct --json's tres.allocated and PBS's Resource_List.ngpus (or
    its exec_vnode's ngpus=); a typed count beside the plain one is not counted twice."""
    from malletrain_core.sim.acctlog import gpus_in_tres

    assert gpus_in_tres("billing=8,cpu=8,gres/gpu=4,gres/gpu:h100=4,mem=64G,node=1") == 4
    assert gpus_in_tres("cpu=8,gres/gpu:a100=2,node=1") == 2
    assert gpus_in_tres("cpu=8,mem=4G,node=1") == 0 and gpus_in_tres("") == 0
    sacct_p = tmp_path / "p.txt"
    sacct_p.write_text("JobID|NodeList|Start|End|AllocTRES\n"
                       "1|g1|2026-11-01T00:00:00|2026-11-01T01:00:00|cpu=4,gres/gpu=2,node=1\n"
                       "2|c1|2026-11-01T00:00:00|2026-11-01T01:00:00|cpu=4,node=1\n")
    log = read_accounting(sacct_p, warn=None)
    assert [r.gpus for r in log.runs] == [2, 0] and log.gpu_runs == 1
    job = {"job_id": 7, "nodes": "g1", "state": {"current": ["COMPLETED"]},
           "time": {"start": 100, "end": 160},
           "tres": {"allocated": [{"type": "cpu", "name": "", "count": 8},
                                  {"type": "gres", "name": "gpu", "count": 4},
                                  {"type": "gres", "name": "gpu:h100", "count": 4}]}}
    sacct_json = tmp_path / "j.json"
    sacct_json.write_text(json.dumps({"jobs": [job]}))
    assert read_accounting(sacct_json, warn=None).runs[0].gpus == 4
    pbs = tmp_path / "pbs"
    pbs.write_text("11/27/2026 02:18:27;E;1.s;queue=gpu start=1796000000 end=1796000600 "
                   "exec_vnode=(g1:ncpus=8:ngpus=2)+(g2:ncpus=8:ngpus=2)\n"
                   "11/27/2026 02:18:28;E;2.s;queue=gpu start=1796000000 end=1796000600 "
                   "Resource_List.ngpus=8 exec_vnode=(g3:ncpus=8)\n"
                   "11/27/2026 02:18:29;E;3.s;queue=cpu start=1796000000 end=1796000600 "
                   "exec_vnode=(c1:ncpus=8)\n")
    assert [r.gpus for r in read_accounting(pbs, warn=None).runs] == [4, 8, 0]


def test_what_if_replays_the_sites_own_cost_model_by_default(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """One replay by default: inplace-gpu when a run of the log held GPUs, inplace when none
    says so, or as --nodes says; --compare with --cost-models is refused in one line."""
    from malletrain_core.cli import main

    base = ["admin", "what-if", str(PBS_LOG), "--skip-partition", "preemptable", "--jobs", "2",
            "--json"]
    assert main(base) == 0
    report = json.loads(capsys.readouterr().out)
    assert list(report["cost_models"]) == ["inplace"]
    assert "says it held a GPU" in report["cost_model_choice"]["why"]
    assert main([*base, "--nodes", "gpu"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert list(report["cost_models"]) == ["inplace-gpu"]
    assert report["cost_model_choice"]["why"] == "--nodes gpu"
    gpu_log = tmp_path / "pbs"
    gpu_log.write_text(PBS_LOG.read_text().replace("exec_vnode=(", "Resource_List.ngpus=1 "
                                                   "exec_vnode=(", 1))
    assert main([*base[:2], str(gpu_log), *base[3:]]) == 0
    report = json.loads(capsys.readouterr().out)
    assert list(report["cost_models"]) == ["inplace-gpu"]
    assert report["cost_model_choice"]["why"].startswith("1 of the log's")
    assert main([*base, "--compare", "--cost-models", "restart"]) == 2  # a usage error
    assert "not both" in capsys.readouterr().err
