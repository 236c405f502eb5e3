"""bench/grant_latency.py without a cluster: which scheduler started a task, from slurmctld's
log lines of each release."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
gl = pytest.importorskip("bench.grant_latency")

LOG = """\
[2026-11-28T13:22:32.504] sched: Allocate JobId=7 NodeList=n01 #CPUs=2 Partition=preemptable
[2026-11-28T13:22:48.436] sched/backfill: _start_job: Started JobId=9 in preemptable on n01
[2026-11-28T13:22:49.000] sched/backfill: _start_job: HETJOB: Started JobId=11 in preemptable on n01
"""


def test_started_by_reads_the_main_scheduler_and_both_backfill_forms() -> None:
    assert gl.started_by(LOG, "7") == "main"
    assert gl.started_by(LOG, "9") == "backfill"
    assert gl.started_by(LOG, "11") == "backfill"  # 26.05 under DebugFlags=HetJob
    assert gl.started_by(LOG, "1") == "unknown"  # JobId=1 is not JobId=11's prefix match


def test_markdown_gives_one_row_per_release() -> None:
    result = {"host": "h", "date": "d", "releases": [
        {"release": "22.05", "trials": 2, "median_s": 0.5, "mean_s": 0.5, "max_s": 0.9,
         "started_by_main": 1, "started_by_backfill": 1}]}
    text = gl.markdown(result, "cmd")
    assert text.startswith(gl.BEGIN) and text.endswith(gl.END)
    assert "| 22.05 | 0.500 | 0.500 | 0.900 | 1 / 1 / 0 |" in text
