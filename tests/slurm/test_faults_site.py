"""Faults a site sees, under a real malletraind on the real local Slurm cluster (second set).

The control plane failing under a training job (munged restarted, munged down, slurmctld hung
by SIGSTOP, the daemon's host rebooted with its state directory intact and its sockets gone),
a slurmd hung while its task runs, a node whose clock jumps, the checkpoint folder full and
read-only, the state database corrupt and truncated, and the daemon SIGKILLed in the middle
of a planned shrink: while rank 0 checkpoints for it, and once Slurm has carried it out.

Every scenario ends the same way: Slurm's view and the daemon's are equal (``wait_agree``), a
one-node prod job that must preempt an elastic task starts within :data:`PROD_START_S`
(the delay is recorded), and the training log passes the invariants (every rank of an epoch
agrees, steps never go back except to a checkpoint). The progress lost is measured from the
workers' own step lines (``faults_common.samples_lost``), never assumed.
"""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from faults_common import (
    BATCH,
    NO_PROFILING,
    TRAIN,
    assert_invariants,
    daemons_fixture,
    gone,
    history,
    outdir_fixture,
    path_fixture,
    prod,
    record,
    samples_lost,
    training_script,
    wait_running,
    write_results,
)
from slurm_helpers import running, wait_agree, wait_consistent
from training_logs import read_job

from devtools.localcluster import LocalCluster
from devtools.localcluster.daemon import LocalDaemon
from devtools.localcluster.faults import (
    controller_pid,
    pause,
    resume,
    slurmd_pid,
    start_munged,
    stop_munged,
)
from devtools.waiting import wait_until

pytestmark = [pytest.mark.faults, pytest.mark.torch]

PROD_START_S = 10.0
"""A prod job must start within this (sbatch returned → RUNNING) after every scenario; the
local cluster's preemption takes about 1 s (BENCHMARKS, load section)."""

LONG = os.environ.get("MALLETRAIN_LONG_FAULTS", "") not in ("", "0")
long_scenario = pytest.mark.skipif(not LONG, reason="one of the two slowest fault scenarios "
                                   "(2-3 min each): `make test-long` runs them")
"""The slowest scenarios run in ``make test-long`` (``MALLETRAIN_LONG_FAULTS=1``) and in
``bench/faults.py``, which sets it; ``make test`` runs the others."""

FAKETIME = next(iter(sorted(Path("/usr/lib").glob("*/faketime/libfaketime.so.1"))),
                Path("/usr/lib/faketime/libfaketime.so.1"))
"""Debian's libfaketime (package ``faketime``, installed by scripts/setup-machine.sh)."""


@pytest.fixture(scope="module", autouse=True)
def results() -> Iterator[None]:
    yield
    write_results()


daemons = pytest.fixture(daemons_fixture, name="daemons")
outdir = pytest.fixture(outdir_fixture, name="outdir")
on_path = pytest.fixture(path_fixture, name="on_path", autouse=True)


# ---------------------------------------------------------------------------- helpers
def start_job(cluster: LocalCluster, daemon: LocalDaemon, outdir: Path, nodes: str,
              blocker_nodes: int, command: list[str] | None = None,
              checkpoint_dir: Path | None = None) -> tuple[str, int]:
    """A prod job holding ``blocker_nodes`` nodes, then an elastic training job on the rest;
    returns (job, epoch) once it trains on every node left."""
    blocker = prod(cluster, blocker_nodes, 3000)
    wait_running(cluster, blocker)
    script = daemon.training_script(command or TRAIN, checkpoint_dir or outdir)
    job = cluster.sbatch("--qos=malletrain", "-N", nodes, "--open-mode=append",
                         "-o", f"{outdir}/task-%A_%a.out", script=script)
    want = len(cluster.node_names) - blocker_nodes
    _, epoch = wait_consistent(cluster, job, outdir, timeout_s=180, at_least=want)
    return job, epoch


def job_nodes(cluster: LocalCluster, job: str) -> set[str]:
    out = cluster.run(["squeue", "-h", "-r", "-j", job, "-t", "R", "-o", "%N"]).stdout
    return set(out.split())


