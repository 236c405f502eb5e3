"""A production job submitted at the moment the daemon grows: the grow must not take the nodes
the job is about to get (Slurm would then start the job only at a later preemption round,
about 12 s on this cluster), and grows go on once Slurm has planned or started it.

Each round: an elastic job holds every node; a 2-node prod job preempts two workers and ends,
and the daemon, woken by its epilog, grows back onto the two nodes; at that moment (as soon as
squeue shows a task released and not yet started) a 3-node prod job is submitted, which needs
those two nodes and one preemption. ``MALLETRAIN_UNPLANNED_WAIT_S=0`` runs the same rounds with
the rule off. On this 8-node cluster with an otherwise empty queue they passed that way too
(Slurm's scheduler took the job at its submission, before the released task started): the
delay shows where the backfill pass handles the job, as under the soak's load (BENCHMARKS.md,
"Soak"). What this test holds the daemon to: the rule never delays the prod job and grows go on.
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

from slurm_helpers import elastic

from malletrain_core.localcluster import LocalCluster
from malletrain_core.localcluster.daemon import LocalDaemon

ROUNDS = 4
START_BOUND_S = 5.0
"""Submission to RUNNING: a preemption (KillWait 2 s) and two backfill cycles (1 s) fit; a
second preemption round does not."""


def running_workers(cluster: LocalCluster, job: str) -> int:
    out = cluster.run(["squeue", "-h", "-r", "-j", job, "-t", "R", "-o", "%i"],
                      check=False).stdout
    return len(out.split())


def state(cluster: LocalCluster, job: str) -> str:
    return cluster.run(["squeue", "-h", "-j", job, "-o", "%T"], check=False).stdout.strip()


def released(cluster: LocalCluster, job: str) -> bool:
    """A task of ``job`` released by a grow and not started (held ones and ones requeued by
    Slurm, waiting out the requeue delay, give other reasons)."""
    out = cluster.run(["squeue", "-h", "-r", "-j", job, "-t", "PD", "-o", "%r"],
                      check=False).stdout
    return any(r in ("None", "Priority", "Resources") for r in out.split())


def rounds(cluster: LocalCluster, tmp_path: Path, wait_s: float) -> tuple[list[float], int]:
    d = LocalDaemon(cluster, root=tmp_path / f"malletraind-{uuid.uuid4().hex[:8]}",
                    settings={"slurm": {"unplanned_wait_s": wait_s}})
    d.start()
    try:
        n = len(cluster.node_names)
        job = elastic(cluster, f"1-{n}", "--comment=profile=no")
        cluster.wait_for("the elastic job on every node",
                         lambda: running_workers(cluster, job) == n, 60)
        delays: list[float] = []
        hits = 0
        for _ in range(ROUNDS):
            first = cluster.sbatch("-p", "prod", "-N", "2", "-o", "/dev/null",
                                   "--wrap", "sleep 3")
            cluster.wait_for("the first prod job running",
                             lambda j=first: state(cluster, j) == "RUNNING", 30)
            cluster.wait_for("the first prod job ending",
                             lambda j=first: state(cluster, j) in ("", "COMPLETING"), 30,
                             interval_s=0.02)
            # The moment of the grow: a task of the elastic job released (not held) and not
            # started yet. A prod job submitted now is the one Slurm used to delay.
            t_end = time.monotonic()
            while time.monotonic() - t_end < 10:
                if released(cluster, job):
                    hits += 1
                    break
                time.sleep(0.01)
            t0 = time.monotonic()
            second = cluster.sbatch("-p", "prod", "-N", "3", "-o", "/dev/null",
                                    "--wrap", "sleep 2")
            cluster.wait_for("the second prod job running",
                             lambda j=second: state(cluster, j) in ("RUNNING", "COMPLETING", ""),
                             40, interval_s=0.05)
            delays.append(time.monotonic() - t0)
            cluster.wait_for("the second prod job gone", lambda j=second: state(cluster, j) == "",
                             30)
            # Grows go on afterwards: the elastic job is back on every node.
            cluster.wait_for("the elastic job regrown onto every node",
                             lambda: running_workers(cluster, job) == n, 60)
        print(f"unplanned_wait_s={wait_s:g}: prod start delays "
              f"{', '.join(f'{x:.2f}' for x in delays)} s; submitted at a grow {hits} times")
        return delays, hits
    finally:
        d.stop()


def test_a_prod_job_submitted_as_the_daemon_grows_starts_without_a_second_round(
        cluster: LocalCluster, tmp_path: Path) -> None:
    delays, hits = rounds(cluster, tmp_path,
                          float(os.environ.get("MALLETRAIN_UNPLANNED_WAIT_S", 60)))
    assert hits >= 1, "no round caught the daemon's grow in flight: nothing was tested"
    assert max(delays) <= START_BOUND_S, delays



def test_jobs_that_cannot_start_do_not_hold_grants_back(cluster: LocalCluster,
                                                        tmp_path: Path) -> None:
    """A site's queue holds many jobs that are never planned and cannot start now: held ones,
    ones waiting on a dependency. With 20 of them queued (and submitted as the daemon runs,
    so each is announced by job_submit.lua) an elastic job still grows onto every node in
    about the time it takes with an empty queue, far inside ``unplanned_wait_s``."""
    n = len(cluster.node_names)
    queued = [cluster.sbatch("--hold", "-p", "prod", "-N", "1", "-o", "/dev/null",
                             "--wrap", "true") for _ in range(18)]
    d = LocalDaemon(cluster, root=tmp_path / "malletraind",
                    settings={"slurm": {"unplanned_wait_s": 600}})
    d.start()
    try:
        queued += [cluster.sbatch("--hold", "-p", "prod", "-N", "1", "-o", "/dev/null",
                                  "--wrap", "true"),
                   cluster.sbatch(f"--dependency=afterok:{queued[0]}", "-p", "prod", "-N", "1",
                                  "-o", "/dev/null", "--wrap", "true")]
        reasons = cluster.run(["squeue", "-h", "-p", "prod", "-t", "PD", "-o", "%r"]).stdout
        assert sorted(set(reasons.split())) == ["Dependency", "JobHeldUser"], reasons
        t0 = time.monotonic()
        job = elastic(cluster, f"1-{n}", "--comment=profile=no")
        cluster.wait_for("the elastic job on every node",
                         lambda: running_workers(cluster, job) == n, 120)
        took = time.monotonic() - t0
        print(f"grown onto {n} nodes in {took:.1f} s with {len(queued)} unstartable jobs queued")
        assert took < 120
    finally:
        d.stop()
        cluster.run(["scancel", *queued], check=False)
