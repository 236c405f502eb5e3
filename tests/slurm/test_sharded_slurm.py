"""Sharded models rescaled in place under real Slurm, directed by a real malletraind.

examples/train_sharded.py (a small configuration of its transformer, CPU, gloo) runs under
``malletrain-run --inplace`` in each one-node task: ``--mode fsdp`` with one process per node
(the shards follow the world; buddy copies every 5 steps), ``--mode hsdp`` with two (a node's
processes share the shards, nodes are replicas). Prod jobs and a second elastic job drive a
grow, a planned shrink and a preemption. Each test
reads the example's own lines: the new epoch's ``start`` line says what the change moved
(``moved={...}``: bytes sent and received, ``from_disk``, ``from_buddy``), and the survivor's
training process is the one that was running before (the launcher started it once).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from faults_common import daemons_fixture
from slurm_helpers import wait_consistent
from test_inplace_slurm import SETTINGS, STANDIN, nodes_of, prod

from devtools.localcluster import LocalCluster
from devtools.localcluster.daemon import LocalDaemon
from devtools.runlogs.inplace_logs import daemon_epochs
from devtools.runlogs.sharded_logs import InNodes, sharded_log

pytestmark = [pytest.mark.torch]

SMALL = ["--vocab", "512", "--dim", "64", "--layers", "2", "--heads", "2", "--seq", "16",
         "--batch", "4", "--log-every", "2", "--steps", "0", "--checkpoint-every-s", "3600"]

daemons = pytest.fixture(daemons_fixture, name="daemons")


@pytest.fixture
def daemon(daemons: Callable[..., LocalDaemon]) -> LocalDaemon:
    return daemons(SETTINGS)


def read_sharded(nproc: int) -> Callable[[Path, str], Any]:
    """A reader of the example's lines for wait_consistent, in nodes (``nproc`` per node)."""
    return lambda outdir, job: InNodes(sharded_log(outdir, job), nproc)


def one_start(outdir: Path, job: str, epoch: int) -> list[Path]:
    """The output files whose process started once and re-formed into ``epoch`` in place."""
    return [p for p in outdir.glob(f"task-{job}_*.out")
            if re.search(rf"start step=\d+ epoch={epoch} ", p.read_text(errors="replace"))
            and len(re.findall(r"training process(?:es)? started ahead",
                               p.read_text(errors="replace"))) == 1]


@pytest.mark.parametrize("mode,nproc", [("fsdp", 1), ("hsdp", 2)])
def test_the_sharded_example_grows_shrinks_and_survives_a_preemption_in_place(
        cluster: LocalCluster, daemon: LocalDaemon, outdir: Path, mode: str,
        nproc: int) -> None:
    """2 → 3 nodes (a prod job ends: the joiner's shards received over the new group),
    planned 3 → 2 (a second elastic job takes one node: FSDP re-shards over the old group
    before the leaver goes, HSDP drops a replica), then a prod job preempts one of the two:
    the survivor's processes go on in place, FSDP from the buddy copies (a rollback of at most
    5 steps, 10 during a refresh), HSDP from their own replica (nothing moves). Nothing is read
    from disk after the first epoch, every change is made in place, the survivor's processes
    are never restarted."""
    prod(cluster, 5)
    one = prod(cluster, 1)                       # 2 nodes stay idle
    command = [sys.executable, "examples/train_sharded.py", "--mode", mode, *SMALL,
               "--buddy-every", "5"]
    script = daemon.training_script(command, outdir, inplace=True, nproc_per_node=nproc)
    job = cluster.sbatch("--qos=malletrain", "-N", "1-3", "--open-mode=append",
                         "--comment=profile=no", "-o", f"{outdir}/task-%A_%a.out", script=script)
    reader = read_sharded(nproc)
    _, e0 = wait_consistent(cluster, job, outdir, timeout_s=180, world=2, reader=reader)
    cluster.run(["scancel", one])
    _, e1 = wait_consistent(cluster, job, outdir, timeout_s=120, world=3, after_epoch=e0,
                            reader=reader)
    grown = sharded_log(outdir, job).starts[e1]
    assert len(grown) == 3 * nproc and sum(m["received_bytes"] for m in grown.values()) > 0
    cluster.sbatch("--qos=malletrain", "-N", "1-1", "--comment=profile=no", "-o", "/dev/null",
                   "--chdir=/tmp", script=STANDIN)
    _, e2 = wait_consistent(cluster, job, outdir, timeout_s=120, world=2, after_epoch=e1,
                            reader=reader)
    shrunk = sharded_log(outdir, job).starts[e2]
    assert len(shrunk) == 2 * nproc, shrunk
    if mode == "fsdp":  # re-sharded over the old group, before the leaver went
        assert all("before_reform_s" in m for m in shrunk.values()), shrunk
    cluster.wait_for(f"5 steps at world 2 in epoch {e2}", lambda: len(
        sharded_log(outdir, job).steps.get(e2, [])) >= 5 * nproc, 60, interval_s=0.5)
    prod(cluster, 1, "-w", nodes_of(cluster, job)[-1])
    _, e3 = wait_consistent(cluster, job, outdir, timeout_s=120, world=1, after_epoch=e2,
                            reader=reader)
    lost = sharded_log(outdir, job).starts[e3]
    assert len(lost) == nproc, lost
    if mode == "fsdp":
        # at most 5 steps (10 when the preemption lands during a refresh: the older copies)
        assert all(m.get("from_buddy") and 0 <= m["steps_lost"] <= 10 for m in lost.values()), lost
    else:
        assert all(m["received_bytes"] == 0 for m in lost.values()), lost
    for starts in (grown, shrunk, lost):
        assert not any(m["from_disk"] for m in starts.values()), starts
    assert len(one_start(outdir, job, e3)) == 1, "the survivor's processes were restarted"
    epochs = daemon_epochs(daemon.log_text(), job)
    assert all(epochs[e][1] == "inplace" for e in epochs if e > min(epochs)), epochs
    assert not epochs[e2][2] and epochs[e3][2], epochs  # planned, then a loss (abandon)
    print(f"\n{mode} × {nproc}: grow 2→3 received "
          f"{sum(m['received_bytes'] for m in grown.values())} bytes; shrink 3→2 "
          f"{next(iter(shrunk.values()))}; preemption 2→1 {next(iter(lost.values()))}")