def prod_start_s(cluster: LocalCluster) -> tuple[float, str]:
    """A one-node prod job: (seconds from ``sbatch`` to its start, its node); the start is
    asserted within :data:`PROD_START_S`. On a full cluster it preempts an elastic task."""
    t0 = time.monotonic()
    job = prod(cluster, 1, 1)
    node: list[str] = []

    def started() -> bool:
        out = cluster.run(["squeue", "-h", "-j", job, "-t", "R,CG", "-o", "%N"],
                          check=False).stdout.strip()
        if out:
            node.append(out)
        return bool(out) or gone(cluster, job)

    cluster.wait_for(f"prod job {job} started", started, 60, interval_s=0.05)
    took = time.monotonic() - t0
    assert took <= PROD_START_S, f"prod job {job} took {took:.1f} s to start"
    cluster.wait_for(f"prod job {job} ended", lambda: gone(cluster, job), 60)
    return took, node[0] if node else ""


def settle(cluster: LocalCluster, daemon: LocalDaemon, outdir: Path, job: str,
           at_least: int, invariants: bool = True) -> tuple[float, int]:
    """The end of every scenario: views equal, a prod job on time, the job training again;
    returns (prod start seconds, epoch). When the prod job took one of the job's nodes, the
    epoch returned is one started after that preemption."""
    wait_agree(cluster, daemon)
    before = read_job(outdir, job).latest()
    held = job_nodes(cluster, job)
    took, node = prod_start_s(cluster)
    after = before[0] if before is not None and node in held else -1
    _, epoch = wait_consistent(cluster, job, outdir, timeout_s=150, at_least=at_least,
                               after_epoch=after)
    wait_agree(cluster, daemon)
    if invariants:
        assert_invariants(read_job(outdir, job))
    return took, epoch


def lost_since(outdir: Path, job: str, epoch: int) -> int:
    """Samples lost by a fault during ``epoch``: none if training is still in that epoch."""
    log = read_job(outdir, job)
    latest = log.latest()
    if latest is not None and latest[0] == epoch:
        return 0
    return samples_lost(log, epoch)


def wait_steps(outdir: Path, job: str, past: int, timeout_s: float = 60.0) -> None:
    wait_until(f"job {job} stepping past {past}",
               lambda: read_job(outdir, job).max_step() > past, timeout_s, 0.5)


def error_lines(daemon: LocalDaemon, offset: int = 0) -> list[str]:
    return [line for line in daemon.log_text()[offset:].splitlines() if " ERROR " in line]


# ---------------------------------------------------------------------------- control plane
def test_control_plane_faults_under_training(
        cluster: LocalCluster, daemons: Callable[..., LocalDaemon], outdir: Path) -> None:
    """munged restarted, munged down 15 s, slurmctld hung 15 s, the daemon's host rebooted:
    one after the other under one training job, each recovered before the next."""
    daemon = daemons({**NO_PROFILING, "slurm": {"command_timeout_s": 5.0}})
    job, epoch = start_job(cluster, daemon, outdir, "2-3", 5)

    def survived(scenario: str, epoch: int, fault: Callable[[], str]) -> int:
        at = read_job(outdir, job).max_step()
        note = fault()
        assert daemon.running(), f"{scenario}: the daemon exited"
        wait_steps(outdir, job, at)
        lost = lost_since(outdir, job, epoch)
        took, epoch = settle(cluster, daemon, outdir, job, 3)
        record(scenario, "recovered, same epoch" if lost == 0 else "recovered from checkpoint",
               lost, f"{note}; prod job started {took:.1f} s after sbatch".lstrip("; "))
        return epoch

    def munged_restart() -> str:
        stop_munged(cluster)
        start_munged(cluster)
        return ""

    def munged_down() -> str:
        offset = len(daemon.log_text())
        stop_munged(cluster)
        try:
            time.sleep(15)
        finally:
            start_munged(cluster)
        failed = daemon.log_text()[offset:].count("poll failed")
        return f"{failed} polls failed while munged was down"

    def slurmctld_hung() -> str:
        pid = controller_pid(cluster)
        assert pid is not None
        offset = len(daemon.log_text())
        pause(pid)
        worst = 0.0
        try:
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                t0 = time.monotonic()
                daemon.query("status")
                worst = max(worst, time.monotonic() - t0)
                time.sleep(0.5)
        finally:
            resume(pid)
        assert worst < 8.0, f"the API took {worst:.1f} s while slurmctld hung"
        timeouts = len(re.findall(r"no answer within", daemon.log_text()[offset:]))
        return f"API answered within {worst:.1f} s; {timeouts} commands timed out"

    def host_rebooted() -> str:
        daemon.kill()
        for sock in (daemon.api_socket, cluster.hook_socket):
            Path(sock).unlink(missing_ok=True)  # /run is empty after a reboot
        time.sleep(10)
        took = daemon.start()
        return f"daemon down 10 s, API back {took:.1f} s after its start"

    epoch = survived("munged restarted under training", epoch, munged_restart)
    epoch = survived("munged down 15 s under training", epoch, munged_down)
    epoch = survived("slurmctld hung (SIGSTOP) 15 s under training", epoch, slurmctld_hung)
    survived("the daemon's host rebooted (SIGKILL, sockets gone, state kept, 10 s down)",
             epoch, host_rebooted)
    # The control plane healed: every job ends when cancelled (after munged was down, jobs
    # were once seen completing for tens of seconds; the next test must not meet them).
    cluster.run(["scancel", job, *cluster.run(["squeue", "-h", "-o", "%F"]).stdout.split()])
    cluster.wait_for("every job gone after the control-plane faults", lambda: not cluster.run(
        ["squeue", "-h", "-o", "%i"], check=False).stdout.strip(), 120, interval_s=0.5)


