"""The in-place and the restart path side by side (phase 4 of bench/e2e.py).

On the same cluster and the same malletraind, one elastic job per path (``-N 1-4`` on the 4
idle nodes, tests/workers/inplace_train.py: one script, started by ``malletrain-run --inplace``
or by ``malletrain-run``, which runs it under torchrun each epoch), one path after the other,
``rounds`` rounds each of:

* **preemption** 4 → 3: a one-node prod job pinned to one of the job's nodes;
* **grow** 3 → 4: that prod job is cancelled;
* **planned shrink** 4 → 2: a second elastic job (a stand-in that sleeps) takes its share
  (``allocator.min_share = 1``);
* **grow** 2 → 4: the stand-in is cancelled.

Per change: the *pause* on the members that lived through it (the gap between their last
step timestamp before and their first after; median over them), the *steps lost* (last global
step before − first step after + 1) and, for a grow, *node idle → training* (from squeue showing
the node free to the first step at the larger world size). The worker prints a JSON line per
step (wall-clock time, global step, epoch, world); the daemon logs each epoch's path.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

from devtools.localcluster import LocalCluster  # noqa: E402
from devtools.localcluster.daemon import LocalDaemon  # noqa: E402
from devtools.runlogs.inplace_logs import change, daemon_epochs, read  # noqa: E402
from devtools.waiting import wait_until  # noqa: E402

TRAIN = [sys.executable, "tests/workers/inplace_train.py", "--batch", "8", "--sleep", "0.05",
         "--checkpoint-every-s", "10", "--digest-every", "50"]
STANDIN = "#!/bin/sh\nexec sleep 100000\n"
SETTINGS = {"allocator": {"min_share": 1.0}}
"""What bench/e2e.py's daemon needs for the planned shrink (a second job takes its share)."""


def _run(cluster: LocalCluster, *argv: str) -> str:
    return cluster.run(list(argv), check=False).stdout


def _gone(cluster: LocalCluster, job: str) -> bool:
    return not _run(cluster, "squeue", "-h", "-j", job, "-o", "%i").strip()


def _running(cluster: LocalCluster, job: str) -> list[str]:
    return sorted(_run(cluster, "squeue", "-h", "-r", "-j", job, "-t", "R", "-o", "%N").split())


def world_epoch(outdir: Path, job: str, world: int, after: int, running: Callable[[], int],
                timeout_s: float = 240.0) -> int:
    """The first epoch after ``after`` in which every rank of ``world`` trained 2 steps, once
    the batch system runs ``world`` of the job's tasks (``running``)."""
    found: list[int] = []

    def ok() -> bool:
        log = read(outdir, job)
        hits = [e for e in log.epochs() if e > after and log.trained(e, world, 2)]
        if hits and running() == world:
            found.append(hits[0])
            return True
        return False

    wait_until(f"job {job} training at world {world}", ok, timeout_s, 0.5)
    return found[0]


def _world(cluster: LocalCluster, outdir: Path, job: str, world: int, after: int,
           timeout_s: float = 240.0) -> int:
    return world_epoch(outdir, job, world, after, lambda: len(_running(cluster, job)),
                       timeout_s)


LIVE = ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "REQUEUED",
        "REQUEUE_HOLD", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED", "SPECIAL_EXIT")


def lost_tasks(cluster: LocalCluster, job: str) -> list[str]:
    """The tasks of a live elastic job that have ended (FAILED, ...): a job keeps every task
    until it is cancelled or completes, so each one here is a task the job lost for good."""
    out = _run(cluster, "squeue", "-h", "-r", "-t", "all", "-j", job, "-o", "%i|%T")
    return [f"{i} {st}" for i, st in (line.split("|") for line in out.splitlines() if line)
            if st not in LIVE]


