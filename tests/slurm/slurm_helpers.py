"""Helpers shared by the real-Slurm tests (what the daemon would do, and how to wait for it)."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Protocol

import pytest
from training_logs import read_job

from devtools.localcluster import LocalCluster
from devtools.localcluster.daemon import LocalDaemon, view_differences, wait_views_agree
from devtools.waiting import wait_until
from malletrain_core.wire.hooks import HookSocket, JobEnd, Received


def wait_message(listener: HookSocket, match: Callable[[JobEnd], bool],
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
    if kwargs.get("mode") == "accounting" and cluster.release.chrooted:
        pytest.skip(f"accounting mode runs on the host's Slurm only (its slurmdbd and "
                    f"MariaDB), not on {cluster.release.name}: `make test` runs it on 22.05")
    report = cluster.start()
    # In-process callers (admin check, the backend's runner) find this release's commands.
    os.environ["PATH"] = cluster.release.env(dict(os.environ))["PATH"]
    print(f"local cluster {root}: {report.phases_s} (port base {report.port_base}, "
          f"Slurm {cluster.release.name})")
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


@contextlib.contextmanager
def own_cluster(name: str, **kwargs: object) -> Iterator[LocalCluster]:
    """A cluster of a test module's own (:func:`start_cluster` ``kwargs``) in a fresh root,
    stopped afterwards."""
    with cluster_root(name) as root:
        cluster = start_cluster(root, **kwargs)
        try:
            yield cluster
        finally:
            cluster.stop()


def cancel_all(cluster: LocalCluster, timeout_s: float = 30.0) -> None:
    """Cancel every job and wait until every node is idle again and the queue is empty (a
    job still completing would be seen by the next test)."""
    if not cluster.is_running():
        return
    ids = cluster.run(["squeue", "-h", "-o", "%F"]).stdout.split()
    if ids:
        cluster.run(["scancel", *sorted(set(ids))], check=False)
    cluster.wait_idle(timeout_s)
    cluster.wait_for("an empty queue", lambda: not cluster.run(
        ["squeue", "-h", "-o", "%i"], check=False).stdout.strip(), timeout_s, interval_s=0.2)


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


def views_differ(cluster: LocalCluster, daemon: LocalDaemon) -> str:
    """Empty when the daemon's nodes equal Slurm's, else what differs."""
    return view_differences("Slurm", slurm_view(cluster), daemon)


def wait_agree(cluster: LocalCluster, daemon: LocalDaemon, timeout_s: float = 60.0) -> None:
    """Wait until the daemon's view equals Slurm's on two reads a poll apart."""
    wait_views_agree(lambda: views_differ(cluster, daemon), "Slurm", timeout_s)


@dataclass(frozen=True)
class ControllerRecord:
    """One slurmctld log line about a job: ``kind`` is ``preempted`` (``job`` is the task
    requeued, ``other`` the job it made room for), ``completed`` (``job`` ended), or
    ``started`` (``job`` started on node ``other``; array tasks as ``A_i``)."""

    time: float
    kind: str
    job: str
    other: str


_CTLD_LINE = re.compile(r"^\[([0-9T:.-]+)\] (.*)$")
_CTLD_KINDS = (
    ("preempted", re.compile(r"^preempted JobId=(\S+?)(?:\(\d+\))? has been requeued to "
                             r"reclaim resources for JobId=(\S+)")),
    ("completed", re.compile(r"^_job_complete: JobId=(\S+?)(?:\(\d+\))? done()")),
    # 26.05 logs backfill's starts as a HetJob debug flag's line ("_start_job: HETJOB: ...")
    ("started", re.compile(r"^sched(?:/backfill)?: (?:_start_job: (?:HETJOB: )?Started|Allocate) "
                           r"JobId=(\S+?)(?:\(\d+\))? (?:in \S+ on |NodeList=)(\S+)")),
)


def controller_log_size(cluster: LocalCluster) -> int:
    """The slurmctld log's current length: pass it as ``since`` to read what comes next."""
    path = cluster.run_dir / "log" / "slurmctld.log"
    return path.stat().st_size if path.exists() else 0


def controller_records(cluster: LocalCluster, since: int = 0) -> list[ControllerRecord]:
    """Preemptions, job ends and job starts in the slurmctld log from byte ``since`` on (the
    log's times are the controller's local time, to the millisecond)."""
    with open(cluster.run_dir / "log" / "slurmctld.log", "rb") as log:
        log.seek(since)
        text = log.read().decode(errors="replace")
    out = []
    for line in text.splitlines():
        m = _CTLD_LINE.match(line)
        if m is None:
            continue
        for kind, pattern in _CTLD_KINDS:
            hit = pattern.match(m.group(2))
            if hit is not None:
                job, other = hit.groups()
                out.append(ControllerRecord(datetime.fromisoformat(m.group(1)).timestamp(),
                                            kind, job, other))
                break
    return out


def elastic_nodes(cluster: LocalCluster) -> set[str]:
    """Nodes with a RUNNING elastic task."""
    return set(cluster.run(["squeue", "-h", "-r", "-p", "preemptable", "-t", "R",
                            "-o", "%N"]).stdout.split())


