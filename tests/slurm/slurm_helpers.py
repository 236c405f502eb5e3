"""Helpers shared by the real-Slurm tests (what the daemon would do, and how to wait for it)."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from malletrain_core.localcluster import LocalCluster
from malletrain_core.localcluster.daemon import LocalDaemon
from malletrain_core.protocol import HookListener, JobEnd, Received


def wait_message(listener: HookListener, match: Callable[[JobEnd], bool],
                 timeout_s: float = 20.0) -> Received:
    """The first job_end datagram that ``match`` accepts (others are skipped)."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"no matching hook datagram within {timeout_s:g} s")
        try:
            got = listener.receive(timeout_s=left)
        except socket.timeout:
            continue
        if isinstance(got.message, JobEnd) and match(got.message):
            return got


def squeue(cluster: LocalCluster, job: str, fmt: str = "%T|%r|%N") -> str:
    """One squeue line for ``job`` (empty once the job left the queue)."""
    return cluster.run(["squeue", "-h", "-j", job, "-o", fmt]).stdout.strip()


def task_state(cluster: LocalCluster, task: str) -> tuple[str, str, str]:
    """(state, reason, nodes) of one array task as squeue shows it."""
    state, reason, nodes = (squeue(cluster, task) or "||").split("|")
    return state, reason, nodes


def wait_task(cluster: LocalCluster, task: str, state: str, timeout_s: float = 30.0,
              reason: str | None = None) -> float:
    """Wait until ``task`` is in ``state`` (and ``reason``); returns the seconds waited."""
    def ok() -> bool:
        s, r, _ = task_state(cluster, task)
        return s == state and (reason is None or r == reason)
    return cluster.wait_for(f"{task} {state} {reason or ''}", ok, timeout_s)


SCRIPT = "#!/bin/sh\nexec sleep 600\n"


def elastic(cluster: LocalCluster, nodes: str, *args: str, user: str | None = None) -> str:
    """Submit ``sbatch --qos=malletrain -N nodes`` (a sleeping script); returns the array id."""
    return cluster.sbatch("--qos=malletrain", "-N", nodes, "-o", "/dev/null", "--chdir=/tmp",
                          *args, user=user, script=SCRIPT)


def grow(cluster: LocalCluster, task: str, node: str, time_limit: str | None = None) -> None:
    """What the daemon does to grow onto ``node``: pin, lift the blackout, release."""
    argv = ["scontrol", "update", f"JobId={task}", f"ReqNodeList={node}", "StartTime=now"]
    if time_limit is not None:
        argv.append(f"TimeLimit={time_limit}")
    cluster.run(argv)
    cluster.run(["scontrol", "release", task])


def require_slurm() -> None:
    missing = [c for c in ("slurmctld", "slurmd", "munged", "sbatch") if not shutil.which(c)]
    if missing:
        pytest.skip(f"Slurm not installed ({', '.join(missing)}): run make setup")
    if os.geteuid() != 0:
        pytest.skip("the local Slurm cluster runs its daemons as root")


def start_cluster(root: Path, **kwargs: object) -> LocalCluster:
    require_slurm()
    cluster = LocalCluster(root=root, **kwargs)  # type: ignore[arg-type]
    report = cluster.start()
    print(f"local cluster {root}: {report.phases_s} (port base {report.port_base})")
    return cluster


@contextlib.contextmanager
def cluster_root(name: str) -> Iterator[Path]:
    """A fresh root directory that other users can traverse (they read its slurm.conf, as on
    a real cluster; pytest's own temp dirs are private), removed afterwards."""
    root = Path(tempfile.mkdtemp(prefix=f"malletrain-{name}-"))
    root.chmod(0o755)
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def cancel_all(cluster: LocalCluster, timeout_s: float = 30.0) -> None:
    """Cancel every job and wait until every node is idle again."""
    if not cluster.is_running():
        return
    ids = cluster.run(["squeue", "-h", "-o", "%F"]).stdout.split()
    if ids:
        cluster.run(["scancel", *sorted(set(ids))], check=False)
    cluster.wait_idle(timeout_s)


def after_test(request: pytest.FixtureRequest, cluster: LocalCluster,
               timeout_s: float = 30.0) -> None:
    """Print the cluster's state if the test failed, then cancel every job."""
    for when in ("setup", "call"):
        rep = getattr(request.node, f"rep_{when}", None)
        if rep is not None and rep.failed:
            print(f"\n==== cluster state after the failure ====\n{cluster.dump()}")
            break
    cancel_all(cluster, timeout_s)


def preemptions(cluster: LocalCluster) -> int:
    """Tasks preempted so far, as the nodes' slurmd logs say."""
    return sum(log.read_text(errors="replace").count("DUE TO PREEMPTION")
               for log in (cluster.run_dir / "log").glob("slurmd-*.log"))


def slurm_view(cluster: LocalCluster) -> tuple[dict[str, set[str]], set[str]]:
    """(elastic job → nodes of its RUNNING tasks, idle nodes) as squeue and sinfo say."""
    held: dict[str, set[str]] = {}
    out = cluster.run(["squeue", "-h", "-r", "-p", "preemptable", "-t", "R",
                       "-o", "%F|%N"]).stdout
    for line in out.splitlines():
        job, node = line.split("|")
        held.setdefault(job, set()).add(node)
    idle = cluster.run(["sinfo", "-h", "-N", "-p", "preemptable", "-t", "idle",
                        "-o", "%N"]).stdout.split()
    return held, set(idle)


def daemon_view(daemon: LocalDaemon) -> tuple[dict[str, set[str]], set[str]]:
    held: dict[str, set[str]] = {}
    free = set()
    for rec in daemon.query("nodes")["nodes"]:
        if rec["state"] == "held":
            held.setdefault(str(rec["job"]), set()).add(rec["node"])
        else:
            free.add(rec["node"])
    return held, free


def views_differ(cluster: LocalCluster, daemon: LocalDaemon) -> str:
    """Empty when the daemon's nodes equal Slurm's, else what differs."""
    s_held, s_idle = slurm_view(cluster)
    d_held, d_free = daemon_view(daemon)
    problems = []
    for job in sorted(set(s_held) | set(d_held)):
        if s_held.get(job, set()) != d_held.get(job, set()):
            problems.append(f"job {job}: Slurm runs it on {sorted(s_held.get(job, ()))}, "
                            f"the daemon holds {sorted(d_held.get(job, ()))}")
    if s_idle != d_free:
        problems.append(f"idle nodes: Slurm {sorted(s_idle)}, daemon free {sorted(d_free)}")
    jobs = {str(j["job"]): j for j in daemon.query("jobs")["jobs"]}
    for job, nodes in s_held.items():
        if job in jobs and jobs[job]["nodes"] != len(nodes):
            problems.append(f"job {job}: daemon's jobs says {jobs[job]['nodes']} nodes, "
                            f"Slurm runs {len(nodes)}")
    return "; ".join(problems)


def wait_agree(cluster: LocalCluster, daemon: LocalDaemon, timeout_s: float = 60.0) -> None:
    """Wait until the daemon's view equals Slurm's on two reads a poll apart."""
    deadline = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < deadline:
        last = views_differ(cluster, daemon)
        if not last:
            time.sleep(1.2)
            last = views_differ(cluster, daemon)
            if not last:
                return
        time.sleep(0.5)
    raise AssertionError(f"the daemon's view never matched Slurm's within {timeout_s:g} s: "
                         f"{last}")
