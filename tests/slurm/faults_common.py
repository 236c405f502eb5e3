"""What the fault scenarios share: training jobs under a real malletraind, their progress lost,
Slurm's view, and the results table that ``bench/faults.py`` turns into BENCHMARKS.md.

Every module of fault scenarios records one row per scenario that passed with
:func:`record`; with ``MALLETRAIN_FAULTS_RESULTS=FILE`` set, :func:`write_results` (called by
each module's autouse fixture) appends them to that JSON file.

``MALLETRAIN_FAULTS_PATH`` picks the path the training jobs take: ``restart`` (the default,
``make test``) or ``inplace`` (``malletrain-run --inplace``; ``bench/faults.py`` runs both).
In place only the scenarios of :data:`IN_PLACE` run (those where the path matters); every
other one is skipped with the reason :data:`NOT_IN_PLACE` gives, which is recorded too.
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from training_logs import JobLog, invariant_problems

from devtools.localcluster import LocalCluster
from devtools.localcluster.daemon import LocalDaemon
from devtools.runlogs.inplace_logs import daemon_epochs

BATCH = 16
TRAIN = [sys.executable, "examples/train_elastic.py", "--steps", "0", "--batch", str(BATCH),
         "--step-sleep-s", "0.1", "--checkpoint-every-s", "6", "--log-every", "1"]
NO_PROFILING: dict[str, dict[str, Any]] = {"profiler": {"enabled": False}}
RESULTS: list[dict[str, Any]] = []

PATHS = ("restart", "inplace")
PATH = os.environ.get("MALLETRAIN_FAULTS_PATH", "") or "restart"
if PATH not in PATHS:
    raise pytest.UsageError(f"MALLETRAIN_FAULTS_PATH={PATH!r}: set it to restart or inplace "
                            "(or leave it unset for restart)")
INPLACE = PATH == "inplace"
IN_PLACE = frozenset({
    "test_daemon_sigkilled_right_after_a_rescale", "test_node_failure_mid_training",
    "test_every_node_of_a_job_preempted_at_once",
    "test_daemon_sigkilled_in_the_middle_of_a_planned_shrink",
    "test_preemption_storm_under_training"})
"""The scenarios that also run in place: each changes an epoch under the fault."""
NOT_IN_PLACE = {
    "test_storm_of_preemptions_and_idle_events": "stand-in workers, no launcher: no path",
    "test_hung_scontrol_times_out_and_recovers": "stand-in workers, no launcher: no path",
    "test_locked_state_database_stops_the_second_daemon": "no job",
    "test_full_disk_stops_the_daemon_cleanly": "stand-in workers, no launcher: no path",
}
"""Why a scenario is not run in place; every other one not in :data:`IN_PLACE` keeps its
epoch through the fault (no change, so no path) or tests the checkpoint folder or the
restart path's resume."""
DEFAULT_WHY = "not run in place: the fault changes no epoch, or only the restart path's resume"


def write_results() -> None:
    """Append this module's rows to ``MALLETRAIN_FAULTS_RESULTS`` (when set) and forget them."""
    path = os.environ.get("MALLETRAIN_FAULTS_RESULTS")
    if path and RESULTS:
        try:
            rows = json.loads(Path(path).read_text())
        except (OSError, ValueError):
            rows = []
        Path(path).write_text(json.dumps(rows + RESULTS, indent=1) + "\n")
    RESULTS.clear()


def record(scenario: str, survived: str, lost: int | None, note: str = "",
           paths: dict[int, tuple[int, str, bool]] | None = None) -> None:
    """One row: the test's name (its id without the module) and path go with it; ``paths``
    is the job's epoch history as the daemon logged it (epoch → world, path, abandon)."""
    test = os.environ.get("PYTEST_CURRENT_TEST", "").split("::")[-1].split(" ")[0]
    row: dict[str, Any] = {"scenario": scenario, "outcome": survived, "samples_lost": lost,
                           "note": note, "test": test, "path": PATH}
    if paths is not None:
        row["epochs"] = [[e, w, p, a] for e, (w, p, a) in sorted(paths.items())]
    RESULTS.append(row)


def path_fixture(request: pytest.FixtureRequest) -> None:
    """Autouse in each fault module: in place, skip (and record why) every scenario that is
    not in :data:`IN_PLACE`."""
    name = getattr(request.node, "originalname", request.node.name)
    if INPLACE and name not in IN_PLACE:
        why = NOT_IN_PLACE.get(name, DEFAULT_WHY)
        RESULTS.append({"test": request.node.name, "path": PATH, "not_run": why})
        pytest.skip(f"MALLETRAIN_FAULTS_PATH=inplace: {why}")


def history(daemon: LocalDaemon, job: str) -> dict[int, tuple[int, str, bool]]:
    """The job's epochs as the daemon logged them (epoch → world, path, abandon)."""
    return daemon_epochs(daemon.log_text(), job)