def drive_storm(cluster: LocalCluster, rounds: int, prod_s: float,
                timeout_s: float) -> dict[str, str]:
    """Submit one-node prod jobs of ``prod_s`` seconds, each pinned to a node the instant an
    elastic task runs there and no earlier prod job of the storm is left on it, ``rounds``
    per node; returns prod job id → node."""
    submitted: dict[str, str] = {}
    on_node: dict[str, str] = {}
    per_node = dict.fromkeys(cluster.node_names, 0)
    deadline = time.monotonic() + timeout_s
    while any(n < rounds for n in per_node.values()):
        if time.monotonic() > deadline:
            raise AssertionError(f"the storm stalled: prod jobs per node {per_node}\n"
                                 f"{cluster.dump()}")
        live = set(cluster.run(["squeue", "-h", "-p", "prod", "-o", "%i"]).stdout.split())
        on_node = {node: job for node, job in on_node.items() if job in live}
        for node in sorted(elastic_nodes(cluster) - set(on_node)):
            if per_node[node] < rounds:
                job = cluster.sbatch("-p", "prod", "-N", "1", "-w", node, "-o", "/dev/null",
                                     "--wrap", f"sleep {prod_s:g}")
                submitted[job], on_node[node] = node, job
                per_node[node] += 1
        time.sleep(0.05)
    return submitted


@dataclass
class StormCount:
    """What slurmctld logged of the storm (times are the controller's, in seconds)."""

    preempted: list[float]   # an elastic task requeued for a storm prod job
    idle: list[float]        # a storm prod job ended; the daemon then restarted a task there
    ended_unseen: int        # prod jobs whose node got no elastic task back afterwards
    first: float
    last: float
    regrow_s: list[float]    # from each counted idle event to the elastic task's start

    @property
    def events(self) -> int:
        return len(self.preempted) + len(self.idle)

    @property
    def window_s(self) -> float:
        return self.last - self.first


def count_storm(records: list[ControllerRecord], prods: dict[str, str]) -> StormCount:
    """Preemptions for the storm's prod jobs, and ends of those jobs after which an elastic
    task (held until the daemon releases it) started on the freed node before the next prod
    job on that node ended."""
    preempted = [r.time for r in records if r.kind == "preempted" and r.other in prods]
    ends: dict[str, list[float]] = {}
    starts: dict[str, list[float]] = {}
    for r in records:
        if r.kind == "completed" and r.job in prods:
            ends.setdefault(prods[r.job], []).append(r.time)
        elif r.kind == "started" and "_" in r.job:  # an elastic job's array task
            starts.setdefault(r.other, []).append(r.time)
    idle: list[float] = []
    regrow_s: list[float] = []
    unseen = 0
    for node, times in ends.items():
        times.sort()
        for i, t in enumerate(times):
            until = times[i + 1] if i + 1 < len(times) else float("inf")
            back = [s for s in starts.get(node, ()) if t <= s < until]
            if back:
                idle.append(t)
                regrow_s.append(min(back) - t)
            else:
                unseen += 1
    every = preempted + [t for times in ends.values() for t in times]
    assert every, "slurmctld logged no event of the storm"
    return StormCount(preempted, idle, unseen, min(every), max(every), sorted(regrow_s))


def command_shims(cluster: LocalCluster, folder: Path) -> tuple[Path, Path]:
    """A folder of shims for the Slurm commands (a daemon's ``slurm.bin_dir``) that log each
    call to a file, then run the release's command: (the folder, the log)."""
    from devtools.localcluster.releases import CLIENTS
    spawned, bin_dir = folder / "spawned.txt", folder / "bin"
    bin_dir.mkdir()
    for name in CLIENTS:
        real = cluster.release.bin_dir / name if cluster.release.bin_dir else Path(name)
        (bin_dir / name).write_text(f"#!/bin/sh\necho \"{name} $*\" >> '{spawned}'\n"
                                    f"exec '{real}' \"$@\"\n")
        (bin_dir / name).chmod(0o755)
    return bin_dir, spawned


def running(cluster: LocalCluster, job: str) -> int:
    out = cluster.run(["squeue", "-h", "-r", "-j", job, "-t", "R", "-o", "%i"]).stdout
    return len(out.split())


class Latest(Protocol):
    """What a reader of the workers' step lines returns (``read_job``, the integrations' log)."""

    def latest(self) -> tuple[int, int, set[int]] | None: ...


def wait_consistent(cluster: LocalCluster, job: str, outdir: Path, timeout_s: float,
                    at_least: int = 1, after_epoch: int = -1, world: int | None = None,
                    reader: Callable[[Path, str], Latest] = read_job) -> tuple[int, int]:
    """Wait until the job's newest epoch (later than ``after_epoch``) trains with exactly its
    RUNNING tasks as ranks (at least ``at_least``, ``world`` when given), as ``reader`` reads
    the workers' step lines; returns (tasks, epoch)."""
    seen = "no step lines"

    def consistent() -> tuple[int, int] | None:
        nonlocal seen
        k = running(cluster, job)
        latest = reader(outdir, job).latest()
        if latest is None:
            return None
        epoch, w, ranks = latest
        seen = f"{k} RUNNING tasks, epoch {epoch}: world {w}, ranks {sorted(ranks)}"
        if epoch > after_epoch and k >= at_least and w == k and (world is None or k == world) \
                and ranks == set(range(k)) and running(cluster, job) == k:
            return k, epoch
        return None
    return wait_until(f"job {job}: training matching its RUNNING tasks", consistent, timeout_s,
                      1.0, detail=lambda: f"last seen: {seen}")
