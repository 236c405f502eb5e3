"""Rescaling in place under real Slurm, directed by a real malletraind.

Elastic jobs submitted with ``sbatch --qos=malletrain`` run ``malletrain-run --inplace`` in
each one-node task, and the training process (tests/workers/inplace_train.py, torch + gloo)
stays alive across epochs. Prod jobs and a second elastic job drive the changes. Each test
asserts which path every change took (the daemon's epoch lines) and fails if a shrink or a
one-node preemption went through the disk; after every change all ranks hold the same state
(digest of model, optimizer, scheduler, sampler and step); the global step never goes back by
more than one step on a shrink or preemption; and along the steps kept every sample is counted
once (the sampler position grows by batch × world per step). The last test runs
examples/train_elastic.py unchanged in place.
"""

from __future__ import annotations

import json
import re
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
from faults_common import daemons_fixture
from slurm_helpers import running, wait_consistent
from training_logs import invariant_problems, read_job

from devtools.localcluster import LocalCluster
from devtools.localcluster.daemon import LocalDaemon
from devtools.runlogs.inplace_logs import change, daemon_epochs, problems, read

pytestmark = [pytest.mark.torch]

BATCH = 8
TRAIN = [sys.executable, "tests/workers/inplace_train.py", "--batch", str(BATCH),
         "--sleep", "0.05", "--checkpoint-every-s", "4"]
# A job's share: with min_share 1 a second elastic job takes its min_nodes from the first one
# (a planned shrink); profiling off, so sizes follow the idle nodes only.
SETTINGS: dict[str, dict[str, Any]] = {"profiler": {"enabled": False},
                                       "allocator": {"min_share": 1.0}}
STANDIN = "#!/bin/sh\nexec sleep 3000\n"


daemons = pytest.fixture(daemons_fixture, name="daemons")


@pytest.fixture
def daemon(daemons: Callable[..., LocalDaemon]) -> LocalDaemon:
    """A malletraind for the test (its view and log are printed if the test failed)."""
    return daemons(SETTINGS)


def prod(cluster: LocalCluster, nodes: int, *where: str) -> str:
    job = cluster.sbatch("-p", "prod", "-N", str(nodes), *where, "-o", "/dev/null",
                         "--wrap", "sleep 3000")
    cluster.wait_for(f"prod job {job} running", lambda: cluster.run(
        ["squeue", "-h", "-j", job, "-t", "R", "-o", "%i"]).stdout.strip() != "", 60)
    return job


def submit(cluster: LocalCluster, daemon: LocalDaemon, nodes: str, outdir: Path) -> str:
    script = daemon.training_script(TRAIN, outdir, inplace=True)
    return cluster.sbatch("--qos=malletrain", "-N", nodes, "--open-mode=append",
                          "--comment=profile=no", "-o", f"{outdir}/task-%A_%a.out",
                          script=script)


def nodes_of(cluster: LocalCluster, job: str) -> list[str]:
    out = cluster.run(["squeue", "-h", "-r", "-j", job, "-t", "R", "-o", "%N"]).stdout
    return sorted(out.split())


def wait_world(cluster: LocalCluster, outdir: Path, job: str, nodes: int, after: int = -1,
               timeout_s: float = 120.0, nproc: int = 1) -> int:
    """The first epoch after ``after`` in which ``nodes × nproc`` ranks train (3 steps each)
    on ``nodes`` RUNNING tasks; returns its number."""
    found: list[int] = []

    def ok() -> bool:
        log = read(outdir, job)
        hits = [e for e in log.epochs() if e > after and log.trained(e, nodes * nproc)]
        if hits and running(cluster, job) == nodes:
            found.append(hits[0])
            return True
        return False

    per_node = f" × {nproc}" if nproc > 1 else ""
    cluster.wait_for(f"job {job} training on {nodes} nodes{per_node} after epoch {after}", ok,
                     timeout_s, interval_s=0.5)
    return found[0]


def paths(daemon: LocalDaemon, job: str, epochs: list[int]) -> dict[int, str]:
    """The path the daemon logged for each of ``epochs`` (it logs at the end of a cycle)."""
    def logged() -> dict[int, tuple[int, str, bool]]:
        return daemon_epochs(daemon.log_text(), job)
    deadline = time.monotonic() + 10
    while not set(epochs) <= set(logged()) and time.monotonic() < deadline:
        time.sleep(0.2)
    got = logged()
    return {e: got[e][1] if e in got else "?" for e in epochs}


