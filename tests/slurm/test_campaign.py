"""The fault campaign's quick mode (``python -m bench.campaign --quick``) on a local Slurm
cluster of its own: one fault of each class, each injected into a real in-place job under
prod churn; no task may be lost, no granted node left idle past the grant deadline, and every
fault must be injected and recovered from."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.campaign_rigs import SlurmRig

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slurm, pytest.mark.torch,
              pytest.mark.skipif(os.geteuid() != 0, reason="the local cluster runs as root")]


def test_quick_campaign_loses_nothing() -> None:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-m", "bench.campaign", "--quick", "--json",
                           "--seed", "3"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=900, check=False)
    print(proc.stderr[-4000:])
    lines = proc.stdout.strip().splitlines()
    assert lines, f"no output (exit {proc.returncode}):\n{proc.stderr[-3000:]}"
    result = json.loads(lines[-1])
    rows = result["rows"]
    assert [r["fault"] for r in rows] == list(SlurmRig.classes)
    not_run = [f"{r['fault']}: {r['reason']}" for r in rows if not r["injected"]]
    assert not not_run, not_run
    assert result["tasks_lost"] == 0, [r["lost"] for r in rows if r["tasks_lost"]]
    assert result["stalled_nodes"] == 0, [r["stalled"] for r in rows if r["stalled_nodes"]]
    stuck = [f"{r['fault']}: {r['reason']}" for r in rows if not r["recovered"]]
    assert not stuck, stuck
    assert proc.returncode == 0
