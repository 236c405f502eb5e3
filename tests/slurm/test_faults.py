"""Faults under a real malletraind on the real local Slurm cluster.

One test per fault: the daemon SIGKILLed right after a rescale, a node failure, every node of
a job preempted at once, a storm of preemptions and idle events (on a 32-node cluster of its
own), slurmctld restarted under the daemon, a hung ``scontrol``; and the two faults that may
stop the daemon (a locked state database, a full disk), which must do so with one clear line
and an intact database. The
assertions read Slurm (squeue, sinfo, scontrol) and the workers' own output, never only the
daemon's view; "the daemon's state matches Slurm's" compares its ``jobs``/``nodes`` API with
squeue/sinfo. Each scenario records the training progress it lost (samples beyond the last
checkpoint); with ``MALLETRAIN_FAULTS_RESULTS`` set the table goes to that JSON file, which
``bench/faults.py`` turns into the faults section of BENCHMARKS.md.
"""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from statistics import median
from typing import Any

import pytest
from faults_common import (
    INPLACE,
    NO_PROFILING,
    assert_invariants,
    daemons_fixture,
    gone,
    history,
    outdir_fixture,
    path_fixture,
    prod,
    record,
    samples_lost,
    samples_lost_since,
    submit,
    wait_running,
    write_results,
)
from slurm_helpers import (
    after_test,
    cluster_root,
    controller_log_size,
    controller_records,
    count_storm,
    drive_storm,
    elastic,
    elastic_nodes,
    preemptions,
    running,
    start_cluster,
    wait_agree,
    wait_consistent,
)
from training_logs import read_job

from devtools.localcluster import LocalCluster
from devtools.localcluster.daemon import LocalDaemon
from devtools.localcluster.faults import (
    fail_node,
    restore_node,
    start_controller,
    stop_controller,
)
from malletrain_core.errors import MalleTrainError

pytestmark = [pytest.mark.faults]

@pytest.fixture(scope="module", autouse=True)
def results() -> Iterator[None]:
    yield
    write_results()


daemons = pytest.fixture(daemons_fixture, name="daemons")
outdir = pytest.fixture(outdir_fixture, name="outdir")
on_path = pytest.fixture(path_fixture, name="on_path", autouse=True)


# ---------------------------------------------------------------------------- scenarios
@pytest.mark.torch
def test_daemon_sigkilled_right_after_a_rescale(
        cluster: LocalCluster, daemons: Callable[..., LocalDaemon], outdir: Path) -> None:
    daemon = daemons(NO_PROFILING)
    blocker = prod(cluster, 6, 3000)
    wait_running(cluster, blocker)
    job = submit(cluster, daemon, "1-3", outdir)
    wait_consistent(cluster, job, outdir, timeout_s=150, at_least=2)
    offset = len(daemon.log_text())
    cluster.run(["scancel", blocker])  # idle nodes: the daemon grows the job
    rescale = re.compile(rf"job[= ]{job}:? (grow|shrink) ")
    cluster.wait_for("the daemon's rescale", lambda: bool(
        rescale.search(daemon.log_text()[offset:])), 30, interval_s=0.02)
    epoch_at_kill = read_job(outdir, job).latest()
    daemon.kill()
    assert epoch_at_kill is not None
    time.sleep(3)
    daemon.start()
    k, epoch = wait_consistent(cluster, job, outdir, timeout_s=150, at_least=3)
    wait_agree(cluster, daemon)
    log = read_job(outdir, job)
    assert_invariants(log)
    lost = samples_lost(log, epoch_at_kill[0])
    after = daemon.log_text()[offset:]
    how = ("the grow had not reached Slurm: dropped and planned again" if
           "no worker on" in after else "the grow had reached Slurm")
    record("malletraind SIGKILLed within 0.1 s of issuing a grow, restarted 3 s later",
           f"recovered, trains on {k} nodes", lost, how, history(daemon, job))


