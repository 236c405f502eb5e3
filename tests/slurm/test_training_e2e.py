"""Real elastic torch training under real Slurm, directed by a real malletraind.

Two jobs submitted with ``sbatch --qos=malletrain -N 1-3`` train examples/train_elastic.py
(gloo DDP) on the idle nodes of the local cluster. The assertions read Slurm (squeue) and the
workers' own output, never the daemon's view: each epoch's world size equals the job's
RUNNING tasks, parameters are identical on all ranks after a step, and the step counter only
ever rolls back to the last checkpoint — through profiling rescales, a preemption by prod jobs
and the grow back when they end. At most 5 workers run at once on these 2 cores.
"""

from __future__ import annotations

import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from slurm_helpers import running, wait_consistent
from training_logs import invariant_problems, read_job

from devtools.localcluster import LocalCluster
from devtools.localcluster.daemon import LocalDaemon

pytestmark = [pytest.mark.torch, pytest.mark.slow]

TRAIN = [sys.executable, "examples/train_elastic.py", "--steps", "0", "--batch", "16",
         "--step-sleep-s", "0.1", "--checkpoint-every-s", "8", "--log-every", "5"]


@pytest.fixture
def daemon(request: pytest.FixtureRequest, cluster: LocalCluster,
           tmp_path: Path) -> Iterator[LocalDaemon]:
    # A profiling window long enough for steady measurements on these loaded cores.
    d = LocalDaemon(cluster, root=tmp_path / f"malletraind-{uuid.uuid4().hex[:8]}",
                    settings={"profiler": {"window_s": 15.0}})
    d.start()
    yield d
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        print(f"\n==== malletraind's view ====\n{d.snapshot()}")
    d.stop()
    if rep is not None and rep.failed:
        print(f"\n==== malletraind log ====\n{d.log_tail(80)}")


def submit(cluster: LocalCluster, daemon: LocalDaemon, nodes: str, outdir: Path,
           *options: str) -> str:
    script = daemon.training_script(TRAIN, outdir)
    return cluster.sbatch("--qos=malletrain", "-N", nodes, "--open-mode=append", *options,
                          "-o", f"{outdir}/task-%A_%a.out", script=script)


def test_two_elastic_jobs_train_shrink_on_preemption_and_grow_back(
        cluster: LocalCluster, daemon: LocalDaemon, tmp_path: Path) -> None:
    outdir = tmp_path / "out"
    outdir.mkdir()
    outdir.chmod(0o777)
    cluster.sbatch("-p", "prod", "-N", "3", "-o", "/dev/null", "--wrap", "sleep 3000")
    # One job is profiled by the JPA, the other opts out (a fixed size follows the idle nodes).
    jobs = [submit(cluster, daemon, "1-3", outdir, *opts) for opts in ((), ("--comment=profile=no",))]
    for job in jobs:
        wait_consistent(cluster, job, outdir, timeout_s=180)
    before = {job: read_job(outdir, job).max_step() for job in jobs}

    # Prod jobs take 4 of the 5 harvested nodes: Slurm preempts the workers there.
    prod = cluster.sbatch("-p", "prod", "-N", "4", "-o", "/dev/null", "--wrap", "sleep 3000")
    cluster.wait_for(f"prod job {prod} running",
                     lambda: cluster.run(["squeue", "-h", "-j", prod, "-t", "R",
                                          "-o", "%i"]).stdout.strip() != "", 30)
    survivors = [job for job in jobs if running(cluster, job) > 0]
    assert sum(running(cluster, job) for job in jobs) <= 1, "workers left on prod's nodes"
    for job in survivors:
        k, _ = wait_consistent(cluster, job, outdir, timeout_s=120)
        assert k == 1

    # The prod job ends (cancelled once the survivor trains alone): the elastic jobs grow
    # back onto its nodes.
    cluster.run(["scancel", prod])
    cluster.wait_for(f"prod job {prod} ended", lambda: not cluster.run(
        ["squeue", "-h", "-j", prod, "-o", "%i"], check=False).stdout.strip(), 90)
    cluster.wait_for("5 harvested nodes again",
                     lambda: sum(running(cluster, job) for job in jobs) == 5, 120)
    for job in jobs:
        cluster.wait_for(f"job {job} training past step {before[job]}",
                         lambda j=job: read_job(outdir, j).max_step() > before[j], 150)
        wait_consistent(cluster, job, outdir, timeout_s=150)

    for job in jobs:
        log = read_job(outdir, job)
        assert log.max_step() > before[job], f"job {job} made no progress after the preemption"
        assert len(log.epochs) >= 2, f"job {job} never changed its membership"
        assert not invariant_problems(log), "\n".join(invariant_problems(log))


def test_training_goes_on_while_the_daemon_is_killed_and_restarted(
        cluster: LocalCluster, daemon: LocalDaemon, tmp_path: Path) -> None:
    outdir = tmp_path / "out"
    outdir.mkdir()
    job = submit(cluster, daemon, "2-2", outdir)
    _, epoch = wait_consistent(cluster, job, outdir, timeout_s=180, at_least=2)

    daemon.kill()  # SIGKILL: no chance to save anything
    at_kill = read_job(outdir, job).max_step()
    queued = submit(cluster, daemon, "1-1", outdir)  # submissions still queue
    prod = cluster.sbatch("-p", "prod", "-N", "1", "-o", "/dev/null", "--wrap", "sleep 1")
    cluster.wait_for(f"prod job {prod} done", lambda: not cluster.run(
        ["squeue", "-h", "-j", prod, "-o", "%i"], check=False).stdout.strip(), 30)
    time.sleep(8)
    log = read_job(outdir, job)
    assert log.max_step() > at_kill, "training stopped with the daemon"
    assert log.latest() is not None and log.latest()[0] == epoch, "the epoch changed"
    assert running(cluster, queued) == 0, "a task started without the daemon's order"
    ctld = (cluster.run_dir / "log" / "slurmctld.log").read_text(errors="replace")
    assert not [line for line in ctld.splitlines()
                if f"JobId={prod}" in line and "pilog" in line and "error" in line.lower()]

    daemon.start()
    wait_consistent(cluster, queued, outdir, timeout_s=150)
    _, after = wait_consistent(cluster, job, outdir, timeout_s=60, at_least=2)
    log = read_job(outdir, job)
    assert after == epoch, "the restarted daemon should keep the running epoch"
    assert log.max_step() > at_kill
    for j in (job, queued):
        problems = invariant_problems(read_job(outdir, j))
        assert not problems, "\n".join(problems)
