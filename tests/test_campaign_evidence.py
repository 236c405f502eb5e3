"""What the fault campaign keeps of a slow fault (bench/campaign_evidence.py), on a made-up
daemon log: the timeline of the job's lines from the fault to training again, the longest
wait in it, and the files written; the report's lines for such faults."""

from __future__ import annotations

import json
from datetime import datetime

from bench.campaign_evidence import keep, longest_wait, stamped, timeline
from bench.campaign_report import slow_lines

T0 = datetime(2026, 12, 7, 3, 0, 0).timestamp()


def line(dt: float, text: str) -> str:
    t = datetime.fromtimestamp(T0 + dt)
    return f"{t:%Y-%m-%d %H:%M:%S},{t.microsecond // 1000:03d} {text}"


LOG = "\n".join([
    line(-3.0, "INFO malletrain_core.daemon.core: job=12 grow n04"),
    line(0.4, "INFO malletrain_core.daemon.core: job=13 shrink n02"),      # another job
    line(1.5, "WARNING malletrain_core.daemon.epochs: job=12 peers lost on n03: epoch 7"),
    "a line without a time (a traceback's)",
    line(1.6, "INFO malletrain_core.daemon.epochs: job=12 epoch 8 (inplace, abandon)"),
    line(29.9, "WARNING malletrain_core.backends.slurm.backend: task 12_3 requeued held"),
    line(40.0, "INFO malletrain_core.daemon.core: job=12 grow n05"),       # after: left out
])


def test_stamped_lines_keep_their_time():
    got = stamped(LOG)
    assert len(got) == 6 and abs(got[0][0] - (T0 - 3.0)) < 1e-6


def test_the_timeline_and_its_longest_wait():
    events = timeline(LOG, "12", T0, "sigstop n03", T0 + 30.3, T0 + 31.0)
    assert [round(s, 1) for s, _ in events] == [0.0, 1.5, 1.6, 29.9, 30.3]
    assert events[0][1] == "fault: sigstop n03" and events[-1][1] == "training again"
    assert "job=13" not in " ".join(e for _, e in events)
    w = longest_wait(events)
    assert w is not None and w["wait_s"] == 28.3 and "epoch 8" in w["after"]
    assert "requeued held" in w["until"]


def test_a_fault_never_recovered_runs_to_the_end_of_its_watch():
    events = timeline(LOG, "12", T0, "sigstop n03", None, T0 + 35.0)
    assert events[-1][1].endswith("requeued held") and len(events) == 4


def test_keep_writes_the_timeline_the_log_and_the_outputs(tmp_path):
    out = tmp_path / "task-12_3.out"
    out.write_text("\n".join(f"line {i}" for i in range(500)) + "\n")
    row = {"n": 72, "job": "12", "fault": "sigstop", "target": "n03", "to_training_s": 30.3}
    where = keep(tmp_path / "072-sigstop", row, LOG, [out, tmp_path / "missing.out"], T0,
                 T0 + 30.3, T0 + 31.0)
    assert where is not None and where["wait_s"] == 28.3
    doc = json.loads((tmp_path / "072-sigstop" / "timeline.json").read_text())
    assert doc["row"]["n"] == 72 and len(doc["events"]) == 5
    kept = (tmp_path / "072-sigstop" / "daemon.log").read_text()
    assert "job=13 shrink" in kept and "grow n05" not in kept   # every line in the span
    tail = (tmp_path / "072-sigstop" / "task-12_3.out").read_text().splitlines()
    assert len(tail) == 200 and tail[-1] == "line 499"


def test_the_report_names_each_slow_fault_slowest_first():
    where = {"wait_s": 28.3, "at_s": 1.6, "after": "daemon: epoch 8", "until": "training again"}
    rows = [{"n": 3, "fault": "train_kill", "to_training_s": 6.0, "where": dict(where)},
            {"n": 72, "fault": "sigstop", "to_training_s": 30.3, "target": "n03",
             "where": where},
            {"n": 9, "fault": "sigstop", "to_training_s": None, "where": dict(where)},
            {"n": 4, "fault": "train_kill", "to_training_s": 1.0}]
    lines = [ln for ln in slow_lines(rows) if ln.startswith("* ")]
    assert [ln.split()[1] for ln in lines] == ["#9", "#72", "#3"]
    assert "not recovered" in lines[0] and "30.3 s; 28.3 s from 1.6 s" in lines[1]
    assert slow_lines(rows[3:]) == []