@pytest.mark.torch
def test_node_failure_mid_training(
        cluster: LocalCluster, daemons: Callable[..., LocalDaemon], outdir: Path) -> None:
    daemon = daemons(NO_PROFILING)
    blocker = prod(cluster, 5, 3000)
    wait_running(cluster, blocker)
    job = submit(cluster, daemon, "1-3", outdir)
    _, before = wait_consistent(cluster, job, outdir, timeout_s=150, at_least=3)
    out = cluster.run(["squeue", "-h", "-r", "-j", job, "-t", "R", "-o", "%N"]).stdout
    victim = sorted(out.split())[-1]
    try:
        killed = fail_node(cluster, victim)
        assert killed, f"no process of node {victim} found"
        k, after = wait_consistent(cluster, job, outdir, timeout_s=120, after_epoch=before)
        assert k == 2, f"job {job} trains on {k} nodes, 2 survived"
        state = cluster.run(["sinfo", "-h", "-n", victim, "-o", "%T"]).stdout.strip()
        assert state.startswith("down"), f"node {victim} is {state}"
        wait_agree(cluster, daemon)
        log = read_job(outdir, job)
        assert_invariants(log)
        lost = samples_lost(log, before)
        progress = log.max_step()
    finally:
        restore_node(cluster, victim)
    wait_consistent(cluster, job, outdir, timeout_s=120, at_least=3, after_epoch=after)
    assert read_job(outdir, job).max_step() > progress
    assert_invariants(read_job(outdir, job))
    record("node failure (slurmd, stepd and workers killed, node DOWN)",
           "recovered on 2 nodes, grew back after RESUME", lost, "", history(daemon, job))


@pytest.mark.torch
def test_every_node_of_a_job_preempted_at_once(
        cluster: LocalCluster, daemons: Callable[..., LocalDaemon], outdir: Path) -> None:
    daemon = daemons(NO_PROFILING)
    blocker = prod(cluster, 6, 3000)
    wait_running(cluster, blocker)
    job = submit(cluster, daemon, "1-2", outdir)
    _, before = wait_consistent(cluster, job, outdir, timeout_s=150, at_least=2)
    taker = prod(cluster, 2, 15)
    wait_running(cluster, taker)
    assert running(cluster, job) == 0, "workers left on the prod job's nodes"
    wait_agree(cluster, daemon)
    cluster.wait_for(f"prod job {taker} ended", lambda: gone(cluster, taker), 60)
    wait_consistent(cluster, job, outdir, timeout_s=150, at_least=2, after_epoch=before)
    wait_agree(cluster, daemon)
    log = read_job(outdir, job)
    assert_invariants(log)
    record("every node of a job preempted at once", "0 nodes, resumed from checkpoint",
           samples_lost(log, before), "", history(daemon, job))


# ---------------------------------------------------------------------------- the storm
STORM_NODES = 32
"""Four times the session's cluster: each round of prod jobs preempts 32 tasks at once."""
STORM_ROUNDS = 2
"""Prod jobs per node: each preempts the elastic task there, then leaves the node idle."""
STORM_PROD_S = 0.5
STORM_WINDOW_S = 15.0
"""The storm's events must all fall within this span (from the first preemption to the
last prod job's end, as slurmctld logged them)."""
# Stand-in workers never report: the size probe of a job without a curve ends on its step
# timeout (3 windows + 2 rescales), so short ones let the jobs reach the allocator quickly.
STORM_DAEMON: dict[str, dict[str, Any]] = {"profiler": {
    "enabled": False, "window_s": 1.0, "default_scale_up_s": 1.0, "default_scale_down_s": 1.0}}


@pytest.fixture
def storm_cluster(request: pytest.FixtureRequest) -> Iterator[LocalCluster]:
    """A cluster of its own, larger than the session's, so that one round of prod jobs
    preempts ``STORM_NODES`` elastic tasks at once."""
    with cluster_root("storm") as root:
        cluster = start_cluster(root, nodes=STORM_NODES)
        try:
            yield cluster
        finally:
            after_test(request, cluster)
            cluster.stop()


