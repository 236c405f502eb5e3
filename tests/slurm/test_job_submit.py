"""job_submit.lua inside a real slurmctld: what sbatch gets and what squeue/scontrol show."""

from __future__ import annotations

import pytest
from slurm_helpers import SCRIPT, elastic

from devtools.localcluster import LocalCluster
from malletrain_core.errors import CommandError


def test_range_becomes_held_array_in_preemptable(cluster: LocalCluster) -> None:
    job = elastic(cluster, "2-4", "--comment=model=resnet50,profile=no")
    lines = cluster.run(["squeue", "-h", "-r", "-j", job, "-o", "%i|%P|%T|%r|%D"]).stdout
    assert sorted(lines.split()) == [f"{job}_{i}|preemptable|PENDING|JobHeldUser|1"
                                     for i in range(4)]
    tasks = cluster.show_jobs(job)
    assert len(tasks) == 1  # still one array record: nothing split it
    rec = tasks[0]
    assert rec["ArrayTaskId"] == "0-3"
    assert rec["AdminComment"] == "malletrain:min=2,max=4,model=resnet50,profile=no"
    assert (rec["Priority"], rec["Requeue"], rec["NumNodes"]) == ("0", "1", "1-1")
    assert rec["OverSubscribe"] == "NO"
    assert rec["QOS"] == "(null)"


def test_count_without_range_is_exact(cluster: LocalCluster) -> None:
    job = elastic(cluster, "3")
    rec = cluster.show_jobs(job)[0]
    assert rec["AdminComment"] == "malletrain:min=3,max=3"
    assert rec["ArrayTaskId"] == "0-2"


def test_regular_jobs_are_untouched(cluster: LocalCluster) -> None:
    job = cluster.sbatch("-N", "2", "--hold", "-o", "/dev/null", script=SCRIPT)
    rec = cluster.show_jobs(job)[0]
    assert rec["Partition"] == "prod"
    assert rec.get("AdminComment", "(null)") == "(null)"
    assert "ArrayTaskId" not in rec and rec["NumNodes"] == "2-2"


@pytest.mark.parametrize("args, says", [
    (["-N", "1-2000"], "malletrain: -N 1-2000: at most 1000 nodes on this cluster; "
                       "write -N 1-1000"),
    ([], "malletrain: give the node range of the elastic job"),
    (["-N", "1-2", "--array=0-3"], "malletrain: an elastic job is already an array"),
    (["-N", "1-2", "--comment=resnet 50"], "'resnet 50' is not key=value"),
    (["-N", "1-2", "--comment=max=9"], "give the node range with -N LO-HI, not in --comment"),
])
def test_impossible_requests_are_refused_by_sbatch(cluster: LocalCluster, args: list[str],
                                                   says: str) -> None:
    with pytest.raises(CommandError) as err:
        cluster.sbatch("--qos=malletrain", "-o", "/dev/null", *args, script=SCRIPT)
    assert says in err.value.stderr
    assert cluster.run(["squeue", "-h", "-o", "%i"]).stdout.strip() == ""


def test_min_above_max_never_becomes_a_job(cluster: LocalCluster) -> None:
    # sbatch itself rejects -N 4-2 before the controller sees it; the plugin's own check
    # (tests/test_job_submit_lua.py) covers clients that do not.
    with pytest.raises(CommandError) as err:
        cluster.sbatch("--qos=malletrain", "-N", "4-2", "-o", "/dev/null", script=SCRIPT)
    assert "less than minimum node count" in err.value.stderr
    assert cluster.run(["squeue", "-h", "-o", "%i"]).stdout.strip() == ""


@pytest.mark.parametrize("command", ["salloc", "srun"])
def test_interactive_elastic_jobs_are_refused(cluster: LocalCluster, command: str) -> None:
    res = cluster.run([command, "--qos=malletrain", "-N", "1-2", "true"], check=False,
                      timeout_s=20)
    assert res.returncode != 0
    assert "malletrain: elastic jobs must be batch jobs" in res.stderr
