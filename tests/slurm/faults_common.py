"""What the fault scenarios share: training jobs under a real malletraind, their progress lost,
Slurm's view, and the results table that ``bench/faults.py`` turns into BENCHMARKS.md.

Every module of fault scenarios records one row per scenario that passed with
:func:`record`; with ``MALLETRAIN_FAULTS_RESULTS=FILE`` set, :func:`write_results` (called by
each module's autouse fixture) appends them to that JSON file.
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

from malletrain_core.localcluster import LocalCluster
from malletrain_core.localcluster.daemon import LocalDaemon

BATCH = 16
TRAIN = [sys.executable, "examples/train_elastic.py", "--steps", "0", "--batch", str(BATCH),
         "--step-sleep-s", "0.1", "--checkpoint-every-s", "6", "--log-every", "1"]
NO_PROFILING: dict[str, dict[str, Any]] = {"profiler": {"enabled": False}}
RESULTS: list[dict[str, Any]] = []


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


def record(scenario: str, survived: str, lost: int | None, note: str = "") -> None:
    RESULTS.append({"scenario": scenario, "outcome": survived, "samples_lost": lost,
                    "note": note})


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
    script = daemon.training_script(TRAIN, outdir)
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


def assert_invariants(log: JobLog) -> None:
    problems = invariant_problems(log)
    assert not problems, "\n".join(problems)