@pytest.fixture
def storm_daemon(request: pytest.FixtureRequest, storm_cluster: LocalCluster,
                 tmp_path: Path) -> Iterator[LocalDaemon]:
    """A malletraind for the storm's cluster; its view and log are printed on failure."""
    daemon = LocalDaemon(storm_cluster, root=tmp_path / "malletraind-storm",
                         settings=STORM_DAEMON)
    daemon.start()
    yield daemon
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed and daemon.running():
        print(f"\n==== malletraind's view ====\n{daemon.snapshot()}")
    daemon.stop()
    if rep is not None and rep.failed:
        print(f"\n==== malletraind log ====\n{daemon.log_tail(60)}")


CTLD_SAMPLE = """\
[2026-11-21T13:07:22.833] sched/backfill: _start_job: Started JobId=1_0(3) in preemptable on n01
[2026-11-21T13:07:23.840] preempted JobId=1_0(3) has been requeued to reclaim resources for JobId=9
[2026-11-21T13:07:23.841] preempted JobId=2_3(2) has been requeued to reclaim resources for JobId=7
[2026-11-21T13:07:24.846] sched/backfill: _start_job: Started JobId=9 in prod on n01
[2026-11-21T13:07:25.901] _job_complete: JobId=9 WEXITSTATUS 0
[2026-11-21T13:07:25.901] _job_complete: JobId=9 done
[2026-11-21T13:07:26.136] sched: _update_job: setting req_nodes to n01 for JobId=1_0(3)
[2026-11-21T13:07:26.901] sched: Allocate JobId=1_0(3) NodeList=n01 #CPUs=2 Partition=preemptable
[2026-11-21T13:07:27.000] _job_complete: JobId=10 done
"""


def test_storm_counting_reads_the_controller_log(tmp_path: Path) -> None:
    cluster = LocalCluster(nodes=2, root=tmp_path)  # never started: only its log is read
    log = cluster.run_dir / "log" / "slurmctld.log"
    log.parent.mkdir(parents=True)
    log.write_text(CTLD_SAMPLE)
    records = controller_records(cluster)
    assert [(r.kind, r.job, r.other) for r in records] == [
        ("started", "1_0", "n01"), ("preempted", "1_0", "9"), ("preempted", "2_3", "7"),
        ("started", "9", "n01"), ("completed", "9", ""), ("started", "1_0", "n01"),
        ("completed", "10", "")]
    # Job 9 preempted a task and its node got a task back; job 10 ended on n02 with nothing
    # after it; job 7's preemption is not the storm's.
    count = count_storm(records, {"9": "n01", "10": "n02"})
    assert (len(count.preempted), len(count.idle), count.ended_unseen) == (1, 1, 1)
    assert count.regrow_s == [pytest.approx(1.0)]
    assert count.window_s == pytest.approx(27.0 - 23.840)
    assert controller_records(cluster, since=len(CTLD_SAMPLE)) == []


def test_26_05_backfill_starts_are_read_too(tmp_path: Path) -> None:
    """26.05 logs a backfill start only as a HetJob debug flag's line (its local cluster sets
    the flag, devtools/localcluster/releases.py)."""
    cluster = LocalCluster(nodes=2, root=tmp_path)
    log = cluster.run_dir / "log" / "slurmctld.log"
    log.parent.mkdir(parents=True)
    log.write_text("[2026-11-27T20:07:44.010] sched/backfill: _start_job: HETJOB: Started "
                   "JobId=1_0(2) in preemptable on n01\n")
    assert [(r.kind, r.job, r.other) for r in controller_records(cluster)] == [
        ("started", "1_0", "n01")]


