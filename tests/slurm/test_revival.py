"""No revived jobs: a user's ``scancel`` during rescale churn is final.

Elastic jobs run real ``malletrain-run`` launchers with stand-in workers (signed progress
reports, no torch) so that the Job Profiling Advisor's scale-ups and step-downs and the jobs
that arrive keep the daemon growing and shrinking them (``scontrol requeuehold Incomplete``).
The test cancels a job at a random offset into that churn, then fails if any task of the
cancelled job is PENDING or RUNNING one poll interval after ``scancel`` returned (and looks
again a few seconds later, for a requeue decided before the cancel). ``make test`` makes 25
cancellations; ``make test-long`` 200 (``MALLETRAIN_REVIVAL_CANCELS``).
"""

from __future__ import annotations

import os
import random
import shlex
import sys
import time
import uuid
from pathlib import Path

import pytest

from devtools.localcluster import REPO, LocalCluster
from devtools.localcluster.daemon import LocalDaemon

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

CANCELS = int(os.environ.get("MALLETRAIN_REVIVAL_CANCELS", "25"))
SEED = int(os.environ.get("MALLETRAIN_REVIVAL_SEED", "0"))
POLL_S = 1.0
CHURN = {"profiler": {"enabled": True, "window_s": 2.0, "default_scale_up_s": 1.0,
                      "default_scale_down_s": 1.0},
         "daemon": {"poll_interval_s": POLL_S}}


def job_script(daemon: LocalDaemon, work: Path) -> str:
    exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in daemon.job_env.items())
    torchrun = shlex.join([sys.executable, str(REPO / "examples" / "standin_torchrun.py")])
    launcher = [sys.executable, "-m", "malletrain_core.worker.launcher", "--poll-s", "1",
                "--torchrun", torchrun, "--checkpoint-dir"]
    worker = [sys.executable, str(REPO / "examples" / "standin_worker.py"), "--sent-dir",
              str(work), "--interval-s", "0.5"]
    ckpt = f'{shlex.quote(str(work))}/ckpt-"$SLURM_ARRAY_JOB_ID"'
    return (f"#!/bin/bash\n{exports}cd {shlex.quote(str(REPO))}\n"
            f"exec {shlex.join(launcher)} {ckpt} -- {shlex.join(worker)}\n")


def alive(cluster: LocalCluster, job: str) -> list[str]:
    """Tasks of ``job`` PENDING or RUNNING (a revived task is one of these)."""
    out = cluster.run(["squeue", "-h", "-r", "-j", job, "-t", "PD,R", "-o", "%i %T %r"],
                      check=False).stdout
    return [line for line in out.splitlines() if line.strip()]


def test_a_cancelled_job_never_comes_back(cluster: LocalCluster, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    daemon = LocalDaemon(cluster, root=tmp_path / f"malletraind-{uuid.uuid4().hex[:8]}",
                         settings=CHURN)
    daemon.start()
    rng = random.Random(SEED)
    script = job_script(daemon, work)
    live: list[str] = []
    revived: list[str] = []
    try:
        for i in range(CANCELS):
            while len(live) < 3:
                live.append(cluster.sbatch("--qos=malletrain", "-N", f"1-{rng.randint(2, 6)}",
                                           "-o", "/dev/null", "-J", f"revival{i}",
                                           script=script))
            time.sleep(rng.uniform(0.3, 4.0))  # a random offset into the rescale churn
            victim = live.pop(rng.randrange(len(live)))
            cluster.run(["scancel", victim])
            time.sleep(POLL_S + 0.2)
            first = alive(cluster, victim)
            time.sleep(3 * POLL_S)
            later = alive(cluster, victim)
            if first or later:
                revived.append(f"{victim}: {first or later}")
        status = daemon.query("status")
    finally:
        for job in live:
            cluster.run(["scancel", job], check=False)
        daemon.stop()
    shrinks = status["daemon"]["actions"].get("Shrink", 0)
    grows = status["daemon"]["actions"].get("Grow", 0)
    print(f"{CANCELS} cancellations during {grows} grows and {shrinks} shrinks")
    assert revived == [], f"cancelled jobs came back: {revived}"
    assert shrinks >= CANCELS // 5 and grows >= CANCELS, \
        f"too little churn to test anything: {grows} grows, {shrinks} shrinks"
