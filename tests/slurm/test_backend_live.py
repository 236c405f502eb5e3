"""SlurmBackend on the real local cluster: submit, grow, shrink, preemption, finish.

Every step is checked against Slurm's own view (squeue), not only against the events. Each
test runs on both paths of the backend (``backend_path``): the commands, and pyslurm's reads and
actions (24.11 and 25.11), where the backend must start no command process.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from slurm_helpers import SCRIPT, elastic, task_state, wait_task

from devtools.localcluster import LocalCluster
from malletrain_core.backends.slurm.backend import SlurmBackend
from malletrain_core.events import (
    Event,
    Finish,
    Grow,
    JobSubmitted,
    NodesIdle,
    NodesReclaimed,
    Shrink,
    WorkerStarted,
    WorkerStopped,
)
from malletrain_core.runner import CommandRunner


def poll_until(backend: SlurmBackend, done: Callable[[list[Event]], bool],
               timeout_s: float = 30.0, interval_s: float = 0.3) -> list[Event]:
    """Poll until the events seen so far satisfy ``done``; returns all of them."""
    seen: list[Event] = []
    deadline = time.monotonic() + timeout_s
    while True:
        seen += backend.poll(time.time())
        if done(seen):
            return seen
        if time.monotonic() > deadline:
            raise AssertionError(f"not seen within {timeout_s:g} s; events: {seen}")
        time.sleep(interval_s)


def task_on(backend: SlurmBackend, node: str) -> str:
    (key,) = [k for k, (_, where) in backend.workers.items() if where == node]
    return key


def test_backend_drives_an_elastic_job(cluster: LocalCluster, backend_path: Any) -> None:
    cluster.wait_for("every node idle (a previous test's jobs gone)", lambda: set(cluster.run(
        ["sinfo", "-h", "-N", "-p", "preemptable", "-o", "%T"]).stdout.split()) == {"idle"}, 30)
    backend = backend_path(grant_timeout_s=60)
    first = backend.poll(time.time())
    idle = [n.name for e in first if isinstance(e, NodesIdle) for n in e.nodes]
    assert idle == cluster.node_names, (
        idle, cluster.run(["sinfo", "-h", "-N", "-p", "preemptable", "-o", "%N|%T"]).stdout,
        cluster.run(["squeue", "-h", "-r", "-t", "all", "-o", "%i|%T|%N|%P"]).stdout)

    job = elastic(cluster, "1-4", "--comment=model=resnet50")
    ev = poll_until(backend, lambda ev: any(isinstance(e, JobSubmitted) for e in ev))
    (sub,) = [e.job for e in ev if isinstance(e, JobSubmitted)]
    assert (sub.id, sub.min_nodes, sub.max_nodes, sub.model, sub.owner) == (
        job, 1, 4, "resnet50", "root")

    t0 = time.monotonic()
    assert backend.execute([Grow(job, ("n02", "n03"), 600.0)], time.time()) == []
    ev = poll_until(backend, lambda ev: len([e for e in ev if isinstance(e, WorkerStarted)]) == 2)
    grow_s = time.monotonic() - t0
    assert sorted(e.node for e in ev if isinstance(e, WorkerStarted)) == ["n02", "n03"]
    running = cluster.run(["squeue", "-h", "-r", "-j", job, "-t", "R", "-o", "%N|%l"]).stdout
    # A 600 s hole: whole minutes within it, less the backfill margin (60 s).
    assert sorted(running.split()) == ["n02|9:00", "n03|9:00"]
    backend.poll(time.time())  # the admin holds were set by the poll that saw them run
    on_n02, on_n03 = task_on(backend, "n02"), task_on(backend, "n03")
    assert task_state(cluster, on_n02) == ("RUNNING", "JobHeldAdmin", "n02")

    backend.execute([Shrink(job, ("n03",))], time.time())
    ev = poll_until(backend, lambda ev: WorkerStopped in {type(e) for e in ev})
    assert [(e.job_id, e.node) for e in ev if isinstance(e, WorkerStopped)] == [(job, "n03")]
    assert task_state(cluster, on_n03)[:2] == ("PENDING", "job requeued in held state")

    prod = cluster.sbatch("-p", "prod", "-w", "n02", "-o", "/dev/null", script=SCRIPT)
    ev = poll_until(backend, lambda ev: any(isinstance(e, NodesReclaimed) and "n02" in e.nodes
                                            for e in ev))
    assert task_state(cluster, on_n02)[:2] == ("PENDING", "JobHeldAdmin")
    assert cluster.show_jobs(on_n02)[0]["Restarts"] == "1"
    wait_task(cluster, prod, "RUNNING")  # once the preempted task has left n02
    assert backend.workers == {}

    backend.execute([Finish(job)], time.time())
    poll_until(backend, lambda ev: not cluster.run(
        ["squeue", "-h", "-j", job, "-t", "PD,R,CG,S"]).stdout.strip(), timeout_s=20)
    assert backend.jobs == {}
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
