"""Bring-your-own-loop integrations trained elastically under real Slurm and a real daemon.

The job (``sbatch --qos=malletrain -N 1-3``, profiling off so its size follows the idle
nodes) starts on 2 nodes left by a prod job, grows to 3 when that job is cancelled (a planned
rescale: checkpoint first), loses 2 nodes to a preempting prod job (no warning: resume from
the last periodic checkpoint), and grows back when it ends. The assertions read Slurm and the
workers' own step lines: every epoch's world size equals the job's RUNNING tasks, all ranks
hold the same parameters after every step, each epoch resumes from the newest checkpoint, the
surviving updates trained the global sample stream without gap or overlap, the loss went
down and the run id never changed.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from slurm_helpers import wait_consistent
from test_training_e2e import daemon  # noqa: F401  (the daemon fixture)

from devtools.localcluster import LocalCluster
from devtools.localcluster.daemon import LocalDaemon
from devtools.runlogs.byo_logs import (
    ENV,
    SCRIPTS,
    ByoLog,
    Step,
    lineage,
    lost_per_epoch_change,
    problems,
    read,
)

pytestmark = [pytest.mark.torch, pytest.mark.slow]

def wait_world(cluster: LocalCluster, job: str, outdir: Path, timeout_s: float,
               after_epoch: int = -1, world: int | None = None) -> tuple[int, int]:
    """Wait until the newest epoch (after ``after_epoch``) trains with exactly the job's
    RUNNING tasks as ranks (and ``world`` of them); returns (world, epoch)."""
    return wait_consistent(cluster, job, outdir, timeout_s, after_epoch=after_epoch,
                           world=world, reader=read)


def wait_gone(cluster: LocalCluster, job: str, timeout_s: float) -> None:
    cluster.wait_for(f"job {job} gone", lambda: not cluster.run(
        ["squeue", "-h", "-j", job, "-o", "%i"], check=False).stdout.strip(), timeout_s)


def grow_preempt_grow_back(cluster: LocalCluster, malletraind: LocalDaemon, tmp_path: Path,
                           command: list[str], inplace: bool = False
                           ) -> tuple[Path, str, list[int], list[int]]:
    """The scenario (see the module doc); returns the output folder, the job, the world size
    of each phase and its first epoch."""
    outdir = tmp_path / "out"
    outdir.mkdir()
    outdir.chmod(0o777)
    total = len(cluster.node_names)
    blocker = cluster.sbatch("-p", "prod", "-N", str(total - 2), "-o", "/dev/null",
                             "--wrap", "sleep 3000")
    command = [arg.format(out=outdir) for arg in command]
    script = malletraind.training_script([*ENV, *command], outdir, inplace=inplace)
    job = cluster.sbatch("--qos=malletrain", "-N", "1-3", "--open-mode=append",
                         "--comment=profile=no", "-o", f"{outdir}/task-%A_%a.out",
                         script=script)
    worlds, epochs = [], []
    w, epoch = wait_world(cluster, job, outdir, 240, world=2)
    worlds.append(w)
    epochs.append(epoch)

    cluster.run(["scancel", blocker])                      # grow (restart path: checkpoint first)
    w, epoch = wait_world(cluster, job, outdir, 180, after_epoch=epoch, world=3)
    worlds.append(w)
    epochs.append(epoch)
    time.sleep(3 if inplace else 8)  # restart path: a periodic checkpoint or two to resume from

    # A prod job preempts 2 of the 3 workers; it is cancelled once the survivor has trained
    # alone for a few seconds (not a fixed run: the restart path takes longer to get there).
    prod = cluster.sbatch("-p", "prod", "-N", str(total - 1), "-o", "/dev/null",
                          "--wrap", "sleep 3000")
    w, epoch = wait_world(cluster, job, outdir, 150, after_epoch=epoch, world=1)
    worlds.append(w)
    epochs.append(epoch)
    time.sleep(3)

    cluster.run(["scancel", prod])                         # grow back
    wait_gone(cluster, prod, 120)
    w, epoch = wait_world(cluster, job, outdir, 180, after_epoch=epoch, world=3)
    worlds.append(w)
    epochs.append(epoch)
    time.sleep(4)
    return outdir, job, worlds, epochs


def check_training(log: ByoLog, job: str, worlds: list[int]) -> tuple[list[Step], float, float]:
    """The checks both paths share; returns the surviving updates and the loss before/after."""
    assert worlds == [2, 3, 1, 3]
    found = problems(log)
    assert not found, "\n".join(found)
    kept = lineage(log)
    assert len(kept) > 40
    losses = [r.loss for r in kept if r.loss == r.loss]   # the Trainer logs every 10 steps
    head = sum(losses[:15]) / 15
    tail = sum(losses[-15:]) / 15
    assert tail < 0.7 * head, f"loss did not go down: {head:.4f} → {tail:.4f}"
    runs = log.runs()
    assert len(runs) == 1 and next(iter(runs)).endswith(f"-{job}"), runs
    return kept, head, tail


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_grow_preempt_grow_back(name: str, cluster: LocalCluster,
                                daemon: LocalDaemon, tmp_path: Path) -> None:  # noqa: F811
    if name != "torchrun":
        if not os.environ.get("MALLETRAIN_BYO_RESTART_ALL"):
            pytest.skip("the restart path's Lightning and HF runs (about 1.5 min each): `make "
                        "test-long` and `make test-matrix` run them; torchrun covers the "
                        "restart path here, test_byo_inplace_e2e.py Lightning and HF")
        pytest.importorskip({"hf": "transformers"}.get(name, name))
    outdir, job, worlds, _ = grow_preempt_grow_back(cluster, daemon, tmp_path, SCRIPTS[name])
    log = read(outdir, job)
    kept, head, tail = check_training(log, job, worlds)
    changes = lost_per_epoch_change(log)
    print(f"\n{name}: worlds {worlds}; per epoch change (W→W', samples lost, pause s): "
          f"{changes}; surviving steps {len(kept)}, loss {head:.4f} → {tail:.4f}")
