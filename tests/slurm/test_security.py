"""Users cannot steer their elastic tasks around the allocator (a second real user)."""

from __future__ import annotations

import pytest
from slurm_helpers import SCRIPT, elastic, task_state, wait_task

from devtools.localcluster import LocalCluster

pytestmark = pytest.mark.security


@pytest.mark.parametrize("argv", [
    ["scontrol", "release", "{job}_0"],
    ["scontrol", "release", "{job}"],
    ["scontrol", "hold", "{job}_1"],
    ["scontrol", "update", "JobId={job}_0", "ReqNodeList=n01"],
    ["scontrol", "update", "JobId={job}_0", "TimeLimit=5"],
    ["scontrol", "update", "JobId={job}", "Comment=x"],
    ["scontrol", "update", "JobId={job}", "AdminComment=mine"],
    ["scontrol", "update", "JobId={job}", "Partition=prod"],
])
def test_owner_cannot_release_hold_or_retag(cluster: LocalCluster, test_user: str,
                                            argv: list[str]) -> None:
    job = elastic(cluster, "1-3", user=test_user)
    res = cluster.run([a.format(job=job) for a in argv], user=test_user, check=False)
    assert res.returncode != 0
    assert "Access/permission denied" in res.stderr
    rec = cluster.show_jobs(f"{job}_0")[0]
    assert rec["JobState"] == "PENDING" and rec["Reason"] == "JobHeldUser"
    assert rec["AdminComment"] == "malletrain:min=1,max=3"
    assert rec["Partition"] == "preemptable"


def test_owner_can_still_cancel(cluster: LocalCluster, test_user: str) -> None:
    job = elastic(cluster, "1-2", user=test_user)
    cluster.run(["scancel", job], user=test_user)
    cluster.wait_for("array gone", lambda: not cluster.run(
        ["squeue", "-h", "-j", job, "-o", "%i"], check=False).stdout.strip(), 15)


def test_root_releases_the_users_task(cluster: LocalCluster, test_user: str) -> None:
    job = elastic(cluster, "1-2", user=test_user)
    cluster.run(["scontrol", "update", f"JobId={job}_1", "ReqNodeList=n02"])
    cluster.run(["scontrol", "release", f"{job}_1"])
    wait_task(cluster, f"{job}_1", "RUNNING")
    assert task_state(cluster, f"{job}_1")[2] == "n02"
    assert cluster.show_jobs(f"{job}_1")[0]["UserId"].startswith(test_user)


def test_regular_job_cannot_be_moved_into_the_qos(cluster: LocalCluster,
                                                  test_user: str) -> None:
    job = cluster.sbatch("-p", "preemptable", "--hold", "-o", "/dev/null", "--chdir=/tmp",
                         user=test_user, script=SCRIPT)
    res = cluster.run(["scontrol", "update", f"JobId={job}", "QOS=malletrain"], user=test_user,
                      check=False)
    assert res.returncode != 0
    cluster.run(["scontrol", "update", f"JobId={job}", "Comment=fine"], user=test_user)
    assert cluster.show_jobs(job)[0]["Comment"] == "fine"
