"""SlurmBackend on the real local cluster.

First the backend contract every batch system keeps (tests/backend_contract.py: submit, grow,
shrink, preemption, a node taken while a worker starts or stops, training done, cancels,
finish, a restart, the engine over it), each scenario on the real cluster
(tests/live_contract.py); then what only a real Slurm shows: a grant's time limit in whole
minutes of its hole and its admin hold, a node Slurm refuses, hole ends read from the backfill
plan. Each test runs on both paths of the backend (``backend_path``): the commands, and
pyslurm's reads and actions (24.11 and 25.11), where the backend must start no command process.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from backend_contract import SCENARIOS
from live_contract import LiveWorld, flag_dir_fixture  # noqa: F401  (flag_dir)
from slurm_helpers import SCRIPT, elastic, task_state, wait_task

from devtools.localcluster import LocalCluster
from devtools.waiting import poll_until
from malletrain_core.backends.base import Backend
from malletrain_core.backends.slurm.backend import SlurmBackend
from malletrain_core.events import (
    Grow,
    JobSubmitted,
    NodesIdle,
    NodesReclaimed,
    WorkerStarted,
    WorkerStopped,
)
from malletrain_core.runner import CommandRunner

HELD = ("JobHeldUser", "JobHeldAdmin", "job requeued in held state")


class SlurmLive(LiveWorld):
    """The contract's World on the local cluster: jobs submitted through job_submit.lua as
    root (``alice``) and the test user (``bob``), nodes taken by ``prod`` jobs pinned to them,
    training done when the job's flag file appears."""

    name = "slurm"

    def __init__(self, cluster: LocalCluster, make_backend: Callable[[], Backend],
                 test_user: str, flags: Path) -> None:
        super().__init__(cluster.node_names, {"alice": "root", "bob": test_user}, make_backend)
        self.cluster, self.flags = cluster, flags
        self.prod: dict[str, str] = {}   # scenario node -> the prod job on it

    def submit(self, min_nodes: int, max_nodes: int, owner: str) -> str:
        user = self.users[owner]
        script = (f"#!/bin/sh\nwhile [ ! -e {self.flags}/done-$SLURM_ARRAY_JOB_ID ]; "
                  "do sleep 0.2; done\n")
        return self.submitted(self.cluster.sbatch(
            "--qos=malletrain", "-N", f"{min_nodes}-{max_nodes}", "-o", "/dev/null",
            "--chdir=/tmp", user=None if user == "root" else user, script=script), owner)

    def take(self, node: str) -> None:
        real = self.real(node)
        job = self.prod[node] = self.cluster.sbatch("-p", "prod", "-w", real, "-o", "/dev/null",
                                                    script=SCRIPT)
        wait_task(self.cluster, job, "RUNNING")

    def free(self, node: str) -> None:
        self.cluster.run(["scancel", self.prod.pop(node)])

    def complete(self, job_id: str) -> None:
        (self.flags / f"done-{job_id}").touch()
        self.cluster.wait_for(f"the workers of {job_id} done", lambda: not self._running(job_id),
                              30)

    def cancel(self, job_id: str) -> None:
        self.cluster.run(["scancel", job_id])

    def _running(self, job_id: str) -> set[str]:
        return set(self.cluster.run(["squeue", "-h", "-r", "-j", job_id, "-t", "R", "-o",
                                     "%N"]).stdout.split())

    def settle(self) -> None:
        """Until two reads 0.5 s apart show the same jobs and nodes and nothing on its way:
        no job completing, no node completing, no released job pending for an idle node."""
        last: tuple[str, str] | None = None

        def quiet() -> bool:
            nonlocal last
            jobs = self.cluster.run(["squeue", "-h", "-a", "-r", "-t", "all", "-o",
                                     "%i|%T|%r|%n|%N"]).stdout
            nodes = self.cluster.run(["sinfo", "-h", "-N", "-o", "%N|%T"]).stdout
            now, last = last, (jobs, nodes)
            idle = {n for n, _, state in (ln.partition("|") for ln in nodes.split())
                    if state == "idle"}
            rows = [ln.split("|") for ln in jobs.splitlines()]
            moving = [r for r in rows if r[1] in ("COMPLETING", "CONFIGURING")
                      or (r[1] == "PENDING" and r[2] not in HELD and r[3] in idle)]
            return now == last and not moving and "comp" not in nodes
        self.cluster.wait_for("the cluster settled", quiet, 60, interval_s=0.5)


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_contract(scenario: str, cluster: LocalCluster, backend_path: Any, test_user: str,
                  flag_dir: Path) -> None:
    SCENARIOS[scenario](SlurmLive(cluster, lambda: backend_path(grant_timeout_s=60), test_user,
                                  flag_dir))