def one_path(cluster: LocalCluster, daemon: LocalDaemon, work: Path, inplace: bool,
             rounds: int, idle: int = 4, lost: list[str] | None = None) -> dict[str, Any]:
    """``rounds`` rounds of preemption, grow, planned shrink, grow on one path."""
    name = "inplace" if inplace else "restart"
    outdir = work / f"out-{name}"
    outdir.mkdir()
    outdir.chmod(0o777)
    script = daemon.training_script(TRAIN, outdir, inplace=inplace)
    job = cluster.sbatch("--qos=malletrain", f"-N1-{idle}", "--comment=profile=no",
                         "--open-mode=append", "-o", f"{outdir}/task-%A_%a.out", script=script)
    e = _world(cluster, outdir, job, idle, -1, 300)
    load = [os.getloadavg()[0]]
    done: dict[str, list[tuple[int, int, float | None]]] = {"preempt": [], "grow": [],
                                                           "shrink": []}
    def to(world: int, kind: str, t_idle: float | None = None) -> None:
        nonlocal e
        nxt = _world(cluster, outdir, job, world, e)
        done[kind].append((e, nxt, t_idle))
        e = nxt

    def free(other: str) -> float:
        """Cancel ``other``; the time its nodes are free as squeue says."""
        cluster.run(["scancel", other])
        wait_until(f"job {other} gone", lambda: _gone(cluster, other), 60, 0.05)
        return time.time()

    for r in range(rounds):
        prod = cluster.sbatch("-p", "prod", "-N", "1", "-w", _running(cluster, job)[-1],
                              "-o", "/dev/null", "--wrap", "sleep 100000")
        to(idle - 1, "preempt")
        to(idle, "grow", free(prod))
        standin = cluster.sbatch("--qos=malletrain", "-N", "2-2", "--comment=profile=no",
                                 "-o", "/dev/null", "--chdir=/tmp", script=STANDIN)
        to(idle - 2, "shrink")
        to(idle, "grow", free(standin))
        load.append(os.getloadavg()[0])
        print(f"[{time.strftime('%H:%M:%S')}] {name}: round {r + 1}/{rounds} done",
              file=sys.stderr, flush=True)
    wait_until("the daemon's epoch lines", lambda: e in daemon_epochs(daemon.log_text(), job), 15)
    epochs = daemon_epochs(daemon.log_text(), job)
    if lost is not None:
        lost += lost_tasks(cluster, job)
    cluster.run(["scancel", job])
    wait_until("training job gone", lambda: _gone(cluster, job), 60, 0.5)
    return summarize(read(outdir, job), epochs, done, load)


def summarize(log: Any, epochs: dict[int, tuple[int, str, bool]],
              done: dict[str, list[tuple[int, int, float | None]]],
              load: list[float]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    lost_all = []
    for kind, changes in done.items():
        pauses, lost, paths = [], [], []
        for a, b, _ in changes:
            pause, n = change(log, a, b)
            pauses.append(round(pause, 3))
            lost.append(n)
            paths.append(epochs.get(b, (0, "?", False))[1])
        out[f"{kind}_pause_s"] = statistics.median(pauses)
        out[f"{kind}_pause_s_all"] = pauses
        out[f"{kind}_steps_lost_all"] = lost
        out[f"{kind}_paths"] = paths
        lost_all += lost
    idle_to = []
    for _a, b, t_idle in done["grow"]:
        assert t_idle is not None
        first = min(r["t"] for r in log.in_epoch(b))
        idle_to.append(round(first - t_idle, 2))
    out["steps_lost"] = max(lost_all)
    out["idle_to_training_s"] = statistics.median(idle_to)
    out["idle_to_training_s_all"] = idle_to
    out["load_1min"] = [round(x, 1) for x in load]
    return out


def run_paths(cluster: LocalCluster, daemon: LocalDaemon, work: Path,
              rounds: int, lost: list[str] | None = None) -> dict[str, Any]:
    """Both paths, in place first; returns ``{"inplace": {...}, "restart": {...}}``; the
    tasks a job lost for good are added to ``lost``."""
    return {"inplace": one_path(cluster, daemon, work, True, rounds, lost=lost),
            "restart": one_path(cluster, daemon, work, False, rounds, lost=lost)}