# ---------------------------------------------------------------------------- a hung slurmd
@long_scenario
def test_slurmd_hung_while_its_task_runs(
        cluster: LocalCluster, daemons: Callable[..., LocalDaemon], outdir: Path) -> None:
    """SIGSTOP the slurmd of a node where a rank trains, for longer than SlurmdTimeout (30 s
    here): slurmctld marks the node not responding and requeues the task; the job goes on
    without it and grows back once slurmd answers again."""
    daemon = daemons(NO_PROFILING)
    job, before = start_job(cluster, daemon, outdir, "1-3", 5)
    victim = sorted(job_nodes(cluster, job))[-1]
    pid = slurmd_pid(cluster, victim)
    assert pid is not None
    pause(pid)
    try:
        cluster.wait_for(f"node {victim} not responding", lambda: "*" in cluster.run(
            ["sinfo", "-h", "-n", victim, "-o", "%T"]).stdout or "down" in cluster.run(
            ["sinfo", "-h", "-n", victim, "-o", "%T"]).stdout, 90, interval_s=1.0)
        state = cluster.run(["sinfo", "-h", "-n", victim, "-o", "%T"]).stdout.strip()
        k, after = wait_consistent(cluster, job, outdir, timeout_s=120, after_epoch=before)
    finally:
        resume(pid)
    lost = samples_lost(read_job(outdir, job), before)
    cluster.run(["scontrol", "update", f"NodeName={victim}", "State=RESUME"], check=False)
    took, _ = settle(cluster, daemon, outdir, job, 3)
    record("slurmd hung (SIGSTOP) 40+ s while its task trains (SlurmdTimeout 30 s)",
           f"node {state}, job went on on {k} nodes, grew back to 3", lost,
           f"prod job started {took:.1f} s after sbatch")


# ---------------------------------------------------------------------------- a clock jump
@pytest.mark.skipif(not FAKETIME.exists(), reason="libfaketime is not installed "
                    "(scripts/setup-machine.sh installs Debian's faketime)")
def test_a_nodes_clock_jumps_ahead(
        cluster: LocalCluster, daemons: Callable[..., LocalDaemon], outdir: Path) -> None:
    """The training processes' clock (libfaketime: wall and monotonic, as when a VM resumes)
    jumps 10 minutes ahead mid-run: their reports must not move the daemon's time, so the
    harvest it counts stays within what the nodes could have held."""
    offset = outdir / "clock-offset"
    offset.write_text("+0\n")
    offset.chmod(0o666)
    faked = ["env", f"LD_PRELOAD={FAKETIME}", f"FAKETIME_TIMESTAMP_FILE={offset}",
             "FAKETIME_CACHE_DURATION=1", *TRAIN]
    daemon = daemons(NO_PROFILING)
    job, epoch = start_job(cluster, daemon, outdir, "2-3", 5, command=faked)

    def held() -> tuple[float, float]:
        return (float(daemon.query("status")["engine"]["held_node_s"]), time.monotonic())

    h0, t0 = held()
    at = read_job(outdir, job).max_step()
    offset.write_text("+600\n")
    time.sleep(12)
    h1, t1 = held()
    wait_steps(outdir, job, at)
    bound = len(cluster.node_names) * (t1 - t0 + 5)
    assert h1 - h0 <= bound, (f"the daemon counted {h1 - h0:.0f} node-seconds held in "
                              f"{t1 - t0:.0f} s: a worker's clock moved its time")
    lost = lost_since(outdir, job, epoch)
    took, _ = settle(cluster, daemon, outdir, job, 3)
    record("a node's clock jumps 10 min ahead (libfaketime on the training processes)",
           "same epoch, daemon's time unmoved" if lost == 0 else "recovered from checkpoint",
           lost, f"harvest counted {h1 - h0:.0f} node-s in {t1 - t0:.0f} s (3 nodes held); "
                 f"prod job started {took:.1f} s after sbatch")