def test_storm_of_preemptions_and_idle_events(
        storm_cluster: LocalCluster, storm_daemon: LocalDaemon) -> None:
    cluster, daemon = storm_cluster, storm_daemon
    n = STORM_NODES
    jobs = [elastic(cluster, f"1-{n // 2}"), elastic(cluster, f"1-{n - n // 2}")]
    cluster.wait_for("the elastic jobs on every node", lambda: len(elastic_nodes(cluster)) == n,
                     60)
    cluster.wait_for("the size probes over", lambda: {
        j["state"] for j in daemon.query("jobs")["jobs"]} == {"running"}, 60, interval_s=0.5)
    cluster.wait_for("the elastic jobs on every node after the probes",
                     lambda: len(elastic_nodes(cluster)) == n, 60)
    before = daemon.query("status")
    since = controller_log_size(cluster)
    slurmd_before = preemptions(cluster)
    t0 = time.monotonic()
    prods = drive_storm(cluster, STORM_ROUNDS, STORM_PROD_S, timeout_s=60)
    submit_s = time.monotonic() - t0
    cluster.wait_for("every prod job done", lambda: not cluster.run(
        ["squeue", "-h", "-p", "prod", "-o", "%i"]).stdout.strip(), 60, interval_s=0.2)
    storm_s = time.monotonic() - t0
    storm_end = time.time()
    states = {p: cluster.show_jobs(p)[0].get("JobState") for p in prods}
    assert set(states.values()) == {"COMPLETED"}, states
    assert daemon.running(), daemon.log_tail(20)
    cluster.wait_for("the jobs back on every node", lambda: len(elastic_nodes(cluster)) == n, 60)
    wait_agree(cluster, daemon)
    held = {str(j["job"]): j["nodes"] for j in daemon.query("jobs")["jobs"]}
    assert set(held) == set(jobs) and sum(held.values()) == n, held

    count = count_storm(controller_records(cluster, since), prods)
    slurmd = preemptions(cluster) - slurmd_before
    assert len(count.preempted) == slurmd, (
        f"slurmctld logged {len(count.preempted)} preemptions, the slurmds {slurmd}")
    assert count.ended_unseen == 0, f"{count.ended_unseen} idle nodes the daemon never regrew"
    assert count.events >= 100, (f"only {len(count.preempted)} preemptions + "
                                 f"{len(count.idle)} idle events")
    assert count.window_s <= STORM_WINDOW_S, f"the storm took {count.window_s:.1f} s"

    after = daemon.query("status")
    d0, d1 = before["daemon"], after["daemon"]
    cycles, events = d1["cycles"] - d0["cycles"], d1["events"] - d0["events"]
    failures = d1["command_failures"] - d0["command_failures"]
    # Every regrown node comes back to the daemon as one WorkerStarted event.
    assert events >= len(count.idle), f"the daemon took in {events} events"
    assert cycles >= STORM_ROUNDS, f"the daemon ran {cycles} cycles"
    assert after["engine"]["preemptions"] > before["engine"]["preemptions"]
    # A failed command is retried by the next poll, so a poll that succeeded after the storm
    # (and the equal views above) show that the daemon recovered from any failure in it.
    assert d1["last_poll_time"] > storm_end, f"no poll since the storm ({failures} failures)"
    assert "Traceback" not in daemon.log_text()
    record(f"storm: {len(prods)} one-node prod jobs (sleep {STORM_PROD_S:g} s), each pinned to "
           f"a node the instant an elastic task ran there, {STORM_ROUNDS} per node, onto "
           f"{n} nodes harvested by 2 elastic jobs",
           "all prod jobs ran; jobs back on every node; views equal", None,
           f"counted from slurmctld's log: {len(count.preempted)} task preemptions + "
           f"{len(count.idle)} idle events (a prod job ended, then an elastic task the daemon "
           f"released started on its node) = {count.events} events within "
           f"{count.window_s:.1f} s (first preemption to last prod end; submitting took "
           f"{submit_s:.1f} s, all prod jobs gone at {storm_s:.1f} s); idle node to elastic "
           f"task running again: median {median(count.regrow_s):.2f} s, max "
           f"{max(count.regrow_s):.2f} s; daemon: {cycles} cycles, {events} events, "
           f"{failures} command failures" + (" (recovered)" if failures else ""))


TRAINING_STORM = 8
"""One-node prod jobs in the storm on a training job, one every :data:`TRAINING_STORM_GAP_S`."""
TRAINING_STORM_GAP_S = 1.5
TRAINING_STORM_PROD_S = 2
LONG = os.environ.get("MALLETRAIN_LONG_FAULTS", "") not in ("", "0")


@pytest.mark.torch
@pytest.mark.skipif(not LONG and not INPLACE, reason="restart path: `bench/faults.py` and "
                    "MALLETRAIN_LONG_FAULTS=1 run it (every change restarts torch: minutes)")
