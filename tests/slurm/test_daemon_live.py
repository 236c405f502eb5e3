"""malletraind as deployed: a real daemon process on the real local cluster.

The workers here are stand-in tasks (a sleeping or exiting script, no torch), so these tests
check the batch-system side: PLANNED holes used within their ends without delaying the prod
job they are planned for, a finished job releasing every node, ``scancel`` leaving nothing
behind. Assertions read Slurm (squeue, sinfo, scontrol), never the daemon's view.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from ClusterShell.NodeSet import NodeSet
from slurm_helpers import SCRIPT, elastic

from devtools.localcluster import LocalCluster
from devtools.localcluster.daemon import LocalDaemon


@pytest.fixture
def daemon(request: pytest.FixtureRequest, cluster: LocalCluster,
           tmp_path: Path) -> Iterator[LocalDaemon]:
    d = LocalDaemon(cluster, root=tmp_path / f"malletraind-{uuid.uuid4().hex[:8]}")
    d.start()
    yield d
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        print(f"\n==== malletraind's view ====\n{d.snapshot()}")
    d.stop()
    if rep is not None and rep.failed:
        print(f"\n==== malletraind log ====\n{d.log_tail(60)}")


def epoch(text: str) -> float:
    return time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S"))


def tasks(cluster: LocalCluster, job: str, states: str = "R") -> list[tuple[str, str, str]]:
    """(task id, node, end time) of the job's tasks in ``states``."""
    out = cluster.run(["squeue", "-h", "-r", "-j", job, "-t", states, "-o", "%i|%N|%e"],
                      check=False).stdout
    return [tuple(line.split("|")) for line in out.splitlines() if line]  # type: ignore[misc]


def idle_nodes(cluster: LocalCluster) -> set[str]:
    out = cluster.run(["sinfo", "-h", "-N", "-p", "preemptable", "-o", "%N|%T"]).stdout
    return {n for n, s in (line.split("|") for line in out.splitlines()) if s == "idle"}


def test_planned_hole_is_harvested_and_the_prod_job_starts_on_time(
        cluster: LocalCluster, daemon: LocalDaemon) -> None:
    nodes = cluster.node_names
    first = cluster.sbatch("-p", "prod", "-N", "3", "-t", "3", "-o", "/dev/null",
                           "--wrap", "sleep 100")
    cluster.wait_for("first prod job running", lambda: cluster.run(
        ["squeue", "-h", "-j", first, "-t", "R", "-o", "%i"]).stdout.strip() != "", 20)
    wide = cluster.sbatch("-p", "prod", "-N", str(len(nodes)), "-t", "2", "-o", "/dev/null",
                          "--wrap", "sleep 5")

    def planned() -> float | None:
        out = cluster.run(["squeue", "-h", "-t", "PD", "--start", "-j", wide, "-o", "%S"],
                          check=False).stdout.strip()
        return epoch(out) if out and out[0].isdigit() else None

    cluster.wait_for("the wide job's plan", lambda: planned() is not None, 30)
    plan = planned()
    assert plan is not None
    job = elastic(cluster, "1-5")
    cluster.wait_for("the elastic job on the planned nodes",
                     lambda: len(tasks(cluster, job)) == len(nodes) - 3, 60)
    busy = set(NodeSet(cluster.run(["squeue", "-h", "-j", first, "-o", "%N"]).stdout.strip()))
    for task, node, end in tasks(cluster, job):
        assert node not in busy, f"{task} runs on {node}, a node of the running prod job"
        assert epoch(end) <= plan, f"task {task} on {node} ends at {end}, after the hole"
    start_plan = planned()
    assert start_plan is not None and abs(start_plan - plan) <= 61

    # The wide prod job starts when the first one ends, no later than planned; the workers
    # have left by then (time limit or preemption) and come back afterwards. The first job
    # is cancelled now (it would run 100 s, still well before the plan at its 3-minute
    # limit: either way the wide job starts early and preempts the workers).
    cluster.run(["scancel", first])
    cluster.wait_for("the wide job running", lambda: cluster.run(
        ["squeue", "-h", "-j", wide, "-t", "R,CD,CG", "-o", "%i"],
        check=False).stdout.strip() != "" or not cluster.run(
        ["squeue", "-h", "-j", wide, "-o", "%i"], check=False).stdout.strip(), 200)
    shown = cluster.run(["scontrol", "show", "job", wide, "-o"], check=False).stdout
    started = epoch(shown.split("StartTime=")[1].split()[0])
    assert started <= plan + 1, f"the prod job started at {started}, planned for {plan}"
    cluster.wait_for("the elastic job back on idle nodes",
                     lambda: len(tasks(cluster, job)) >= 1, 90)


def test_a_finished_job_releases_every_node_and_its_held_tasks_are_cancelled(
        cluster: LocalCluster, daemon: LocalDaemon) -> None:
    job = cluster.sbatch("--qos=malletrain", "-N", "2-5", "-o", "/dev/null", "--chdir=/tmp",
                         script="#!/bin/sh\nsleep 8\nexit 0\n")
    cluster.wait_for("workers running", lambda: len(tasks(cluster, job)) >= 2, 60)
    cluster.wait_for("the job gone from the queue", lambda: not tasks(
        cluster, job, "PD,R,CG,S"), 90)
    cluster.wait_for("every node idle", lambda: idle_nodes(cluster) == set(cluster.node_names),
                     30)
    states = cluster.run(["scontrol", "show", "job", job, "-o"], check=False).stdout
    assert "JobState=COMPLETED" in states


def test_scancel_leaves_nothing_behind(cluster: LocalCluster, daemon: LocalDaemon) -> None:
    job = elastic(cluster, "1-4")
    cluster.wait_for("workers running", lambda: len(tasks(cluster, job)) >= 1, 60)
    cluster.run(["scancel", job])
    cluster.wait_for("the job gone from the queue",
                     lambda: not tasks(cluster, job, "PD,R,CG,S"), 60)
    cluster.wait_for("every node idle", lambda: idle_nodes(cluster) == set(cluster.node_names),
                     30)
    # The daemon is still there and harvests for the next job.
    again = cluster.sbatch("--qos=malletrain", "-N", "1-2", "-o", "/dev/null", "--chdir=/tmp",
                           script=SCRIPT)
    cluster.wait_for("the next job running", lambda: len(tasks(cluster, again)) == 2, 60)
    assert daemon.running()
