"""The daemon's view is Slurm's: a wrong view planted behind a real daemon's back is corrected.

A real ``malletraind`` on the local cluster, stand-in tasks (no torch). With
``allocator.max_running_jobs = 1`` a second elastic job waits, every task of it held, while
idle nodes are left: an administrator's ``scontrol release`` of one of its tasks then runs a
task the daemon thinks held (the engine gives that job no node), and the daemon shrinks it again
within its next poll, with one line saying what differed (``daemon/reconcile.view_fixes``). The
reverse, a worker the daemon thinks running that Slurm holds (``scontrol requeuehold`` behind
its back), is taken from the job and the job grows back. Assertions read Slurm; the daemon's
view is compared with it as ``tests/slurm/slurm_helpers.views_differ`` does.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from slurm_helpers import elastic, wait_agree

from devtools.localcluster import LocalCluster
from devtools.localcluster.daemon import LocalDaemon

DIFFERED = "the engine's nodes differed from the batch system's tasks"


@pytest.fixture
def daemon(request: pytest.FixtureRequest, cluster: LocalCluster,
           tmp_path: Path) -> Iterator[LocalDaemon]:
    d = LocalDaemon(cluster, root=tmp_path / f"malletraind-{uuid.uuid4().hex[:8]}",
                    settings={"allocator": {"max_running_jobs": 1},
                              "profiler": {"enabled": False}})
    d.start()
    yield d
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        print(f"\n==== malletraind's view ====\n{d.snapshot()}\n==== its log ====\n"
              f"{d.log_tail(60)}")
    d.stop()


def states(cluster: LocalCluster, job: str) -> dict[str, tuple[str, str]]:
    """Task id → (state, node) of the job's tasks."""
    out = cluster.run(["squeue", "-h", "-r", "-j", job, "-t", "all", "-o", "%i|%T|%N"],
                      check=False).stdout
    return {t: (s, n) for t, s, n in (line.split("|") for line in out.splitlines() if line)}


def running(cluster: LocalCluster, job: str) -> dict[str, str]:
    return {t: n for t, (s, n) in states(cluster, job).items() if s == "RUNNING"}


def differed(daemon: LocalDaemon, offset: int) -> list[str]:
    return [line for line in daemon.log_text()[offset:].splitlines() if DIFFERED in line]


def two_jobs(cluster: LocalCluster, daemon: LocalDaemon) -> tuple[str, str]:
    first = elastic(cluster, "1-2")
    cluster.wait_for("the first job on two nodes", lambda: len(running(cluster, first)) == 2, 60)
    second = elastic(cluster, "1-2")
    cluster.wait_for("the second job seen, waiting", lambda: any(
        j["job"] == second for j in daemon.query("jobs")["jobs"]), 30)
    wait_agree(cluster, daemon)
    assert running(cluster, second) == {}
    return first, second


def test_a_task_released_behind_the_daemons_back_is_shrunk_with_one_line(
        cluster: LocalCluster, daemon: LocalDaemon) -> None:
    first, second = two_jobs(cluster, daemon)
    offset = len(daemon.log_text())
    task = f"{second}_0"
    cluster.run(["scontrol", "update", f"JobId={task}", "StartTime=now"])
    cluster.run(["scontrol", "release", task])
    # Seen once in five runs (after tests/slurm/test_liveness.py): no line within 30 s, the
    # cause not kept; the wait is longer now, and a timeout dumps squeue, sinfo and the logs.
    cluster.wait_for(f"{task} started by Slurm", lambda: states(cluster, second).get(
        task, ("", ""))[0] in ("RUNNING", "COMPLETING") or bool(differed(daemon, offset)), 60)
    cluster.wait_for(f"{task} held again", lambda: task not in running(cluster, second)
                     and states(cluster, second).get(task, ("", ""))[0] == "PENDING", 30)
    lines = differed(daemon, offset)
    assert len(lines) == 1 and f"job {second} runs on " in lines[0] and "(shrunk)" in lines[0], \
        lines
    assert len(running(cluster, first)) == 2
    wait_agree(cluster, daemon)
    assert differed(daemon, offset) == lines  # corrected once, not again and again


def test_a_worker_held_behind_the_daemons_back_is_taken_from_its_job_which_grows_back(
        cluster: LocalCluster, daemon: LocalDaemon) -> None:
    first, _ = two_jobs(cluster, daemon)
    task = sorted(running(cluster, first))[0]
    cluster.run(["scontrol", "requeuehold", task])
    cluster.wait_for(f"{task} held", lambda: task not in running(cluster, first), 30)
    cluster.wait_for("the first job back on two nodes",
                     lambda: len(running(cluster, first)) == 2, 90)
    wait_agree(cluster, daemon)