# ---------------------------------------------------------------------------- checkpoints
def _checkpoint_step(folder: Path) -> int | None:
    import torch

    path = folder / "checkpoint.pt"
    if not path.exists():
        return None
    return int(torch.load(path, map_location="cpu", weights_only=False)["step"])


def _failed_saves(outdir: Path, job: str) -> int:
    return sum(path.read_text(errors="replace").count("failed (")
               for path in outdir.glob(f"task-{job}_*.out"))


@pytest.fixture
def small_mount(tmp_path: Path) -> Iterator[Path]:
    mnt = tmp_path / "ckpt-mnt"
    mnt.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m,mode=1777", "tmpfs", str(mnt)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {done.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


@long_scenario
def test_checkpoint_folder_full_then_read_only(
        cluster: LocalCluster, daemons: Callable[..., LocalDaemon], outdir: Path,
        small_mount: Path) -> None:
    """The shared checkpoint folder fills up, later turns read-only: training goes on, the
    last complete checkpoint stays, and a preemption during the fault resumes from it."""
    daemon = daemons(NO_PROFILING)
    job, epoch = start_job(cluster, daemon, outdir, "1-3", 5, checkpoint_dir=small_mount)
    folder = small_mount / f"ckpt-{job}"

    def fault(scenario: str, epoch: int, break_it: Callable[[], None],
              mend: Callable[[], None]) -> int:
        cluster.wait_for("a checkpoint", lambda: _checkpoint_step(folder) is not None, 60)
        failed = _failed_saves(outdir, job)
        break_it()
        try:
            cluster.wait_for("a failed checkpoint", lambda: _failed_saves(outdir, job) > failed,
                             30, interval_s=0.5)
            good = _checkpoint_step(folder)
            assert good is not None
            at = read_job(outdir, job).max_step()
            wait_steps(outdir, job, at)  # training goes on
            taker = cluster.sbatch("-p", "prod", "-w", sorted(job_nodes(cluster, job))[-1],
                                   "-N", "1",
                                   "-o", "/dev/null", "--wrap", "sleep 20")
            wait_running(cluster, taker)
            _, after = wait_consistent(cluster, job, outdir, timeout_s=120, after_epoch=epoch)
            log = read_job(outdir, job)
            resumed = min(s for s, _, _ in log.starts[after])
            assert resumed == good, f"resumed from step {resumed}, the last complete is {good}"
            lost = samples_lost(log, epoch)
        finally:
            mend()
        cluster.wait_for("a checkpoint after the fault", lambda: (_checkpoint_step(folder) or 0)
                         > good, 60, interval_s=0.5)
        cluster.wait_for(f"prod job {taker} ended", lambda: gone(cluster, taker), 60)
        took, epoch = settle(cluster, daemon, outdir, job, 3)
        record(scenario, f"training went on; a preemption resumed from the last complete "
               f"checkpoint (step {good})", lost, f"prod job started {took:.1f} s after sbatch")
        return epoch

    filler = small_mount / "filler"

    def fill() -> None:
        with open(filler, "wb") as fh:
            try:
                while True:
                    fh.write(b"\0" * 65536)
                    fh.flush()
            except OSError:
                pass

    epoch = fault("checkpoint folder full, then a node preempted", epoch, fill,
                  lambda: filler.unlink(missing_ok=True))
    fault("checkpoint folder read-only, then a node preempted", epoch,
          lambda: subprocess.run(["mount", "-o", "remount,ro", str(small_mount)], check=True),
          lambda: subprocess.run(["mount", "-o", "remount,rw", str(small_mount)], check=True))


