"""A production job submitted at the moment the daemon grows: the grow must not take the nodes
the job is about to get (Slurm would then start the job only at a later preemption round,
about 12 s on this cluster), and grows go on once Slurm has planned or started it.

The moment is made, not waited for: a cluster of its own whose main scheduling loop runs at
most once a second (``sched_min_interval``, which large sites raise to keep slurmctld
responsive), so a released task waits up to a second for its start, and the backend itself
(not a daemon, whose timing a test cannot hold) releases a task and, within milliseconds, sees
a prod job submitted and is told of it as job_submit.lua's datagram tells the daemon
(``other_submitted``). Tried first as a live daemon driven in rounds on the session's cluster:
on a quiet machine a released task started within milliseconds, and 8 rounds in a row never
caught one waiting; on the throttled cluster the daemon's own timing (a job still in its
one-scale probe grows back only when the probe's window ends) made the moment rare again.
The daemon's side of it (the hook's datagram calls ``other_submitted`` on the cycle thread) is
what the one-hour soak exercises (BENCHMARKS.md, "Soak").
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from slurm_helpers import after_test, cluster_root, elastic, start_cluster, task_state

from devtools.localcluster import LocalCluster
from devtools.localcluster.daemon import LocalDaemon
from malletrain_core.backends.slurm.backend import SlurmBackend
from malletrain_core.events import Grow, JobSubmitted, NodesIdle, WorkerStarted, WorkerStopped
from malletrain_core.runner import CommandRunner

START_BOUND_S = 5.0
"""Submission to RUNNING: a preemption (KillWait 2 s) and two scheduling passes (1 s) fit; a
second preemption round does not."""

THROTTLED = ("SchedulerParameters=bf_interval=1,batch_sched_delay=0,"
             "sched_min_interval=1000000")
"""The test timings' scheduler line (slurm.conf.in) with the main loop throttled to 1 s; the
last SchedulerParameters line of slurm.conf wins."""


@pytest.fixture
def throttled(request: pytest.FixtureRequest) -> Iterator[LocalCluster]:
    with cluster_root("race") as root:
        cluster = start_cluster(root, nodes=4, extra_conf=[THROTTLED])
        try:
            yield cluster
            after_test(request, cluster)
        finally:
            cluster.stop()


def running_workers(cluster: LocalCluster, job: str) -> int:
    out = cluster.run(["squeue", "-h", "-r", "-j", job, "-t", "R", "-o", "%i"],
                      check=False).stdout
    return len(out.split())


def state(cluster: LocalCluster, job: str) -> str:
    return cluster.run(["squeue", "-h", "-j", job, "-o", "%T"], check=False).stdout.strip()


def test_a_prod_job_submitted_as_a_grow_is_released_gets_the_node_at_once(
        throttled: LocalCluster) -> None:
    cluster = throttled
    assert "sched_min_interval=1000000" in cluster.run(["scontrol", "show", "config"]).stdout
    backend = SlurmBackend(CommandRunner(env=cluster.env), grant_timeout_s=60)
    job = elastic(cluster, "1-4", "--comment=profile=no")
    seen = []
    deadline = time.monotonic() + 30
    while not any(isinstance(e, JobSubmitted) for e in seen):
        assert time.monotonic() < deadline, seen
        seen += backend.poll(time.time())
        time.sleep(0.2)
    idle = [n.name for e in seen if isinstance(e, NodesIdle) for n in e.nodes]
    assert idle == cluster.node_names, idle
    # Workers on n02-n04; n01 stays idle for the grow of the race.
    assert backend.execute([Grow(job, ("n02", "n03", "n04"), None)], time.time()) == []
    cluster.wait_for("three workers", lambda: running_workers(cluster, job) == 3, 30)
    backend.poll(time.time())

    backend.execute([Grow(job, ("n01",), None)], time.time())  # released, not started
    prod = cluster.sbatch("-p", "prod", "-N", "2", "-o", "/dev/null", "--wrap", "sleep 5")
    t0 = time.monotonic()
    held = backend.other_submitted()  # what the daemon does on job_submit.lua's datagram
    (key,) = backend.launching
    assert held == 1, f"the released task started before the hold: {task_state(cluster, key)}"
    cluster.wait_for("the prod job running", lambda: state(cluster, prod) == "RUNNING",
                     START_BOUND_S, interval_s=0.05)
    delay = time.monotonic() - t0
    nodes = cluster.run(["squeue", "-h", "-j", prod, "-o", "%N"]).stdout.strip()
    events = backend.poll(time.time())
    assert WorkerStopped(events[0].time, job, "n01") in events, events  # the grow failed
    assert not [e for e in events if isinstance(e, WorkerStarted)], events
    assert task_state(cluster, key)[0] == "PENDING", task_state(cluster, key)
    print(f"prod job on {nodes} {delay:.2f} s after its submission; the task released onto "
          f"n01 was held again and never started")
    cluster.run(["scancel", prod, job], check=False)


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
