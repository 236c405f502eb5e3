"""The Slurm facts the design rests on, at a site's default timings (cred_expire=120,
bf_interval=30, batch_sched_delay=3): a second cluster, started for this module."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from datetime import datetime

import pytest
from slurm_helpers import (
    SCRIPT,
    after_test,
    elastic,
    grow,
    own_cluster,
    squeue,
    task_state,
    wait_task,
)

from devtools.localcluster import SITE_TIMINGS, LocalCluster
from malletrain_core.backends.slurm.settings import parse_show_config

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def site_cluster() -> Iterator[LocalCluster]:
    with own_cluster("site", nodes=4, site_defaults=True) as cluster:
        yield cluster


@pytest.fixture
def site(request: pytest.FixtureRequest, site_cluster: LocalCluster) -> Iterator[LocalCluster]:
    yield site_cluster
    after_test(request, site_cluster, timeout_s=60)


def epoch(stamp: str) -> float:
    return datetime.fromisoformat(stamp).timestamp()


def backfill_cycles(cluster: LocalCluster) -> int:
    """How many backfill cycles slurmctld has run (sdiag)."""
    stats = cluster.run(["sdiag"]).stdout
    section = stats[stats.index("Backfilling stats"):]
    return int(re.search(r"Total cycles:\s*(\d+)", section).group(1))  # type: ignore[union-attr]


def test_site_timings_are_in_force(site: LocalCluster) -> None:
    config = site.run(["scontrol", "show", "config"]).stdout
    assert f"cred_expire={SITE_TIMINGS.cred_expire_s}" in config
    conf = parse_show_config(config)
    params = conf["SchedulerParameters"].split(",")
    for item in (f"bf_interval={SITE_TIMINGS.bf_interval_s}",
                 f"bf_resolution={SITE_TIMINGS.bf_resolution_s}",
                 f"batch_sched_delay={SITE_TIMINGS.batch_sched_delay_s}"):
        assert item in params, conf["SchedulerParameters"]
    assert conf["EpilogSlurmctld"].endswith("epilog_slurmctld")
    # 22.05 prints "PrologSlurmctld = (null)"; 24.11 on leave an unset script out
    assert conf.get("PrologSlurmctld", "(null)") == "(null)"


def test_task_on_planned_node_starts_only_inside_the_hole(site: LocalCluster) -> None:
    running = site.sbatch("-w", "n01", "-t", "60", "-o", "/dev/null", script=SCRIPT)
    wait_task(site, running, "RUNNING")
    waiting = site.sbatch("-N", "4", "-t", "10", "-o", "/dev/null", script=SCRIPT)
    # The backfill plan reserves n02-n04 for the waiting job: sinfo says `planned`.
    site.wait_for("n02 planned", lambda: site.run(
        ["sinfo", "-h", "-n", "n02", "-p", "prod", "-o", "%T"]).stdout.strip() == "planned",
        timeout_s=2 * SITE_TIMINGS.bf_interval_s + 10)
    plan = site.run(["squeue", "-h", "-t", "PD", "--start", "-j", waiting, "-o", "%S|%Y"])
    planned_start, sched_nodes = plan.stdout.strip().split("|")
    assert epoch(planned_start) > time.time() + 50 * 60
    assert sched_nodes == "n[01-04]"

    task = f"{elastic(site, '1-2')}_0"
    cycles = backfill_cycles(site)
    grow(site, task, "n02", time_limit="3-00:00:00")  # 72 h: past the hole's end
    site.wait_for("a backfill cycle", lambda: backfill_cycles(site) > cycles,
                  timeout_s=2 * SITE_TIMINGS.bf_interval_s + 10, interval_s=0.5)
    state, reason, _ = task_state(site, task)
    assert state == "PENDING", "a task longer than the hole must not start on a planned node"
    assert "reserved for jobs in higher priority partitions" in reason

    site.run(["scontrol", "update", f"JobId={task}", "TimeLimit=30"])  # ends inside the hole
    waited = wait_task(site, task, "RUNNING", timeout_s=2 * SITE_TIMINGS.bf_interval_s + 10)
    assert task_state(site, task)[2] == "n02"
    after = site.run(["squeue", "-h", "-t", "PD", "--start", "-j", waiting, "-o", "%S"])
    assert abs(epoch(after.stdout.strip()) - epoch(planned_start)) < 120
    print(f"task with a time limit inside the hole started {waited:.1f} s after the update")


def test_start_time_now_lifts_the_requeue_blackout(site: LocalCluster) -> None:
    task = f"{elastic(site, '1-1')}_0"
    grow(site, task, "n03")
    first = wait_task(site, task, "RUNNING", timeout_s=SITE_TIMINGS.bf_interval_s + 15)
    site.sbatch("-w", "n03", "-o", "/dev/null", "--wrap", "sleep 300")
    wait_task(site, task, "PENDING")
    begin = epoch(site.show_jobs(task)[0]["StartTime"])
    assert begin - time.time() > SITE_TIMINGS.cred_expire_s - 20  # about 121 s away
    assert squeue(site, task, "%r") in ("None", "BeginTime")  # None until it is evaluated

    t0 = time.monotonic()
    site.run(["scontrol", "update", f"JobId={task}", "ReqNodeList=n04", "StartTime=now"])
    waited = wait_task(site, task, "RUNNING", timeout_s=SITE_TIMINGS.bf_interval_s + 15)
    assert task_state(site, task)[2] == "n04"
    assert time.monotonic() - t0 < SITE_TIMINGS.cred_expire_s / 2
    print(f"first start {first:.1f} s after release; after preemption, restarted on n04 "
          f"{waited:.1f} s after StartTime=now (blackout {SITE_TIMINGS.cred_expire_s + 1} s)")