# ---------------------------------------------------------------------------- state database
def test_corrupt_and_truncated_state_database(
        cluster: LocalCluster, daemons: Callable[..., LocalDaemon], outdir: Path) -> None:
    """The daemon stopped, its state database damaged, the daemon started: it moves the file
    aside with one line, starts empty and takes the running job back from Slurm."""
    daemon = daemons(NO_PROFILING)
    job, _ = start_job(cluster, daemon, outdir, "2-3", 5)
    db = Path(daemon.sections["daemon"]["state_dir"]) / "state.db"

    def moved_aside() -> set[Path]:
        return {p for p in db.parent.glob("state.db.corrupt-*")
                if not p.name.endswith(("-wal", "-shm"))}

    def garbage() -> None:
        with open(db, "r+b") as fh:
            fh.seek(0)
            fh.write(os.urandom(4096))

    def truncate() -> None:
        with open(db, "r+b") as fh:
            fh.truncate(max(1, os.path.getsize(db) // 2))

    for life, (scenario, damage) in enumerate((
            ("state database corrupt (first 4 KiB overwritten)", garbage),
            ("state database truncated to half its size", truncate)), start=1):
        daemon.stop()
        if db.with_name("state.db-wal").exists():  # SIGTERM checkpoints the log; be sure
            with sqlite3.connect(db) as conn:
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        kept = moved_aside()
        damage()
        # A daemon without state numbers the job's epochs from the start again: the old
        # life's step lines go to a folder of their own (its tasks keep writing there until
        # they are shrunk), the new tasks write new files.
        old = outdir / f"life-{life}"
        old.mkdir()
        for path in outdir.glob(f"task-{job}_*.out"):
            path.rename(old / path.name)
        offset = len(daemon.log_text())
        daemon.start()
        errors = error_lines(daemon, offset)
        assert len(errors) == 1 and "corrupt" in errors[0], errors
        assert len(moved_aside() - kept) == 1
        wait_consistent(cluster, job, outdir, timeout_s=150, at_least=3)
        after = read_job(outdir, job)
        first = min(after.starts)  # the new life's first epoch
        before = read_job(old, job)
        reached, world = max((step, w) for rows in before.steps.values()
                             for step, w, _, _ in rows)
        resumed = min(step for step, _, _ in after.starts[first])
        saved = max((step for _, step in before.checkpoints), default=0)
        # A save that completed as its task was being shrunk may miss its log line.
        assert saved <= resumed <= reached, \
            f"resumed at step {resumed}: last checkpoint logged {saved}, progress {reached}"
        if life == 1:  # later lives' files begin with a resume from the life before
            assert_invariants(before)
        lost = max(0, reached - resumed) * BATCH * world
        # The new life's first epoch resumed from the old life's checkpoint, which its own
        # files do not show: its invariants are the ones just checked.
        took, _ = settle(cluster, daemon, outdir, job, 3, invariants=False)
        record(scenario, "moved aside with one line, daemon started empty, shrank the job's "
               "workers, which resumed from their checkpoint", lost,
               f"prod job started {took:.1f} s after sbatch")


# ---------------------------------------------------------------------------- mid-change kills
PROBING: dict[str, dict[str, Any]] = {"profiler": {
    "enabled": True, "window_s": 5.0, "default_scale_up_s": 60.0, "default_scale_down_s": 5.0}}
"""A profiled job measures downwards (scale-downs assumed cheaper): it starts on every idle
node, then the Job Profiling Advisor shrinks it: a planned shrink, with its checkpoint."""


@pytest.mark.parametrize("moment", ["checkpoint", "shrink"])
def test_daemon_sigkilled_in_the_middle_of_a_planned_shrink(
        cluster: LocalCluster, daemons: Callable[..., LocalDaemon], outdir: Path,
        moment: str) -> None:
    """``checkpoint``: killed right after deciding the shrink, while rank 0 checkpoints for
    it; ``shrink``: killed right after Slurm requeue-held the task."""
    daemon = daemons(PROBING)
    blocker = prod(cluster, 5, 3000)
    wait_running(cluster, blocker)
    script = training_script(daemon, outdir)
    job = cluster.sbatch("--qos=malletrain", "-N", "1-3", "--open-mode=append",
                         "-o", f"{outdir}/task-%A_%a.out", script=script)
    decided = re.compile(rf"job[= ]{job}:? shrink ")
    cluster.wait_for("the profiler's planned shrink", lambda: bool(
        decided.search(daemon.log_text())), 180, interval_s=0.02)
    if moment == "shrink":
        cluster.wait_for("Slurm carrying out the shrink", lambda: running(cluster, job) < 3,
                         60, interval_s=0.02)
    latest = read_job(outdir, job).latest()
    assert latest is not None
    daemon.kill()
    time.sleep(3)
    daemon.start()
    k, _ = wait_consistent(cluster, job, outdir, timeout_s=150, after_epoch=latest[0])
    wait_agree(cluster, daemon)
    log = read_job(outdir, job)
    assert_invariants(log)
    lost = samples_lost(log, latest[0])
    took, _ = prod_start_s(cluster)
    wait_agree(cluster, daemon)
    what = ("while rank 0 checkpointed for a planned shrink" if moment == "checkpoint" else
            "right after Slurm carried out a planned shrink")
    record(f"malletraind SIGKILLed {what}, restarted 3 s later",
           f"recovered, trains on {k} nodes", lost, f"prod job started {took:.1f} s after sbatch",
           history(daemon, job))
