"""Hostile elastic submissions through a real sbatch and slurmctld, as a second real user:
every malformed or impossible node range is refused with one message and leaves no job."""

from __future__ import annotations

import pytest
from slurm_helpers import SCRIPT

from devtools.localcluster import LocalCluster

pytestmark = pytest.mark.security


@pytest.mark.parametrize("node_range", ["4-1", "0-2", "0", "1-99999", "a-b", "1-", "1-2-3",
                                        "1--2", "99999999999", "1-2 3", "2x"])
def test_bad_ranges_are_refused_and_leave_no_job(cluster: LocalCluster, test_user: str,
                                                 node_range: str) -> None:
    res = cluster.run(["sbatch", "--parsable", "--qos=malletrain", "-o", "/dev/null",
                       "--chdir=/tmp", "-N", node_range], user=test_user, input=SCRIPT,
                      check=False)
    assert res.returncode != 0, f"-N {node_range!r} was accepted: {res.stdout}"
    message = res.stderr.strip()
    assert message and "Traceback" not in message
    assert len([ln for ln in message.splitlines() if "malletrain:" in ln]) <= 1
    assert cluster.run(["squeue", "-h", "-o", "%i"]).stdout.strip() == ""
    if node_range == "0-2":  # the plugin's own refusal, not sbatch's
        assert "at least one node; write -N 1-2" in message, message


@pytest.mark.parametrize("node_range, tag", [("1-2", "min=1,max=2"),
                                             ("-3", "min=1,max=3")])  # sbatch: "-3" is 1-3
def test_good_range_as_the_same_user_is_accepted(cluster: LocalCluster, test_user: str,
                                                 node_range: str, tag: str) -> None:
    """The refusals above are about the ranges, not about the user."""
    job = cluster.sbatch("--qos=malletrain", "-o", "/dev/null", "--chdir=/tmp", "-N",
                         node_range, user=test_user, script=SCRIPT)
    rec = cluster.show_jobs(job)[0]
    assert rec["AdminComment"] == f"malletrain:{tag}"
    assert rec["UserId"].startswith(test_user)