def check(outdir: Path, job: str) -> None:
    found = problems(read(outdir, job), BATCH)
    assert not found, "\n".join(found)


def report(what: str, outdir: Path, job: str, pairs: list[tuple[str, int, int]]) -> None:
    log = read(outdir, job)
    rows = [f"{name}: pause {change(log, a, b)[0]:.2f} s, steps lost {change(log, a, b)[1]}"
            for name, a, b in pairs]
    print(f"\n{what}: " + "; ".join(rows))


def test_job_driven_2_3_1_2_in_place(cluster: LocalCluster, daemon: LocalDaemon,
                                     outdir: Path) -> None:
    """Grow 2 → 3 (a prod job ends), planned shrink 3 → 1 (a second elastic job takes its
    share), grow 1 → 2 (that job leaves): every change after the first in place, the same
    processes throughout, no step lost."""
    prod(cluster, 5)
    one = prod(cluster, 1)                       # 2 nodes stay idle
    job = submit(cluster, daemon, "1-3", outdir)
    e0 = wait_world(cluster, outdir, job, 2, timeout_s=150)
    cluster.run(["scancel", one])
    e1 = wait_world(cluster, outdir, job, 3, after=e0)
    other = cluster.sbatch("--qos=malletrain", "-N", "2-2", "--comment=profile=no",
                           "-o", "/dev/null", "--chdir=/tmp", script=STANDIN)
    e2 = wait_world(cluster, outdir, job, 1, after=e1)
    # the leavers' nodes go to the other job once their processes left (at a step boundary)
    cluster.wait_for(f"job {other} on 2 nodes", lambda: len(nodes_of(cluster, other)) == 2, 60)
    prod(cluster, 1, "-w", nodes_of(cluster, other)[0])  # takes one of the other job's nodes
    cluster.run(["scancel", other])
    e3 = wait_world(cluster, outdir, job, 2, after=e2)

    got = paths(daemon, job, [e0, e1, e2, e3])
    epochs = daemon_epochs(daemon.log_text(), job)
    first = min(epochs)  # the job's first epoch starts the processes (nodes may become
    assert epochs[first][1] == "disk"  # ready one by one: 1 → 2 in place before e0)
    later = {e: path for e, (_, path, _) in epochs.items() if first < e <= e3}
    assert set(later.values()) == {"inplace"} and {e1, e2, e3} <= set(later), (got, epochs)
    assert not epochs[e2][2], "the planned shrink abandoned"
    log = read(outdir, job)
    first = {r["pid"] for r in log.in_epoch(e0)}
    assert {r["pid"] for r in log.in_epoch(e2)} <= first, "the survivor was restarted"
    for a, b in ((e0, e1), (e1, e2), (e2, e3)):
        _, lost = change(log, a, b)
        assert lost == 0, f"epoch {a} → {b}: {lost} steps lost on a planned change"
    check(outdir, job)
    report("2→3→1→2 in place", outdir, job,
           [("grow 2→3", e0, e1), ("shrink 3→1", e1, e2), ("grow 1→2", e2, e3)])


def test_planned_shrink_3_2_leaves_at_a_step_boundary(cluster: LocalCluster,
                                                     daemon: LocalDaemon, outdir: Path) -> None:
    """Planned shrink 3 → 2 of one-process nodes (a second elastic job takes one node): the
    leaver's node goes back to Slurm only after its process left at a step boundary, so both
    survivors re-form as planned. Released earlier, requeuehold killed the leaver inside a
    step: its neighbour failed at once, the other survivor waited in the all-reduce for the
    collective timeout (pauses of 20.1, 28.7 and 20.1 s in three runs, once a restart from
    disk; 0.09-0.10 s since)."""
    prod(cluster, 5)
    one = prod(cluster, 1)
    job = submit(cluster, daemon, "1-3", outdir)
    e0 = wait_world(cluster, outdir, job, 2, timeout_s=150)
    cluster.run(["scancel", one])
    e1 = wait_world(cluster, outdir, job, 3, after=e0)
    cluster.sbatch("--qos=malletrain", "-N", "1-1", "--comment=profile=no", "-o", "/dev/null",
                   "--chdir=/tmp", script=STANDIN)
    e2 = wait_world(cluster, outdir, job, 2, after=e1)
    epochs = daemon_epochs(daemon.log_text(), job)
    assert epochs[e2][1] == "inplace" and not epochs[e2][2], epochs
    log = read(outdir, job)
    kinds = [c["change"]["kind"] for c in log.changes if c["change"]["epoch"] == e2]
    assert kinds == ["planned", "planned"], f"the survivors' re-forms into epoch {e2}: {kinds}"
    assert change(log, e1, e2)[1] == 0
    check(outdir, job)
    report("3→2 in place", outdir, job, [("shrink 3→2", e1, e2)])


