"""The fault campaign's arithmetic (bench/campaign_report.py) on made-up step lines and rows:
when a job trains again, what it rolled back, and the summary and table over the rows."""

from __future__ import annotations

import json

from bench.campaign_report import Step, StepReader, first_run, recovery, summarize, table


def steps(*spans: tuple[float, int, int, int, int]) -> list[Step]:
    """(first end time, first step, how many, epoch, world): steps 0.2 s apart."""
    return [Step(t0 + 0.2 * i, s0 + i, epoch, world)
            for t0, s0, n, epoch, world in spans for i in range(n)]


def test_a_fault_that_does_not_stop_training_reads_as_one_step():
    log = steps((100.0, 1, 40, 3, 2))
    rec = recovery(log, t_fault=103.05, t_release=103.05, batch=8)
    assert rec["recovered"]
    assert rec["to_training_s"] == 0.15  # the step that ended at 103.2
    assert rec["steps_rolled_back"] == 0 and rec["samples_lost"] == 0


def test_a_roll_back_counts_the_steps_trained_again():
    # epoch 3 at world 2 reaches step 20 at 103.8; the fault at 104.0; epoch 4 at world 1
    # resumes from the checkpoint at step 15 (its first step makes 16) at 110.0
    log = steps((100.0, 1, 20, 3, 2), (110.0, 16, 10, 4, 1))
    rec = recovery(log, t_fault=104.0, t_release=104.0, batch=8)
    assert rec["recovered"] and rec["to_training_s"] == 6.0
    assert rec["steps_rolled_back"] == 5                  # steps 16..20 again
    assert rec["samples_lost"] == 5 * 8 * 2               # trained at world 2
    assert rec["samples_kept"] == 0                       # nothing between fault and run


def test_a_roll_back_after_an_earlier_one_counts_only_the_last_lineage():
    # epoch 3 reached 30, epoch 4 went back to 11 and reached 15; the fault; epoch 5 from 13
    log = steps((100.0, 1, 30, 3, 1), (110.0, 11, 5, 4, 1), (120.0, 13, 6, 5, 1))
    rec = recovery(log, t_fault=112.0, t_release=112.0, batch=8)
    assert rec["steps_rolled_back"] == 3 and rec["samples_lost"] == 24  # 13, 14, 15


def test_no_run_of_five_steps_is_no_recovery():
    log = steps((100.0, 1, 10, 3, 2), (110.0, 11, 4, 4, 2))
    assert first_run(log, 103.0) is None
    rec = recovery(log, t_fault=103.0, t_release=103.0, batch=8)
    assert not rec["recovered"] and rec["to_training_s"] is None


def test_the_run_must_follow_the_release():
    # a hung process: the others stop; it is continued at 130, training from 131
    log = steps((100.0, 1, 20, 3, 2), (131.0, 21, 10, 3, 2))
    assert recovery(log, 104.5, 135.0, 8)["recovered"] is False  # no run after 135 yet
    rec = recovery(log, 104.5, 130.0, 8)
    assert rec["recovered"] and rec["to_training_s"] == 26.5


def test_reader_keeps_each_global_step_once_at_its_last_end(tmp_path):
    lines = [{"t": 1.0, "step": 1, "failed": False, "epoch": 2, "world": 2, "rank": 0},
             {"t": 1.1, "step": 1, "failed": False, "epoch": 2, "world": 2, "rank": 1},
             {"t": 1.3, "step": 1, "failed": True, "epoch": 2, "world": 2, "rank": 1}]
    (tmp_path / "task-7_0.out").write_text(json.dumps(lines[0]) + "\nnot json\n")
    (tmp_path / "task-7_1.out").write_text(json.dumps(lines[1]) + "\n" + json.dumps(lines[2])
                                           + "\n{\"t\": 2.0, \"st")  # a line being written
    assert StepReader(tmp_path, "7").poll() == [Step(1.1, 1, 2, 2)]


def row(n, fault, injected=True, recovered=True, took=1.0, lost=0, tasks=0, stalled=0, **kw):
    return {"n": n, "fault": fault, "injected": injected, "recovered": recovered,
            "to_training_s": took if injected and recovered else None,
            "samples_lost": lost if injected and recovered else None,
            "samples_kept": 8 if injected and recovered else None, "tasks_lost": tasks,
            "stalled_nodes": stalled, "job": "5", "target": "t", "reason": "", **kw}


def test_summary_and_table():
    rows = [row(1, "daemon_kill", took=0.1), row(2, "train_kill", took=2.0, lost=16),
            row(3, "train_kill", took=6.0, lost=48),
            row(4, "sigstop", recovered=False, reason="no 5 consecutive steps"),
            row(5, "sigstop", injected=False, reason="job 5 has no running task"),
            row(6, "launcher_kill", tasks=1, lost_list=None, by_design="PBS"),
            row(7, "daemon_kill", took=0.3, stalled=1, stalled_list=None)]
    s = summarize(rows)
    assert (s["faults"], s["not_injected"], s["recovered"]) == (6, 1, 5)
    assert (s["tasks_lost"], s["stalled_nodes"], s["samples_lost"]) == (1, 1, 64)
    tk = s["classes"]["train_kill"]
    assert tk["to_training_s_median"] == 4.0 and tk["to_training_s_max"] == 6.0
    assert tk["samples_lost"] == 64 and tk["samples_lost_max"] == 48
    st = s["classes"]["sigstop"]
    assert (st["faults"], st["not_injected"], st["recovered"]) == (1, 1, 0)
    assert st["to_training_s_median"] is None
    text = table(s, rows, {"train_kill": "SIGKILL"})
    lines = text.splitlines()
    assert lines[2].startswith("| daemon_kill |") and "| 2 | 2 | 0.2 s / 0.3 s |" in lines[2]
    assert "| train_kill | SIGKILL | 2 | 2 | 4.0 s / 6.0 s | 64 / 48 | 16 | 0 | 0 |" in text
    assert "| sigstop |  | 1 (+1 not injected) | 0 | – / – | 0 / – | 0 |" in text
    assert "| **all** | | 6 | 5 | | 64 | 40 | 1 | 1 |" in text
    odd = [ln for ln in lines if ln.startswith("* #")]
    assert [ln.split()[1] for ln in odd] == ["#4", "#5", "#6", "#7"]
    assert "job 5 has no running task" in odd[1] and "PBS" in odd[2]