def training_script(daemon: LocalDaemon, outdir: Path,
                    command: list[str] | None = None) -> str:
    """The batch script of a training job on the scenarios' path."""
    return daemon.training_script(command or TRAIN, outdir, inplace=INPLACE)


def daemons_fixture(request: pytest.FixtureRequest, cluster: LocalCluster,
            tmp_path: Path) -> Iterator[Callable[..., LocalDaemon]]:
    """Start daemons (``settings`` as for LocalDaemon); all are stopped afterwards."""
    started: list[LocalDaemon] = []

    def make(settings: dict[str, dict[str, Any]] | None = None, start: bool = True,
             root: Path | None = None) -> LocalDaemon:
        d = LocalDaemon(cluster, root=root or tmp_path / f"malletraind-{uuid.uuid4().hex[:8]}",
                        settings=settings)
        started.append(d)
        if start:
            d.start()
        return d

    yield make
    rep = getattr(request.node, "rep_call", None)
    for d in started:
        if rep is not None and rep.failed and d.running():
            print(f"\n==== malletraind's view ====\n{d.snapshot()}")
        d.stop()
        if rep is not None and rep.failed:
            print(f"\n==== malletraind log ({d.root.name}) ====\n{d.log_tail(60)}")


def outdir_fixture(tmp_path: Path) -> Path:
    out = tmp_path / "out"
    out.mkdir()
    out.chmod(0o777)
    return out


# ---------------------------------------------------------------------------- Slurm's view
def gone(cluster: LocalCluster, job: str) -> bool:
    return not cluster.run(["squeue", "-h", "-j", job, "-o", "%i"], check=False).stdout.strip()


def prod(cluster: LocalCluster, nodes: int, seconds: float) -> str:
    return cluster.sbatch("-p", "prod", "-N", str(nodes), "-o", "/dev/null",
                          "--wrap", f"sleep {seconds:g}")


def wait_running(cluster: LocalCluster, job: str, timeout_s: float = 30.0) -> None:
    cluster.wait_for(f"job {job} running", lambda: cluster.run(
        ["squeue", "-h", "-j", job, "-t", "R", "-o", "%i"]).stdout.strip() != "", timeout_s)


# ---------------------------------------------------------------------------- training
def submit(cluster: LocalCluster, daemon: LocalDaemon, nodes: str, outdir: Path) -> str:
    script = training_script(daemon, outdir)
    return cluster.sbatch("--qos=malletrain", "-N", nodes, "--open-mode=append",
                          "-o", f"{outdir}/task-%A_%a.out", script=script)


def samples_lost(log: JobLog, fault_epoch: int) -> int:
    """Samples trained in epochs up to ``fault_epoch`` beyond the step that the first later
    epoch resumed from (the largest step reached times the global batch)."""
    reached = [(step, world) for epoch, rows in log.steps.items() if epoch <= fault_epoch
               for step, world, _, _ in rows]
    later = sorted(e for e in log.starts if e > fault_epoch)
    assert reached and later, f"no resume after epoch {fault_epoch}"
    step, world = max(reached)
    resumed = min(s for s, _, _ in log.starts[later[0]])
    return max(0, step - resumed) * BATCH * world


def samples_lost_since(log: JobLog, epoch: int) -> tuple[int, int]:
    """Over every epoch change after ``epoch``: (the samples lost, summed as in
    :func:`samples_lost` for each change, and the number of changes). A change loses what the
    epochs before it trained beyond the step the new epoch starts from."""
    lost = changes = 0
    reached: list[tuple[int, int]] = [(step, world) for e, rows in log.steps.items()
                                      if e <= epoch for step, world, _, _ in rows]
    for e in sorted(x for x in set(log.starts) | set(log.steps) if x > epoch):
        if log.starts.get(e) and reached:
            step, world = max(reached)
            lost += max(0, step - min(s for s, _, _ in log.starts[e])) * BATCH * world
            changes += 1
            reached = [(min(s for s, _, _ in log.starts[e]), world)]
        reached += [(step, world) for step, world, _, _ in log.steps.get(e, [])]
    return lost, changes


def assert_invariants(log: JobLog) -> None:
    """The training contract (training_logs.invariant_problems). In place a start line is a
    re-form, which goes on from the step in memory: there an epoch may start anywhere from
    the last checkpoint before it on, never further back."""
    problems = invariant_problems(log)
    if INPLACE:
        problems = [p for p in problems if "resumed at step" not in p]
        for epoch, starts in sorted(log.starts.items()):
            before = [s for e, s in log.checkpoints if e < epoch]
            floor = max(before, default=0)
            back = sorted({s for s, _, _ in starts if s < floor})
            if back:
                problems.append(f"epoch {epoch} started at step {back}, before the last "
                                f"checkpoint {floor}")
    assert not problems, "\n".join(problems)