def test_preemption_of_one_node_then_of_every_node(cluster: LocalCluster, daemon: LocalDaemon,
                                                   outdir: Path) -> None:
    """A prod job takes one of three nodes: the survivors re-form in place (abandon) and lose
    at most the step in flight. Then one prod job takes every node left: the job restarts
    from its disk checkpoint once nodes are idle again."""
    prod(cluster, 5)
    job = submit(cluster, daemon, "1-3", outdir)
    e0 = wait_world(cluster, outdir, job, 3, timeout_s=150)
    taker = prod(cluster, 1, "-w", nodes_of(cluster, job)[-1])
    e1 = wait_world(cluster, outdir, job, 2, after=e0)
    cluster.wait_for(f"a checkpoint in epoch {e1}", lambda: max(read_checkpoints(outdir, job))
                     in {r["step"] for r in read(outdir, job).in_epoch(e1)}, 30, interval_s=0.5)
    left = nodes_of(cluster, job)
    everything = prod(cluster, len(left), "-w", ",".join(left))
    cluster.wait_for("no task of the job running", lambda: running(cluster, job) == 0, 30)
    at_loss = read(outdir, job).max_step()
    saved = max(c for c in read_checkpoints(outdir, job) if c <= at_loss)
    for t in (taker, everything):
        cluster.run(["scancel", t])
    e2 = wait_world(cluster, outdir, job, 3, after=e1, timeout_s=150)
    # the workers may train in an epoch before the daemon's log line for it is read here
    cluster.wait_for(f"the daemon's epoch line for epoch {e2}",
                     lambda: e2 in daemon_epochs(daemon.log_text(), job), 10, interval_s=0.2)

    epochs = daemon_epochs(daemon.log_text(), job)
    first = min(epochs)
    assert epochs[first][1] == "disk"
    assert epochs[e1][1:] == ("inplace", True), f"one-node preemption: {epochs[e1]}"
    back = [e for e in sorted(epochs) if e1 < e <= e2 and epochs[e][1] == "disk"]
    assert len(back) == 1, f"after every node was lost: {epochs}"
    others = {e: p for e, (_, p, _) in epochs.items() if e not in (first, back[0]) and e <= e2}
    assert set(others.values()) == {"inplace"}, epochs
    log = read(outdir, job)
    _, lost = change(log, e0, e1)
    assert lost <= 1, f"the one-node preemption lost {lost} steps"
    resumed = min(r["step"] for r in log.in_epoch(back[0])) - 1
    assert resumed == saved, f"resumed at step {resumed}, the last checkpoint was {saved}"
    check(outdir, job)
    report("preemptions", outdir, job, [("one node of 3", e0, e1),
                                        ("every node", e1, back[0])])


def read_checkpoints(outdir: Path, job: str) -> list[int]:
    out = []
    for path in outdir.glob(f"task-{job}_*.out"):
        out += [int(m) for m in re.findall(r'^\{"checkpoint": (\d+)',
                                           path.read_text(errors="replace"), re.M)]
    return out or [0]