def test_preemption_storm_under_training(
        cluster: LocalCluster, daemons: Callable[..., LocalDaemon], outdir: Path) -> None:
    """A training job on 4 nodes; a one-node prod job every 1.5 s, each pinned to a node the
    job trains on then, each leaving it after 2 s: the job shrinks and grows back again and
    again, changes landing in the middle of others. It must end training on 4 nodes with the
    invariants kept, every prod job run, and the views equal; the samples lost are summed
    over every change."""
    daemon = daemons(NO_PROFILING)
    blocker = prod(cluster, 4, 3000)
    wait_running(cluster, blocker)
    job = submit(cluster, daemon, "1-4", outdir)
    _, before = wait_consistent(cluster, job, outdir, timeout_s=180, at_least=4)
    prods = []
    t0 = time.monotonic()
    for i in range(TRAINING_STORM):
        nodes = sorted(cluster.run(["squeue", "-h", "-r", "-j", job, "-t", "R", "-o", "%N"]
                                   ).stdout.split())
        if nodes:
            prods.append(cluster.sbatch("-p", "prod", "-N", "1", "-w", nodes[i % len(nodes)],
                                        "-o", "/dev/null", "--wrap",
                                        f"sleep {TRAINING_STORM_PROD_S}"))
        time.sleep(TRAINING_STORM_GAP_S)
    cluster.wait_for("every prod job done", lambda: all(gone(cluster, p) for p in prods), 90)
    storm_s = time.monotonic() - t0
    states = {p: cluster.show_jobs(p)[0].get("JobState") for p in prods}
    assert set(states.values()) == {"COMPLETED"}, states
    k, _ = wait_consistent(cluster, job, outdir, timeout_s=180, at_least=4, after_epoch=before)
    wait_agree(cluster, daemon)
    log = read_job(outdir, job)
    assert_invariants(log)
    lost, changes = samples_lost_since(log, before)
    paths = history(daemon, job)
    kinds = [p for e, (_, p, _) in paths.items() if e > before]
    record(f"preemption storm under training: {len(prods)} one-node prod jobs (sleep "
           f"{TRAINING_STORM_PROD_S} s), one every {TRAINING_STORM_GAP_S:g} s, each on a node "
           "the 4-node job trained on", f"back on {k} nodes, all prod jobs ran", lost,
           f"the daemon started {len(kinds)} epochs in {storm_s:.0f} s "
           f"({kinds.count('inplace')} in place, {kinds.count('disk')} from disk), the workers "
           f"stepped in {changes} of them", paths)


@pytest.mark.torch
def test_slurmctld_restarted_under_the_daemon(
        cluster: LocalCluster, daemons: Callable[..., LocalDaemon], outdir: Path) -> None:
    daemon = daemons(NO_PROFILING)
    job = submit(cluster, daemon, "2-2", outdir)
    _, epoch = wait_consistent(cluster, job, outdir, timeout_s=150, at_least=2)
    offset = len(daemon.log_text())
    stop_controller(cluster)
    try:
        at_stop = read_job(outdir, job).max_step()
        time.sleep(5)
        assert daemon.running()
        failures = daemon.query("status")["daemon"]["command_failures"]
        assert failures >= 1, "the daemon saw no command failure with slurmctld down"
    finally:
        start_controller(cluster)
    assert "poll failed" in daemon.log_text()[offset:]
    p = prod(cluster, 1, 1)
    cluster.wait_for("the prod job after the restart", lambda: gone(cluster, p), 60)
    assert cluster.show_jobs(p)[0].get("JobState") == "COMPLETED"
    wait_agree(cluster, daemon)
    time.sleep(3)
    log = read_job(outdir, job)
    assert log.max_step() > at_stop, "training stopped"
    latest = log.latest()
    assert latest is not None and latest[0] == epoch, "the restart disturbed the epoch"
    assert_invariants(log)
    record("slurmctld stopped 5 s and restarted under the daemon", "recovered, same epoch", 0)