def task_on(backend: SlurmBackend, node: str) -> str:
    (key,) = [k for k, (_, where) in backend.workers.items() if where == node]
    return key


def test_a_grant_runs_whole_minutes_of_its_hole_under_an_admin_hold(
        cluster: LocalCluster, backend_path: Any) -> None:
    """A grow into a 600-s hole pins the task to its node with whole minutes of the hole less
    the margin; the poll that sees it run holds it, so the preemption brings it back held."""
    backend = backend_path(grant_timeout_s=60)
    job = elastic(cluster, "1-4", "--comment=model=resnet50")
    ev = poll_until(backend, lambda ev: any(isinstance(e, JobSubmitted) for e in ev))
    (sub,) = [e.job for e in ev if isinstance(e, JobSubmitted)]
    assert (sub.id, sub.model, sub.owner) == (job, "resnet50", "root")

    t0 = time.monotonic()
    assert backend.execute([Grow(job, ("n02", "n03"), 600.0)], time.time()) == []
    poll_until(backend, lambda ev: len([e for e in ev if isinstance(e, WorkerStarted)]) == 2)
    grow_s = time.monotonic() - t0
    running = cluster.run(["squeue", "-h", "-r", "-j", job, "-t", "R", "-o", "%N|%l"]).stdout
    # A 600 s hole: whole minutes within it, less the backfill margin (60 s).
    assert sorted(running.split()) == ["n02|9:00", "n03|9:00"]
    backend.poll(time.time())  # the admin holds were set by the poll that saw them run
    on_n02 = task_on(backend, "n02")
    assert task_state(cluster, on_n02) == ("RUNNING", "JobHeldAdmin", "n02")

    prod = cluster.sbatch("-p", "prod", "-w", "n02", "-o", "/dev/null", script=SCRIPT)
    poll_until(backend, lambda ev: any(isinstance(e, NodesReclaimed) and "n02" in e.nodes
                                       for e in ev))
    assert task_state(cluster, on_n02)[:2] == ("PENDING", "JobHeldAdmin")
    assert cluster.show_jobs(on_n02)[0]["Restarts"] == "1"
    wait_task(cluster, prod, "RUNNING")  # once the preempted task has left n02
    print(f"grow onto 2 idle nodes: {grow_s:.2f} s from the order to both RUNNING")


def test_backend_gives_a_failed_grow_back(cluster: LocalCluster, backend_path: Any) -> None:
    backend = backend_path(grant_timeout_s=60)
    job = elastic(cluster, "1-2")
    poll_until(backend, lambda ev: any(isinstance(e, JobSubmitted) for e in ev))
    ev = backend.execute([Grow(job, ("nosuchnode",), 600.0),
                          Grow(job, ("n04", "n05", "n06"), 600.0)], time.time())
    # Slurm refuses the unknown node; the array has two tasks, so n06 gets none.
    assert sorted(e.node for e in ev if isinstance(e, WorkerStopped)) == ["n06", "nosuchnode"]
    ev = poll_until(backend, lambda ev: len([e for e in ev if isinstance(e, WorkerStarted)]) == 2)
    assert sorted(e.node for e in ev if isinstance(e, WorkerStarted)) == ["n04", "n05"]
    running = cluster.run(["squeue", "-h", "-r", "-j", job, "-t", "R", "-o", "%N"]).stdout
    assert sorted(running.split()) == ["n04", "n05"]