def test_daemon_killed_in_the_middle_of_a_reform(cluster: LocalCluster, daemon: LocalDaemon,
                                                 outdir: Path) -> None:
    """malletraind is SIGKILLed the moment the first launcher relays a grow's new epoch (the
    others have not been told; the daemon may not have saved it) and restarted 2 s later: the
    job trains again at the new size with equal states, from memory or from disk."""
    prod(cluster, 5)
    one = prod(cluster, 1)
    job = submit(cluster, daemon, "1-3", outdir)
    e0 = wait_world(cluster, outdir, job, 2, timeout_s=150)
    relayed = re.compile(r"^malletrain-run: epoch (\d+): rank \d+ of 3 in place", re.M)

    def relaying() -> bool:
        return any(int(e) > e0 for path in outdir.glob(f"task-{job}_*.out")
                   for e in relayed.findall(path.read_text(errors="replace")))

    cluster.run(["scancel", one])
    cluster.wait_for("a launcher relaying the grow", relaying, 60, interval_s=0.01)
    daemon.kill()
    killed_at = time.time()
    time.sleep(2)
    daemon.start()
    e1 = wait_world(cluster, outdir, job, 3, after=e0, timeout_s=150)
    log = read(outdir, job)
    # the checkpoints on disk when the daemon died (a job that recovers from disk rolls back
    # and writes later checkpoints of steps it had already passed)
    saved = [int(step) for path in outdir.glob(f"task-{job}_*.out")
             for step, t in re.findall(r'^\{"checkpoint": (\d+), "t": ([\d.]+)',
                                       path.read_text(errors="replace"), re.M)
             if float(t) <= killed_at] or [0]
    assert min(r["step"] for r in log.in_epoch(e1)) - 1 >= max(saved), "went back past the disk"
    check(outdir, job)
    # nobody was stopped or lost: before, the restarted daemon (which had not saved the
    # grow's epoch) stopped the launcher already in it, or the re-forms that followed killed
    # one node's processes each ("Failed to recv" at the store), then resumed from disk
    epochs = daemon_epochs(daemon.log_text(), job)
    after = {e: v for e, v in epochs.items() if e > e0}
    assert all(p == "inplace" and not a for _, p, a in after.values()), epochs
    texts = "".join(p.read_text(errors="replace") for p in outdir.glob(f"task-{job}_*.out"))
    assert "stopping workers" not in texts and "Failed to recv" not in texts
    assert texts.count("started ahead of its epoch") == 3, "a training process was restarted"
    print(f"\ndaemon killed mid re-form: recovered at world 3 in epoch {e1} "
          f"(path {paths(daemon, job, [e1])[e1]}); pid set "
          f"{'kept' if {r['pid'] for r in log.in_epoch(e1)} & {r['pid'] for r in log.in_epoch(e0)} else 'new'}")


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["kill-9", "restart"])
def test_daemon_restart_without_a_change_costs_no_epoch(cluster: LocalCluster,
                                                        daemon: LocalDaemon, outdir: Path,
                                                        sig: int) -> None:
    """A job trains at world 3; malletraind is SIGKILLed (or stopped as by a restart) and
    started again 3 s later. The job trains on in the same epoch, with the same processes, no
    epoch started for 20 s after (past the launchers' timeout); a preemption ordered after
    the daemon's return is in place."""
    prod(cluster, 5)
    job = submit(cluster, daemon, "1-3", outdir)
    e0 = wait_world(cluster, outdir, job, 3, timeout_s=150)
    cluster.wait_for(f"the daemon's line for epoch {e0}",
                     lambda: e0 in daemon_epochs(daemon.log_text(), job), 10, interval_s=0.2)
    daemon.kill(sig)
    down_at = time.time()
    time.sleep(3)
    daemon.start()
    time.sleep(20)
    log = read(outdir, job)
    since = [r for r in log.steps if r["t"] > down_at]
    assert {r["epoch"] for r in since} == {e0}, sorted({r["epoch"] for r in since})
    assert len(since) >= 3 * 20, f"only {len(since)} steps after the restart"
    assert max(daemon_epochs(daemon.log_text(), job)) == e0, "an epoch after the restart"
    pids = {r["pid"] for r in log.in_epoch(e0)}
    prod(cluster, 1, "-w", nodes_of(cluster, job)[-1])
    e1 = wait_world(cluster, outdir, job, 2, after=e0)
    assert paths(daemon, job, [e1]) == {e1: "inplace"}
    assert {r["pid"] for r in read(outdir, job).in_epoch(e1)} <= pids
    check(outdir, job)


