"""bench/joiner.py without a cluster: a join's parts from slurmctld's log and the joiner's own
line, and the section written from saved runs."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

joiner = pytest.importorskip("bench.joiner")
from test_sim_accounting import utc  # noqa: E402,F401  (slurmctld's times are local: UTC here)

LOG = """\
[2026-11-27T02:00:00.000] sched: Allocate JobId=7 NodeList=n02 #CPUs=2 Partition=prod
[2026-11-27T02:00:04.000] _job_complete: JobId=7 done
[2026-11-27T02:00:04.800] sched/backfill: _start_job: Started JobId=1_1(3) in preemptable on n02
[2026-11-27T02:00:05.000] sched: Allocate JobId=8 NodeList=n03 #CPUs=2 Partition=prod
"""
T0 = 1795744800.0  # 2026-11-27T02:00:00 UTC


def line(node: str, exec_t: float) -> dict:
    return {"joiner": node, "task_t": exec_t - 0.1, "exec_t": exec_t,
            "imported_t": exec_t + 1.0, "model_t": exec_t + 1.01, "built_t": exec_t + 2.01,
            "ready_t": exec_t + 2.01, "first_t": exec_t + 2.21, "world": 4}


@pytest.mark.usefixtures("utc")
def test_a_join_is_split_from_the_prod_jobs_end_to_the_first_step():
    lines = [line("n02", T0 - 30.0),  # the node's first start, before the prod job
             line("n02", T0 + 4.9), line("n01", T0 + 4.9)]
    rows = joiner.joins(LOG, [("7", "n02"), ("8", "n03")], lines)
    assert len(rows) == 1, "job 8 has not ended: no join"
    row = rows[0]
    assert row["grant"] == pytest.approx(0.8)
    assert row["slurmd"] == pytest.approx(0.0)   # the task's process at 4.8 s
    assert row["launcher"] == pytest.approx(0.1)
    assert row["import_torch"] == pytest.approx(1.0)
    assert row["optimizer"] == pytest.approx(1.0)
    assert row["placed_and_formed"] == pytest.approx(0.2)
    assert row["total"] == pytest.approx(4.9 + 2.21 - 4.0)
    assert sum(row[p[0]] for p in joiner.PARTS) == pytest.approx(row["total"], abs=0.01)


def test_the_section_pools_each_sides_joins(tmp_path):
    def run(totals: list[float], commit: str) -> dict:
        joins = [{**{p[0]: 0.1 for p in joiner.PARTS}, "total": t} for t in totals]
        return {"joins": joins, "median": joiner.medians(joins), "commit": commit,
                "date": "2026-11-27 02:00 UTC", "load": "1.0", "nodes": 4, "prod_s": 4.0,
                "command": "python -m bench.joiner --joins 2", "machine": "a host"}

    files = []
    for name, totals in (("b1", [4.0, 5.0]), ("a1", [3.0, 3.5]), ("b2", [6.0, 4.5]),
                         ("a2", [2.0, 3.2])):
        files.append(tmp_path / f"{name}.json")
        files[-1].write_text(json.dumps(run(totals, name)))
    md = tmp_path / "B.md"
    md.write_text("# Benchmarks\n")
    assert joiner.main(["--compare", *map(str, files), "--markdown", str(md)]) == 0
    text = md.read_text()
    assert "**4.75 s** | **3.10 s**" in text  # medians of 4, 5, 6, 4.5 and of 3, 3.5, 2, 3.2
    assert text.count(joiner.BEGIN) == 1 and "before (b2" in text and "after (a2" in text


def test_compare_wants_pairs_and_readable_files(tmp_path, capsys):
    with pytest.raises(SystemExit):
        joiner.main(["--compare", str(tmp_path / "missing.json"), "x"])
    assert "--compare:" in capsys.readouterr().err