def test_hung_scontrol_times_out_and_recovers(
        cluster: LocalCluster, daemons: Callable[..., LocalDaemon], tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    flag = tmp_path / "hang"
    flag.touch()
    real = subprocess.run(["sh", "-c", "command -v scontrol"], capture_output=True, text=True,
                          check=True).stdout.strip()
    wrapper = bin_dir / "scontrol"
    wrapper.write_text(f"#!/bin/sh\n[ -e '{flag}' ] && sleep 30\nexec '{real}' \"$@\"\n")
    wrapper.chmod(0o755)
    daemon = daemons({**NO_PROFILING, "slurm": {"bin_dir": str(bin_dir),
                                                        "command_timeout_s": 2.0}})
    job = elastic(cluster, "1-2")
    cluster.wait_for("the daemon's scontrol timeout", lambda: re.search(
        r"command scontrol .* failed: no answer within 2 s", daemon.log_text()) is not None, 40)
    worst = 0.0
    for _ in range(5):
        t0 = time.monotonic()
        daemon.query("status")
        worst = max(worst, time.monotonic() - t0)
        time.sleep(0.5)
    assert worst < 8.0, f"the API took {worst:.1f} s while scontrol hung"
    assert running(cluster, job) == 0, "a task started without the daemon's release"
    p = prod(cluster, 1, 1)
    cluster.wait_for("prod scheduling during the hang", lambda: gone(cluster, p), 30)
    assert daemon.running()
    flag.unlink()
    # A grow that timed out can leave the job's size probe running on fewer nodes: it ends
    # after its step timeout (3 windows + 2 rescales, about 60 s here), then the job grows.
    cluster.wait_for("the job running once scontrol answers",
                     lambda: running(cluster, job) == 2, 150)
    wait_agree(cluster, daemon)
    record("hung scontrol (2 s command timeout)", f"API answered within {worst:.1f} s, "
           "recovered", None)


def _integrity(db: Path) -> str:
    with sqlite3.connect(db) as conn:
        return str(conn.execute("PRAGMA integrity_check").fetchone()[0])


def _error_lines(daemon: LocalDaemon) -> list[str]:
    return [line for line in daemon.log_text().splitlines() if "error" in line.lower()]


def test_locked_state_database_stops_the_second_daemon(
        cluster: LocalCluster, daemons: Callable[..., LocalDaemon]) -> None:
    first = daemons()
    state_dir = first.sections["daemon"]["state_dir"]
    second = daemons({"daemon": {"state_dir": state_dir}}, start=False)
    t0 = time.monotonic()
    with pytest.raises(MalleTrainError):
        second.start()
    took = time.monotonic() - t0
    assert took < 10, f"the second daemon took {took:.1f} s to give up"
    lines = _error_lines(second)
    assert len(lines) == 1 and "locked by another process" in lines[0], second.log_text()
    assert "Traceback" not in second.log_text()
    assert first.running() and first.query("status")["daemon"]["cycles"] >= 1
    first.stop()
    assert _integrity(Path(state_dir) / "state.db") == "ok"
    record("state database locked (second malletraind on the same state_dir)",
           "second exits at once with one line, first runs on, DB ok", None)


def test_full_disk_stops_the_daemon_cleanly(
        cluster: LocalCluster, daemons: Callable[..., LocalDaemon], tmp_path: Path) -> None:
    mnt = tmp_path / "small"
    mnt.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)],
                             capture_output=True, text=True, check=False)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {mounted.stderr.strip()}")
    try:
        daemon = daemons({"daemon": {"state_dir": str(mnt / "state")}})
        elastic(cluster, "1-2")  # events to journal
        cluster.wait_for("cycles journalled", lambda: daemon.query("status")["daemon"][
            "cycles"] >= 3, 30)
        with open(mnt / "filler", "wb") as filler:
            try:
                while True:
                    filler.write(b"\0" * 65536)
                    filler.flush()
            except OSError:
                pass
        cluster.wait_for("the daemon stopped on the full disk",
                         lambda: not daemon.running(), 60)
        lines = _error_lines(daemon)
        assert len(lines) == 1 and "free disk space" in lines[0], daemon.log_tail(20)
        assert "Traceback" not in daemon.log_text()
        (mnt / "filler").unlink()  # the operator frees space; SQLite needs some to open
        assert _integrity(mnt / "state" / "state.db") == "ok"
        record("disk full under the state database", "daemon stops with one line, DB ok",
               None)
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)
