"""The whole demo, short: a 16-node local cluster, malletraind, the Summit-gap workload and
NAS-cell training with stood-in compute (the default); the summary must show trained samples
and harvested node-seconds counted from the workers' completed steps."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from malletrain_core.demo.summary import KEYS, Sample, read_step_logs, stepping_node_seconds

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slow, pytest.mark.slurm, pytest.mark.torch,
              pytest.mark.skipif(os.geteuid() != 0, reason="the local cluster runs as root")]


def recount(out: Path, until: float) -> float:
    """The harvested node-seconds again, from the demo's saved samples and the workers' step
    logs as they were when the demo read them: only time inside completed steps on nodes idle
    of prod work."""
    samples = [Sample.from_json(json.loads(line))
               for line in (out / "samples.jsonl").read_text().splitlines()]
    steps = read_step_logs(sorted((out / "jobs").glob("checkpoints-*/steps/*.log")), until)
    return stepping_node_seconds(samples, steps)


def test_demo_end_to_end(tmp_path):
    out = tmp_path / "demo"
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "demo.py"), "--json",
                           "--duration-s", "60", "--out", str(out), "--seed", "1"],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    printed = json.loads(proc.stdout)
    saved = json.loads((out / "summary.json").read_text())
    assert printed == saved
    assert list(saved)[:len(KEYS)] == list(KEYS)
    assert saved["samples"] > 0
    assert 0 < saved["harvested_share"] <= 1
    assert saved["harvested_node_seconds"] <= saved["idle_node_seconds"]
    assert saved["prod_jobs_started"] > 10 and saved["prod_start_delay_s"] is not None
    assert (out / "timeline.png").read_bytes()[:4] == b"\x89PNG"
    # the default mode stands in for the compute, and says so on screen and in the summary
    assert saved["compute"] == "standin" and "STOOD IN" in saved["compute_note"]
    assert "STANDIN MODE: compute STOOD IN" in proc.stderr
    # harvested = node-seconds inside completed steps, not the tasks squeue showed running
    assert saved["harvest_counted_from"].startswith("workers' step logs")
    assert saved["harvested_node_seconds"] == pytest.approx(recount(out, saved["steps_read_at"]),
                                                              abs=0.11)
    assert 0 < saved["harvested_node_seconds"] <= 1.02 * saved["held_node_seconds"] + 1.0
    # every worker that completed a step wrote its start-up line, and the summary read them
    assert saved["startups"]["count"] > 0 and 0 < saved["startups"]["median_s"] < 60
    counters = list((out / "jobs").glob("checkpoints-*/counters.json"))
    assert counters and sum(json.loads(p.read_text())["samples"] for p in counters) \
        >= saved["samples"]
