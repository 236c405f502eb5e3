"""Accounting mode: slurmdbd defines the malletrain QOS (slurm_conf/qos-setup.sh) and
preempt/qos does the preemption. Skipped unless MariaDB and slurmdbd are installed
(MALLETRAIN_ACCOUNTING=1 scripts/setup-machine.sh)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest
from slurm_helpers import (
    SCRIPT,
    after_test,
    cluster_root,
    elastic,
    grow,
    start_cluster,
    task_state,
    wait_task,
)

from devtools.localcluster import LocalCluster
from devtools.localcluster.accounting import add_user
from malletrain_core.errors import CommandError

pytestmark = pytest.mark.skipif(
    not (shutil.which("slurmdbd") and shutil.which("mariadbd")),
    reason="accounting mode needs slurmdbd and MariaDB: MALLETRAIN_ACCOUNTING=1 "
           "scripts/setup-machine.sh")


@pytest.fixture(scope="module")
def acct_cluster() -> Iterator[LocalCluster]:
    with cluster_root("acct") as root:
        cluster = start_cluster(root, nodes=3, mode="accounting")
        try:
            yield cluster
        finally:
            cluster.stop()


@pytest.fixture
def acct(request: pytest.FixtureRequest, acct_cluster: LocalCluster) -> Iterator[LocalCluster]:
    yield acct_cluster
    after_test(request, acct_cluster)


def test_qos_is_defined_and_preemptable_by_normal(acct: LocalCluster) -> None:
    rows = acct.run(["sacctmgr", "-n", "-P", "show", "qos",
                     "format=name,preempt,preemptmode,gracetime,priority"]).stdout.split()
    assert "malletrain||requeue|00:00:00|0" in rows
    assert any(r.startswith("normal|malletrain|") for r in rows)


def test_elastic_job_keeps_qos_and_is_preempted_by_qos(acct: LocalCluster) -> None:
    job = elastic(acct, "1-2")
    rec = acct.show_jobs(job)[0]
    assert (rec["QOS"], rec["AdminComment"]) == ("malletrain", "malletrain:min=1,max=2")
    task = f"{job}_0"
    grow(acct, task, "n02")
    wait_task(acct, task, "RUNNING")
    acct.run(["scontrol", "hold", task])
    prod = acct.sbatch("-w", "n02", "-o", "/dev/null", script=SCRIPT)
    wait_task(acct, prod, "RUNNING")
    assert task_state(acct, task)[:2] == ("PENDING", "JobHeldAdmin")
    sacct = acct.run(["sacct", "-n", "-X", "-P", "-j", task, "-o", "JobID,State"]).stdout
    assert f"{task}|PREEMPTED" in sacct.split()


def test_users_need_the_qos_granted(acct: LocalCluster, test_user: str) -> None:
    acct.run(["sacctmgr", "-i", "delete", "user", test_user], check=False)
    acct.run(["sacctmgr", "-i", "add", "user", test_user, "Account=mt",
              f"Cluster=mt{acct.port_base}"])
    with pytest.raises(CommandError) as err:
        elastic(acct, "1-2", user=test_user)
    assert "Invalid qos specification" in err.value.stderr
    add_user(acct, test_user)  # slurm_conf/qos-setup.sh USER: qos+=malletrain
    job = elastic(acct, "1-2", user=test_user)
    assert acct.show_jobs(job)[0]["QOS"] == "malletrain"
