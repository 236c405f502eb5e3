"""A node Epilog and the holes MalleTrain fills: the margin keeps a task's Epilog off the
planned start of the job that waits for its node.

Its own small cluster whose nodes run a 5-s Epilog at every job's end (a site's health check).
A reservation holds node a until T, so a prod job on (a, b) is planned at T and b is a hole
ending at T; the Slurm backend grants b to an elastic task about 124 s before T, once with
``slurm.epilog_margin_s`` = 0 and once with the margin of a 5-s Epilog, side by side
(bench/epilog.py's planned phase, one pair each).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from slurm_helpers import own_cluster

from bench.epilog import planned_round
from devtools.localcluster import LocalCluster

EPILOG_S = 5.0
pytestmark = pytest.mark.slow  # about 2.5 minutes: the hole must take a two-minute task


@pytest.fixture(scope="module")
def epilog_cluster() -> Iterator[LocalCluster]:
    with own_cluster("epilog", nodes=4, node_epilog_s=EPILOG_S) as cluster:
        yield cluster


def test_the_epilog_margin_keeps_the_epilog_off_a_planned_start(
        epilog_cluster: LocalCluster) -> None:
    rows = {r["margin"]: r for r in planned_round(epilog_cluster, 1, EPILOG_S, tag="t")}
    on, off = rows["on"], rows["off"]
    print(rows)
    # With the margin the task's limit leaves the Epilog's run (and slurmctld's 30-s
    # time-limit check) before T: it ended and its node left COMPLETING before the planned
    # start, and the prod job started on time (Slurm's next backfill cycle, 1 s here).
    assert on["limit"] == "1:00" and on["epilog_margin_s"] == 35
    assert on["task_end_s"] < -EPILOG_S and on["node_free_s"] <= 0, on
    assert on["prod_start_s"] < 1.5, on
    # Without it the same hole takes a two-minute task that ends within seconds of T (or
    # past it, until slurmctld's next time-limit check): its Epilog delays the prod job.
    assert off["limit"] == "2:00"
    assert off["node_free_s"] > 0 and off["prod_start_s"] > 1.5, off
