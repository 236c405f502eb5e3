"""A live cluster's own accounting as a trace: jobs pinned to known nodes on a local Slurm
cluster in accounting mode, then its ``sacct --json`` and ``sacct -P`` read by
:mod:`malletrain_core.sim.accounting`. Both forms give the jobs' own nodes and times, and each
node is idle exactly outside its jobs. Skipped unless MariaDB and slurmdbd are installed."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from test_accounting import (
    acct_cluster,  # noqa: F401  (3 nodes, accounting mode)
    pytestmark,  # noqa: F401  (skipped without slurmdbd and MariaDB)
)
from test_sim_accounting import utc  # noqa: F401  (sacct -P times are local: UTC here)

from devtools.localcluster import LocalCluster
from malletrain_core.sim.accounting import AccountingFilter, load_accounting_trace, read_accounting

FIELDS = "JobID,JobName,Partition,Reservation,State,NodeList,Start,End"


def sbatch(cluster: LocalCluster, *args: str) -> str:
    return cluster.run(["sbatch", "--parsable", "-o", "/dev/null", *args]).stdout.strip()


def wait_recorded(cluster: LocalCluster, jobs: list[str], timeout_s: float = 60.0) -> None:
    """Until sacct has an end for every job (slurmctld hands records to slurmdbd)."""
    def ended() -> bool:
        out = cluster.run(["sacct", "-n", "-X", "-P", "-j", ",".join(jobs), "-o",
                           "JobID,End"]).stdout
        ends = dict(line.split("|", 1) for line in out.split() if "|" in line)
        return all(ends.get(j, "Unknown") not in ("Unknown", "") for j in jobs)
    cluster.wait_for(f"an end in sacct for each of {jobs}", ended, timeout_s, 0.5)


def test_sacct_of_the_live_cluster_gives_each_node_its_own_gaps(
        request: pytest.FixtureRequest, tmp_path: Path) -> None:
    acct: LocalCluster = request.getfixturevalue("acct_cluster")
    since = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(time.time() - 60))
    wide = sbatch(acct, "-p", "prod", "-N", "2", "-w", "n01,n02", "--wrap", "sleep 3")
    one = sbatch(acct, "-p", "prod", "-w", "n03", "--wrap", "sleep 1")
    later = sbatch(acct, "-p", "prod", "-w", "n03", "-d", f"afterany:{one}", "--wrap", "sleep 2")
    wait_recorded(acct, [wide, one, later])
    env = ["env", "TZ=UTC"]
    dumps = {"json": acct.run(env + ["sacct", "-a", "-X", "-D", "-S", since, "--json"]).stdout,
             "txt": acct.run(env + ["sacct", "-a", "-X", "-D", "-P", "-S", since, "-o",
                                    FIELDS]).stdout}
    runs = {}
    for form, text in dumps.items():
        path = tmp_path / f"sacct.{form}"
        path.write_text(text)
        said: list[str] = []
        log = read_accounting(path, said.append)
        assert said == [] and log.skipped == 0
        runs[form] = {r.job: r for r in log.runs}
    assert {j: (r.start, r.end, r.nodes) for j, r in runs["json"].items()} == \
        {j: (r.start, r.end, r.nodes) for j, r in runs["txt"].items()}
    got = runs["json"]
    assert got[wide].nodes == ("n01", "n02") and got[one].nodes == got[later].nodes == ("n03",)
    assert got[later].start >= got[one].end and got[wide].end - got[wide].start >= 3
    trace = load_accounting_trace(tmp_path / "sacct.txt", AccountingFilter.of(
        partitions=["prod"]), warn=None)
    start, end = trace.start, trace.end
    busy = {"n01": got[wide].end - got[wide].start, "n02": got[wide].end - got[wide].start,
            "n03": (got[one].end - got[one].start) + (got[later].end - got[later].start)}
    assert trace.idle_node_seconds() == pytest.approx(sum(end - start - b for b in
                                                          busy.values()))
    assert json.loads(dumps["json"])["jobs"]