def test_with_the_daemon_down_survivors_find_a_dead_node_themselves(
        cluster: LocalCluster, daemon: LocalDaemon, outdir: Path) -> None:
    """A job trains on three one-process nodes; malletraind is SIGKILLed, then one node's
    launcher and training process are (the node gone, no order can come). Both survivors
    find it by its heartbeat within 2 s and abandon the epoch (they print one line); when
    the daemon is back (5 s later) their launchers name the silent node and the next epoch
    is in place with ``abandon``, the survivors' processes kept. Before: nothing found it,
    one survivor waited in its collective for the whole timeout, the daemon for the
    launcher's silence (15 s)."""
    prod(cluster, 5)
    job = submit(cluster, daemon, "1-3", outdir)
    e0 = wait_world(cluster, outdir, job, 3, timeout_s=150)
    rows = read(outdir, job).in_epoch(e0)
    victim = next(r for r in rows if r["rank"] == 2)
    survivors = {r["task"].split(":")[0] for r in rows if r["rank"] != 2}
    daemon.kill()
    launcher = psutil.Process(victim["pid"]).parent()
    assert launcher is not None and "malletrain" in " ".join(launcher.cmdline())
    t_kill = time.time()
    launcher.kill()
    found: dict[str, float] = {}

    def abandoned() -> bool:
        for name in survivors - set(found):
            if "abandoning epoch" in (outdir / name).read_text(errors="replace"):
                found[name] = time.time() - t_kill
        return len(found) == len(survivors)

    cluster.wait_for("both survivors abandoning the epoch", abandoned, 30, interval_s=0.05)
    time.sleep(max(0.0, 5 - (time.time() - t_kill)))
    daemon.start()
    t_back = time.time()
    # the dead node's task comes back and joins within seconds: the survivors' epoch of two
    # may be replaced by the next one (world 3, in place) before it commits many steps, so
    # what is waited for is training again, in either
    cluster.wait_for("training again after the daemon's return", lambda: any(
        read(outdir, job).trained(e, w) for e in read(outdir, job).epochs() if e > e0
        for w in (2, 3)), 60, interval_s=0.5)
    log = read(outdir, job)
    e1 = e0 + 1  # the daemon's first epoch after its return: the survivors'
    resumed = min((r["t"] for e in log.epochs() if e > e0 for r in log.in_epoch(e)),
                  default=float("nan")) - t_back
    print("\nnode killed with the daemon down: found by the survivors after "
          + ", ".join(f"{v:.2f} s" for v in sorted(found.values()))
          + f"; training again {resumed:.2f} s after the daemon was back")
    assert max(found.values()) < 2.0, found
    assert paths(daemon, job, [e1]) == {e1: "inplace"}
    world, _, abandon = daemon_epochs(daemon.log_text(), job)[e1]
    assert world == 2 and abandon, (world, abandon)
    # the survivors' processes were kept through both changes
    kept = {r["pid"] for r in rows if r["rank"] != 2}
    after = {r["pid"] for e in log.epochs() if e > e0 for r in log.in_epoch(e)}
    assert kept <= after and len(after - kept) <= 1, (kept, after)
    check(outdir, job)


EXAMPLE = [sys.executable, "examples/train_elastic.py", "--steps", "0", "--batch", "8",
           "--step-sleep-s", "0.05", "--checkpoint-every-s", "5", "--log-every", "1"]


def test_the_example_script_runs_in_place(cluster: LocalCluster, daemon: LocalDaemon,
                                          outdir: Path) -> None:
    """examples/train_elastic.py, unchanged, under ``malletrain-run --inplace``: it trains on
    two nodes, a prod job preempts one, the survivor re-forms in place (the same process) and
    goes on from where it was, with the ranks' parameters equal at every step."""
    prod(cluster, 6)
    script = daemon.training_script(EXAMPLE, outdir, inplace=True)
    job = cluster.sbatch("--qos=malletrain", "-N", "1-2", "--open-mode=append",
                         "--comment=profile=no", "-o", f"{outdir}/task-%A_%a.out",
                         script=script)
    _, e0 = wait_consistent(cluster, job, outdir, timeout_s=150, at_least=2)
    prod(cluster, 1, "-w", nodes_of(cluster, job)[-1])
    k, e1 = wait_consistent(cluster, job, outdir, timeout_s=60, after_epoch=e0)
    assert k == 1
    cluster.wait_for(f"5 steps in epoch {e1}", lambda: len(read_job(outdir, job).steps[e1]) >= 5,
                     30, interval_s=0.5)
    log = read_job(outdir, job)
    epochs = daemon_epochs(daemon.log_text(), job)
    assert all(epochs[e][1] == "inplace" for e in epochs if e > min(epochs)), epochs
    problems_ = [p for p in invariant_problems(log) if "resumed at step" not in p]
    assert not problems_, "\n".join(problems_)  # in place a start line is a re-form
    last = max(s for s, *_ in log.steps[e0])
    first = min(s for s, *_ in log.steps[e1])
    assert first >= last, f"the step went back from {last} to {first - 1}"
    survivor = [p for p in outdir.glob(f"task-{job}_*.out")
                if f"epoch {e1}: rank 0 of 1 in place" in p.read_text(errors="replace")]
    assert len(survivor) == 1 and survivor[0].read_text(errors="replace").count(
        "training process started ahead") == 1, "the survivor's process was restarted"


