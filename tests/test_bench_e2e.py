"""bench/e2e.py's report: the liveness rows it adds, and a failed phase that keeps the rest
(quick: a made-up result, no cluster)."""

from __future__ import annotations

import pytest

e2e = pytest.importorskip("bench.e2e")


def result(**over: object) -> dict:
    r = {"nodes": 16, "completed": True, "failed": {}, "tasks_lost": [],
         "grant_to_training_s_max": 12.96, "regrow_after_prod_s": {"median": 0.94, "max": 3.93},
         "grant_to_start_s": {"count": 40, "median": 0.8, "p95": 1.6, "max": 2.1},
         "grow_s": 9.4, "shrink_s": 6.0, "hook_to_action_ms": 240.0,
         "prod_start_s": {"with_malletrain": 1.03, "without": 0.95, "with_malletrain_p95": 1.08,
                          "without_p95": 1.0},
         "grow_s_all": [10.26, 9.44, 9.25], "shrink_s_all": [6.04, 7.03, 4.61],
         "hook_to_action_ms_p95": 450.0, "hook_to_action_count": 48, "submissions": 30,
         "rounds": 3, "machine": "a machine", "date": "2026-11-26 23:12 UTC"}
    r.update(over)
    return r


def test_the_section_shows_the_worst_grant_and_every_task_lost() -> None:
    text = e2e.section(result(), "python -m bench.e2e --json")
    assert "| prod job ended → its node training again (phase 2, n = 29) | 0.94 s | max " \
           "3.93 s |" in text
    assert "| node idle → training, worst of every grow in the run | | 13.0 s |" in text
    assert "| grant → its task running (the daemon's own count to the poll that saw it, n = " \
           "40) | 0.80 s | max 2.10 s |" in text
    assert "FAILED, never requeued) | 0 | none |" in text
    lost = e2e.section(result(tasks_lost=["9_0 FAILED", "9_1 FAILED"]), "x")
    assert "| 2 | 9_0 FAILED, 9_1 FAILED |" in lost


def test_a_failed_run_is_not_written_and_exits_1(monkeypatch, tmp_path, capsys) -> None:
    out = tmp_path / "B.md"
    out.write_text("# B\n")
    monkeypatch.setattr(e2e, "run", lambda *a: result(completed=False,
                                                      failed={"phase 2": "all idle nodes "
                                                              "harvested: not within 90 s"}))
    assert e2e.main(["--json", "--markdown", str(out)]) == 1
    assert out.read_text() == "# B\n"
    assert '"phase 2": "all idle nodes harvested: not within 90 s"' in capsys.readouterr().out


def test_several_runs_make_one_table(tmp_path, capsys) -> None:
    a, b = tmp_path / "r1.json", tmp_path / "r2.json"
    a.write_text(__import__("json").dumps(result()))
    b.write_text(__import__("json").dumps(result(completed=False, failed={"phase 4": "x"},
                                                 tasks_lost=["9_0 FAILED"])))
    assert e2e.main(["--summarize", str(a), str(b)]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert rows[2] == ("| r1 | yes | 0 | 12.96 s | 0.94 s / 3.93 s | 2.10 s | 1.03 s / 0.95 s "
                       "| – |")
    assert rows[3].startswith("| r2 | no: phase 4 | 1 |")
