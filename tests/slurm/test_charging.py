"""How harvested node-hours are charged, checked in accounting mode (slurmdbd, preempt/qos,
priority/multifactor so that slurmctld keeps each association's usage).

An elastic task runs under the ``malletrain`` QOS (job_submit.lua keeps it where
KEEP_QOS = true); slurmctld charges its time to the user's association multiplied by that
QOS's ``UsageFactor``, which is what fairshare and GrpTRESMins limits see. The test runs one
elastic task and one regular job for the same time on one node each and compares the growth
of the association's raw usage (``sshare``), with UsageFactor=0.25 on the malletrain QOS; and
``sacct`` records the task under the QOS, so a site can report harvested node-hours apart.
Skipped unless MariaDB and slurmdbd are installed.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator

import pytest
from slurm_helpers import cluster_root, elastic, grow, start_cluster, wait_task

from devtools.localcluster import LocalCluster

pytestmark = pytest.mark.skipif(
    not (shutil.which("slurmdbd") and shutil.which("mariadbd")),
    reason="accounting mode needs slurmdbd and MariaDB: MALLETRAIN_ACCOUNTING=1 "
           "scripts/setup-machine.sh")

FACTOR = 0.25
RUN_S = 12


@pytest.fixture(scope="module")
def charged() -> Iterator[LocalCluster]:
    with cluster_root("charge") as root:
        cluster = start_cluster(root, nodes=2, mode="accounting", extra_conf=[
            "PriorityType=priority/multifactor", "PriorityCalcPeriod=1"])
        try:
            yield cluster
        finally:
            cluster.stop()


def raw_usage(cluster: LocalCluster) -> float:
    """root's raw usage over its associations (its jobs go to its default account)."""
    out = cluster.run(["sshare", "-h", "-P", "-u", "root", "-o", "Account,User,RawUsage"]).stdout
    rows = [line.split("|") for line in out.splitlines() if line.strip()]
    return sum(float(r[2]) for r in rows if r[1].strip() == "root")


def settle(cluster: LocalCluster, before: float, timeout_s: float = 65.0) -> float:
    """The usage once a job has ended: slurmctld's multifactor plugin adds what is left of a
    job's usage as it ends (measured: the usage had grown in the same read that found the job
    gone, and did not change over the next 87 s), so this waits for the usage to grow past
    ``before`` and then to hold for 3 s."""
    deadline = time.monotonic() + timeout_s
    now = raw_usage(cluster)
    while now <= before and time.monotonic() < deadline:
        time.sleep(1.0)
        now = raw_usage(cluster)
    while time.monotonic() < deadline:
        time.sleep(3.0)
        again = raw_usage(cluster)
        if again == now:
            break
        now = again
    return now


def test_harvested_time_is_charged_at_the_qos_usage_factor(charged: LocalCluster) -> None:
    cluster = charged
    cluster.run(["sacctmgr", "-i", "modify", "qos", "malletrain", "set",
                 f"UsageFactor={FACTOR}"])
    script = f"#!/bin/sh\nexec sleep {RUN_S}\n"
    start = raw_usage(cluster)
    job = cluster.sbatch("--qos=malletrain", "-N", "1-1", "-o", "/dev/null",
                         "--chdir=/tmp", script=script)
    grow(cluster, f"{job}_0", cluster.node_names[0])
    wait_task(cluster, f"{job}_0", "RUNNING", 30)
    cluster.wait_for("the task ends", lambda: not cluster.run(
        ["squeue", "-h", "-j", job], check=False).stdout.strip(), RUN_S + 60)
    mid = settle(cluster, start)
    elastic_usage = mid - start

    prod = cluster.sbatch("-N", "1", "-o", "/dev/null", "--chdir=/tmp", script=script)
    cluster.wait_for("the regular job ends", lambda: not cluster.run(
        ["squeue", "-h", "-j", prod], check=False).stdout.strip(), RUN_S + 60)
    regular_usage = settle(cluster, mid) - mid

    print(f"raw usage: elastic {elastic_usage:g}, regular {regular_usage:g}")
    assert regular_usage > 0 and elastic_usage > 0
    ratio = elastic_usage / regular_usage
    print(f"ratio {ratio:.3f}")
    # Same run time on the same kind of node; the start/end seconds round differently.
    assert FACTOR * 0.6 < ratio < FACTOR * 1.5
    rows = cluster.run(["sacct", "-n", "-P", "-X", "-j", f"{job}_0,{prod}",
                        "-o", "JobID,QOS,AllocTRES,ElapsedRaw"]).stdout.splitlines()
    qos = {r.split("|")[0]: r.split("|")[1] for r in rows if r.strip()}
    assert qos.get(f"{job}_0") == "malletrain" and qos.get(prod) == "normal"


def test_elastic_jobs_keep_the_qos_that_charges_them(charged: LocalCluster) -> None:
    """KEEP_QOS = true in accounting mode: the held array carries the malletrain QOS, so every
    task the daemon releases is charged at its UsageFactor."""
    job = elastic(charged, "1-2")
    assert charged.show_jobs(job)[0]["QOS"] == "malletrain"
    charged.run(["scancel", job])