NAS = [sys.executable, "examples/nas_cell.py", "--cell-seed", "3", "--batch", "4",
       "--checkpoint-every-s", "5", "--log-every", "5"]
NAS_START = re.compile(r"^start cell=.* epoch=(\d+) world=(\d+) rank=(\d+)", re.M)


def nas_epochs(outdir: Path, job: str) -> dict[int, set[int]]:
    """Epoch → the ranks whose ``start`` line (printed when an epoch begins) names it."""
    out: dict[int, set[int]] = {}
    for path in outdir.glob(f"task-{job}_*.out"):
        for m in NAS_START.finditer(path.read_text(errors="replace")):
            out.setdefault(int(m[1]), set()).add(int(m[3]))
    return out


def test_the_nas_example_runs_in_place(cluster: LocalCluster, daemon: LocalDaemon,
                                       outdir: Path) -> None:
    """examples/nas_cell.py (what examples/nas.sbatch runs, ``--inplace``) trains on two
    nodes; a prod job preempts one; the survivor re-forms in place, is never restarted, and
    its counters go on."""
    prod(cluster, 6)
    script = daemon.training_script(NAS, outdir, inplace=True)
    job = cluster.sbatch("--qos=malletrain", "-N", "1-2", "--open-mode=append",
                         "--comment=profile=no", "-o", f"{outdir}/task-%A_%a.out",
                         script=script)
    found: list[int] = []

    def at(world: int, after: int = -1) -> bool:
        hits = [e for e, ranks in nas_epochs(outdir, job).items()
                if e > after and ranks == set(range(world))]
        if hits and running(cluster, job) == world:
            found.append(max(hits))
            return True
        return False

    cluster.wait_for("the NAS job training on 2 nodes", lambda: at(2), 180, interval_s=0.5)
    e0 = found[-1]
    prod(cluster, 1, "-w", nodes_of(cluster, job)[-1])
    cluster.wait_for("the NAS job training on 1 node", lambda: at(1, e0), 90, interval_s=0.5)
    e1 = found[-1]
    ckpt = next(outdir.glob(f"ckpt-{job}"))
    before = json.loads((ckpt / "counters.json").read_text())["samples"]
    cluster.wait_for("the survivor training on", lambda: json.loads(
        (ckpt / "counters.json").read_text())["samples"] >= before + 5 * 4, 60, interval_s=0.5)
    counters = json.loads((ckpt / "counters.json").read_text())
    epochs = daemon_epochs(daemon.log_text(), job)
    assert all(epochs[e][1] == "inplace" for e in epochs if e > min(epochs)), epochs
    assert counters["restarts"] == 0 and e1 in counters["epochs"], counters
    assert counters["world_sizes"][-1] == 1 and 2 in counters["world_sizes"], counters
    survivor = [p for p in outdir.glob(f"task-{job}_*.out")
                if f"epoch {e1}: rank 0 of 1 in place" in p.read_text(errors="replace")]
    assert len(survivor) == 1 and survivor[0].read_text(errors="replace").count(
        "training process started ahead") == 1, "the survivor's process was restarted"
    print(f"\nNAS example in place: epochs {e0} (2 nodes) -> {e1} (1 node), "
          f"samples {counters['samples']}, world sizes {counters['world_sizes']}")
