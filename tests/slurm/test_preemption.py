"""Grow, shrink and preemption of elastic tasks, and the EpilogSlurmctld datagrams they cause."""

from __future__ import annotations

import time

from slurm_helpers import SCRIPT, elastic, grow, squeue, task_state, wait_message, wait_task

from devtools.localcluster import LocalCluster
from malletrain_core.wire.hooks import HookSocket, expand_hostlist


def test_admin_hold_on_running_task_survives_preemption(cluster: LocalCluster) -> None:
    job = elastic(cluster, "1-2")
    task = f"{job}_0"
    grow(cluster, task, "n03")
    wait_task(cluster, task, "RUNNING")
    cluster.run(["scontrol", "hold", task])
    assert task_state(cluster, task) == ("RUNNING", "JobHeldAdmin", "n03")
    prod = cluster.sbatch("-w", "n03", "-o", "/dev/null", script=SCRIPT)
    waited = wait_task(cluster, prod, "RUNNING")
    assert task_state(cluster, task)[:2] == ("PENDING", "JobHeldAdmin")
    assert cluster.show_jobs(task)[0]["Restarts"] == "1"
    time.sleep(cluster.timings.cred_expire_s + 2)  # past the requeue delay: still held
    assert task_state(cluster, task)[:2] == ("PENDING", "JobHeldAdmin")
    print(f"prod job started {waited:.2f} s after its submission")


def test_preempted_task_without_hold_restarts_by_itself(cluster: LocalCluster) -> None:
    """Why the daemon holds running tasks: otherwise Slurm restarts a preempted one by itself
    once the requeue delay (cred_expire + 1 s) has passed."""
    job = elastic(cluster, "1-1")
    task = f"{job}_0"
    grow(cluster, task, "n04")
    wait_task(cluster, task, "RUNNING")
    cluster.sbatch("-w", "n04", "-o", "/dev/null", "--wrap", "sleep 2")
    wait_task(cluster, task, "PENDING")
    t0 = time.monotonic()
    assert cluster.show_jobs(task)[0]["Restarts"] == "1"
    wait_task(cluster, task, "RUNNING", timeout_s=cluster.timings.cred_expire_s + 30)
    waited = time.monotonic() - t0
    assert waited > cluster.timings.cred_expire_s - 2
    print(f"restarted by Slurm {waited:.1f} s after it was preempted")


def test_requeuehold_shrinks_back_to_held(cluster: LocalCluster) -> None:
    job = elastic(cluster, "1-2")
    task = f"{job}_1"
    grow(cluster, task, "n05")
    wait_task(cluster, task, "RUNNING")
    cluster.run(["scontrol", "requeuehold", task])
    wait_task(cluster, task, "PENDING", reason="job requeued in held state")
    cluster.wait_idle(20)
    grow(cluster, task, "n06")  # StartTime=now lifts the requeue delay: starts again at once
    waited = wait_task(cluster, task, "RUNNING", timeout_s=cluster.timings.cred_expire_s)
    assert task_state(cluster, task)[2] == "n06"
    print(f"regrown {waited:.2f} s after release")


def test_epilog_datagram_on_job_end(cluster: LocalCluster, hook_listener: HookSocket) -> None:
    job = cluster.sbatch("-N", "2", "-o", "/dev/null", "--wrap", "sleep 1; exit 3")
    wait_task(cluster, job, "RUNNING")
    nodes = expand_hostlist(squeue(cluster, job, "%N"))
    got = wait_message(hook_listener, lambda m: m.job == job)
    msg = got.message
    assert (msg.src, msg.exit, msg.partition, msg.restarts) == ("slurm-epilog", "3:0", "prod", 0)
    assert (msg.user, msg.uid, got.uid) == ("root", 0, 0)
    assert len(nodes) == 2 and msg.nodes == nodes


def test_epilog_datagram_on_preemption(cluster: LocalCluster,
                                       hook_listener: HookSocket) -> None:
    job = elastic(cluster, "1-2")
    task = f"{job}_1"
    grow(cluster, task, "n07")
    wait_task(cluster, task, "RUNNING")
    cluster.run(["scontrol", "hold", task])
    t0 = time.time()
    prod = cluster.sbatch("-w", "n07", "-o", "/dev/null", script=SCRIPT)
    got = wait_message(hook_listener, lambda m: m.job == task)
    latency = got.message.t - t0
    msg = got.message
    assert (msg.nodes, msg.partition, msg.restarts) == (("n07",), "preemptable", 1)
    wait_task(cluster, prod, "RUNNING")
    assert squeue(cluster, task, "%T|%r") == "PENDING|JobHeldAdmin"
    assert latency < 10
    print(f"preemption datagram {latency:.2f} s after the prod submission")


def test_epilog_datagram_on_requeuehold(cluster: LocalCluster,
                                        hook_listener: HookSocket) -> None:
    job = elastic(cluster, "1-1")
    task = f"{job}_0"
    grow(cluster, task, "n08")
    wait_task(cluster, task, "RUNNING")
    cluster.run(["scontrol", "requeuehold", task])
    msg = wait_message(hook_listener, lambda m: m.job == task).message
    assert msg.nodes == ("n08",) and msg.restarts == 1
