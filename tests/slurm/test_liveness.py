"""Liveness under churn, on the real local cluster: a granted node is running its task within
the grant timeout or is given back, and no job loses a task.

The sequences are the ones bench/e2e.py met: a job shrunk off two nodes and grown back onto
them within a second (both tasks ended FAILED 3 ms after their start and the job could never
grow past two of its four tasks again), a task that exits 1 as it starts, a job whose tasks
always fail, and a node a production job used for a moment while the job on it was being
measured (it stayed idle for the measurement's whole timeout, 58 s). The first three drive the
backend directly, as the daemon would, so the moment is made rather than waited for; the last
one is the whole daemon.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from slurm_helpers import elastic

from devtools.localcluster import LocalCluster
from devtools.localcluster.daemon import LocalDaemon
from devtools.waiting import poll_until
from malletrain_core.backends.slurm.backend import SlurmBackend
from malletrain_core.events import (
    EndReason,
    Event,
    Grow,
    JobEnded,
    JobSubmitted,
    NodesIdle,
    Shrink,
    WorkerStarted,
    WorkerStopped,
)
from malletrain_core.runner import CommandRunner

LINGER = "#!/bin/bash\ntrap 'sleep 1; exit 0' TERM\nsleep 600 &\nwait\n"
"""A worker that takes a second to end on SIGTERM, as a training process does."""


def backend_for(cluster: LocalCluster, **kw: float) -> SlurmBackend:
    return SlurmBackend(CommandRunner(env=cluster.env),
                        grant_timeout_s=cluster.timings.grant_timeout_s, **kw)  # type: ignore[arg-type]


def admitted(backend: SlurmBackend, job: str) -> None:
    poll_until(backend, lambda ev: any(isinstance(e, JobSubmitted) and e.job.id == job
                                       for e in ev))


def task_states(cluster: LocalCluster, job: str) -> dict[str, str]:
    out = cluster.run(["squeue", "-h", "-r", "-t", "all", "-j", job, "-o", "%i|%T"],
                      check=False).stdout
    return dict(line.split("|") for line in out.splitlines() if line)  # type: ignore[misc]


def started(nodes: set[str]) -> Callable[[list[Event]], bool]:
    return lambda ev: nodes <= {e.node for e in ev if isinstance(e, WorkerStarted)}


def test_a_shrink_then_a_grow_onto_the_same_nodes_within_a_second_loses_nothing(
        cluster: LocalCluster) -> None:
    backend = backend_for(cluster)
    job = cluster.sbatch("--qos=malletrain", "-N", "1-2", "-o", "/dev/null", "--chdir=/tmp",
                         script=LINGER)
    admitted(backend, job)
    a, b = cluster.node_names[:2]
    assert backend.execute([Grow(job, (a, b), None)], time.time()) == []
    poll_until(backend, started({a, b}))
    before = {node: key for key, (_, node) in backend.workers.items()}
    assert backend.execute([Shrink(job, (a, b))], time.time()) == []
    poll_until(backend, lambda ev: not backend.workers and len(backend._free_tasks(job)) == 2,
               interval_s=0.2)
    t0 = time.monotonic()
    assert backend.execute([Grow(job, (a, b), None)], time.time()) == []
    poll_until(backend, started({a, b}), timeout_s=cluster.timings.grant_timeout_s)
    took = time.monotonic() - t0
    after = {node: key for key, (_, node) in backend.workers.items()}
    assert after[a] != before[a] and after[b] != before[b]  # no task back where it just left
    assert sorted(task_states(cluster, job).values()) == ["RUNNING", "RUNNING"]
    print(f"shrink then grow onto the same nodes: both running {took:.2f} s after the grow")


def test_a_task_that_exits_1_at_start_is_requeued_held_and_runs_at_the_next_grant(
        cluster: LocalCluster, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    marks.chmod(0o777)
    script = (f"#!/bin/sh\nf={marks}/first\n"  # the job's first start fails
              "[ -e $f ] || { touch $f; exit 1; }\nexec sleep 600\n")
    backend = backend_for(cluster)
    job = cluster.sbatch("--qos=malletrain", "-N", "1-2", "-o", "/dev/null", "--chdir=/tmp",
                         script=script)
    admitted(backend, job)
    a, b = cluster.node_names[:2]
    caplog.set_level(logging.WARNING)
    assert backend.execute([Grow(job, (a,), None)], time.time()) == []
    seen = poll_until(backend, lambda ev: any(isinstance(e, WorkerStopped) and e.node == a
                                              for e in ev))
    assert any(isinstance(e, NodesIdle) and a in {n.name for n in e.nodes} for e in seen)
    assert job in backend.jobs
    assert any(f"job {job}: task {job}_0 on {a}: FAILED; requeued held" in r.getMessage()
               for r in caplog.records), caplog.text
    cluster.wait_for("the failed task held again", lambda: sorted(
        task_states(cluster, job).values()) == ["PENDING", "PENDING"], 15)
    backend.poll(time.time())  # as the daemon would before it plans again
    t0 = time.monotonic()
    assert backend.execute([Grow(job, (a, b), None)], time.time()) == []
    poll_until(backend, started({a, b}), timeout_s=cluster.timings.grant_timeout_s)
    print(f"after a failed start: both tasks running {time.monotonic() - t0:.2f} s after "
          "the grow")
    assert sorted(task_states(cluster, job).values()) == ["RUNNING", "RUNNING"]


def test_a_job_whose_tasks_always_fail_is_stopped_with_one_line(
        cluster: LocalCluster, caplog: pytest.LogCaptureFixture) -> None:
    backend = backend_for(cluster, task_failures_max=2)
    job = cluster.sbatch("--qos=malletrain", "-N", "1-3", "-o", "/dev/null", "--chdir=/tmp",
                         script="#!/bin/sh\nexit 1\n")
    admitted(backend, job)
    caplog.set_level(logging.ERROR)
    nodes = iter(cluster.node_names)
    ended: list[Event] = []
    deadline = time.monotonic() + 60
    while not ended:
        assert time.monotonic() < deadline, task_states(cluster, job)
        node = next(nodes)
        backend.execute([Grow(job, (node,), None)], time.time())
        seen = poll_until(backend, lambda ev: any(
            isinstance(e, (WorkerStopped, JobEnded)) for e in ev))
        ended = [e for e in seen if isinstance(e, JobEnded)]
    assert ended == [JobEnded(ended[0].time, job, EndReason.FAILED)]
    assert [r.getMessage().split(" (last")[0] for r in caplog.records] == [
        f"job {job} stopped: its tasks failed 2 times within 600 s"]
    backend.poll(time.time())  # cancels it
    cluster.wait_for("the job cancelled", lambda: set(task_states(cluster, job).values())
                     <= {"CANCELLED", "FAILED"}, 15)


@pytest.fixture
def daemon(request: pytest.FixtureRequest, cluster: LocalCluster,
           tmp_path: Path) -> Iterator[LocalDaemon]:
    d = LocalDaemon(cluster, root=tmp_path / f"malletraind-{uuid.uuid4().hex[:8]}")
    d.start()
    yield d
    rep = getattr(request.node, "rep_call", None)
    d.stop()
    if rep is not None and rep.failed:
        print(f"\n==== malletraind log ====\n{d.log_tail(60)}")


def running(cluster: LocalCluster, job: str) -> int:
    return len(cluster.run(["squeue", "-h", "-r", "-j", job, "-t", "R", "-o", "%i"],
                           check=False).stdout.split())


def test_a_node_a_prod_job_used_is_harvested_again_within_seconds(
        cluster: LocalCluster, daemon: LocalDaemon) -> None:
    """bench/e2e.py's phase 2, three rounds: a one-node prod job submitted the moment the
    job runs on all four idle nodes (while its grants are still being confirmed) preempts one
    worker; once it ends, the node trains again within the grant timeout (it stayed idle for
    58 s while the job's one-scale measurement ran out, with no log line)."""
    blocker = cluster.sbatch("-p", "prod", "-N", str(len(cluster.node_names) - 4), "-o",
                             "/dev/null", "--wrap", "sleep 600")
    cluster.wait_for("blocker running", lambda: "RUNNING" in cluster.run(
        ["squeue", "-h", "-j", blocker, "-o", "%T"]).stdout, 20)
    job = elastic(cluster, "1-4", "--comment=profile=no")
    bound = cluster.timings.grant_timeout_s
    cluster.wait_for("the job on all 4 idle nodes", lambda: running(cluster, job) == 4, 30,
                     interval_s=0.05)
    regained = []
    for _ in range(3):
        prod = cluster.sbatch("-p", "prod", "-N", "1", "-o", "/dev/null", "--wrap", "sleep 1")
        cluster.wait_for("prod done", lambda p=prod: cluster.run(
            ["squeue", "-h", "-j", p, "-o", "%T"], check=False).stdout.strip()
            in ("", "COMPLETED"), 30, interval_s=0.05)
        regained.append(cluster.wait_for("the job on all 4 nodes again",
                                         lambda: running(cluster, job) == 4, bound,
                                         interval_s=0.05))
    print(f"prod ended → all 4 nodes running the job again: {regained} s")
    assert len(task_states(cluster, job)) == 4


def test_the_daemon_grows_back_onto_a_node_whose_task_failed_at_start(
        cluster: LocalCluster, daemon: LocalDaemon, tmp_path: Path) -> None:
    """The whole daemon: a job's two tasks both exit 1 at their first start. They are
    requeued held (the job does not end, although none of its tasks is left running) and the
    engine plans again at once (it used to leave the nodes idle until some other event: 4 min
    in bench/e2e.py), so both nodes train again within the grant timeout of the failure."""
    blocker = cluster.sbatch("-p", "prod", "-N", str(len(cluster.node_names) - 2), "-o",
                             "/dev/null", "--wrap", "sleep 600")
    cluster.wait_for("blocker running", lambda: "RUNNING" in cluster.run(
        ["squeue", "-h", "-j", blocker, "-o", "%T"]).stdout, 20)
    marks = tmp_path / "marks"
    marks.mkdir()
    marks.chmod(0o777)
    job = cluster.sbatch("--qos=malletrain", "-N", "1-2", "--comment=profile=no", "-o",
                         "/dev/null", "--chdir=/tmp", script=(
                             f"#!/bin/sh\nf={marks}/$SLURM_ARRAY_TASK_ID\n"
                             "[ -e $f ] || { touch $f; exit 1; }\nexec sleep 600\n"))
    cluster.wait_for("both tasks failed", lambda: len(list(marks.iterdir())) == 2, 30,
                     interval_s=0.05)
    t0 = time.monotonic()
    took = cluster.wait_for("both tasks running again", lambda: running(cluster, job) == 2,
                            cluster.timings.grant_timeout_s, interval_s=0.1)
    print(f"a task failed at start → both nodes running the job again: {time.monotonic() - t0:.2f} s "
          f"(waited {took:.2f} s)")
    assert "requeued held" in daemon.log_text()
    assert sorted(task_states(cluster, job).values()) == ["RUNNING", "RUNNING"]