def test_backend_reads_hole_ends_from_the_backfill_plan(cluster: LocalCluster,
                                                        backend_path: Any) -> None:
    backend = backend_path(grant_timeout_s=60)
    backend.poll(time.time())
    t0 = time.time()
    first = cluster.sbatch("-p", "prod", "-w", "n01", "-t", "5", "-o", "/dev/null",
                           script=SCRIPT)
    wait_task(cluster, first, "RUNNING")
    wide = cluster.sbatch("-p", "prod", "-N", str(len(cluster.node_names)), "-t", "5",
                          "-o", "/dev/null", script=SCRIPT)
    ev = poll_until(backend, lambda ev: any(
        isinstance(e, NodesIdle) and any(n.hole_end is not None for n in e.nodes) for e in ev))
    holes = {n.name: n.hole_end for e in ev if isinstance(e, NodesIdle) for n in e.nodes}
    start = cluster.run(["squeue", "-h", "-j", wide, "--start", "-o", "%S"]).stdout.strip()
    planned = time.mktime(time.strptime(start, "%Y-%m-%dT%H:%M:%S"))
    assert holes == {name: planned for name in cluster.node_names[1:]}
    assert t0 + 4 * 60 < planned <= t0 + 5 * 60 + 5  # the running job's time limit
    assert any(isinstance(e, NodesReclaimed) and "n01" in e.nodes for e in ev)

    # A task whose time limit fits the hole starts on the planned node, and the plan holds.
    job = elastic(cluster, "1-2")
    poll_until(backend, lambda ev: any(isinstance(e, JobSubmitted) for e in ev))
    backend.execute([Grow(job, ("n02",), planned - time.time())], time.time())
    ev = poll_until(backend, lambda ev: any(isinstance(e, WorkerStarted) for e in ev))
    assert [e.node for e in ev if isinstance(e, WorkerStarted)] == ["n02"]
    ends = cluster.run(["squeue", "-h", "-r", "-j", job, "-t", "R", "-o", "%e"]).stdout.strip()
    assert time.mktime(time.strptime(ends, "%Y-%m-%dT%H:%M:%S")) <= planned
    assert cluster.run(["squeue", "-h", "-j", wide, "--start", "-o", "%S"]).stdout.strip() == start


def test_a_hole_of_about_a_minute_takes_a_task(cluster: LocalCluster) -> None:
    """The local cluster plans in 1 s steps (bf_resolution=1) and its daemons take
    ``timings.hole_margin_s`` (3 s) off a hole, not Slurm's default step of 60 s: a planned
    hole ending about 65 s ahead takes a one-minute task, which starts on the planned node
    and leaves the plan as it was. With the default margin the same hole takes none."""
    margin = cluster.timings.hole_margin_s
    assert cluster.timings.bf_resolution_s == 1 and margin == 3
    backend = SlurmBackend(CommandRunner(env=cluster.env), grant_timeout_s=30,
                           hole_margin_s=margin)
    backend.poll(time.time())
    first = cluster.sbatch("-p", "prod", "-w", "n01", "-t", "2", "-o", "/dev/null",
                           script=SCRIPT)
    wait_task(cluster, first, "RUNNING")
    wide = cluster.sbatch("-p", "prod", "-N", str(len(cluster.node_names)), "-t", "5",
                          "-o", "/dev/null", script=SCRIPT)
    job = elastic(cluster, "1-2")
    poll_until(backend, lambda ev: any(isinstance(e, JobSubmitted) for e in ev))

    def planned_start() -> str:
        return cluster.run(["squeue", "-h", "-j", wide, "--start", "-o", "%S"]).stdout.strip()
    cluster.wait_for("the wide job planned", lambda: planned_start()[:2] == "20", 30)
    start = planned_start()
    planned = time.mktime(time.strptime(start, "%Y-%m-%dT%H:%M:%S"))
    while planned - time.time() > 60 + margin + 4:  # about 50 s: the first job's 2 minutes
        time.sleep(0.5)
    hole = planned - time.time()
    assert hole > 60 + margin, f"the hole shrank to {hole:.1f} s before the grow"
    default = SlurmBackend(CommandRunner(env=cluster.env))
    default.poll(time.time())
    refused = default.execute([Grow(job, ("n02",), hole)], time.time())
    assert [(type(e), e.node) for e in refused] == [(WorkerStopped, "n02")]

    backend.poll(time.time())  # sees the wide job planned: grants are not held back
    assert backend.execute([Grow(job, ("n02",), planned - time.time())], time.time()) == []
    ev = poll_until(backend, lambda ev: any(isinstance(e, WorkerStarted) for e in ev),
                    timeout_s=20)
    assert [e.node for e in ev if isinstance(e, WorkerStarted)] == ["n02"]
    limit, ends = cluster.run(["squeue", "-h", "-r", "-j", job, "-t", "R", "-o",
                               "%l|%e"]).stdout.strip().split("|")
    assert limit == "1:00"
    assert time.mktime(time.strptime(ends, "%Y-%m-%dT%H:%M:%S")) <= planned
    assert planned_start() == start, "the task moved the planned start"
    print(f"a {hole:.1f} s hole took a one-minute task on the planned node")
