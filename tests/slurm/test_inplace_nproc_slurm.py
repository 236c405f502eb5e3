"""Several training processes per node in place under real Slurm (``malletrain-run --inplace
--nproc-per-node N``), directed by a real malletraind.

As tests/slurm/test_inplace_slurm.py, with N = 2 and N = 3 processes in each one-node task
(CPU, gloo): the daemon sizes the job in nodes, the processes train at world nodes × N with
ranks node rank × N + local rank. After every change all ranks hold the same state (digest
of model, optimizer, scheduler, sampler and step), every sample is counted once, every change
after the job's first epoch is made in place, a planned change loses no step and a
preemption at most one, and the surviving processes are never restarted.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from faults_common import daemons_fixture
from test_inplace_slurm import BATCH, SETTINGS, STANDIN, check, nodes_of, prod, report, wait_world

from devtools.localcluster import LocalCluster
from devtools.localcluster.daemon import LocalDaemon
from devtools.runlogs.inplace_logs import change, daemon_epochs, read

pytestmark = [pytest.mark.torch]

# steps of ~50 ms, a checkpoint every 4 s (the worker computes on one thread)
TRAIN = [sys.executable, "tests/workers/inplace_train.py", "--batch", str(BATCH),
         "--sleep", "0.05", "--checkpoint-every-s", "4"]

daemons = pytest.fixture(daemons_fixture, name="daemons")


@pytest.fixture
def daemon(daemons: Callable[..., LocalDaemon]) -> LocalDaemon:
    return daemons(SETTINGS)


def submit(cluster: LocalCluster, daemon: LocalDaemon, nodes: str, outdir: Path,
           nproc: int) -> str:
    script = daemon.training_script(TRAIN, outdir, inplace=True, nproc_per_node=nproc)
    return cluster.sbatch("--qos=malletrain", "-N", nodes, "--open-mode=append",
                          "--comment=profile=no", "-o", f"{outdir}/task-%A_%a.out",
                          script=script)


def check_layout(outdir: Path, job: str, nproc: int, epochs: list[int]) -> None:
    """In each epoch, every task's processes hold consecutive global ranks, local rank i at
    rank node rank × nproc + i, and the job's ranks are exactly 0 .. world - 1."""
    log = read(outdir, job)
    for epoch in epochs:
        by_task: dict[str, set[tuple[int, int]]] = {}
        worlds = set()
        for r in log.in_epoch(epoch):
            by_task.setdefault(r["task"].rsplit(":", 1)[0], set()).add((r["local"], r["rank"]))
            worlds.add(r["world"])
        assert len(worlds) == 1, f"epoch {epoch}: worlds {worlds}"
        ranks = sorted(rank for pairs in by_task.values() for _, rank in pairs)
        assert ranks == list(range(worlds.pop())), f"epoch {epoch}: ranks {by_task}"
        for task, pairs in by_task.items():
            assert len({local for local, _ in pairs}) == nproc == len(pairs), (task, pairs)
            node = min(rank for _, rank in pairs) // nproc
            assert pairs == {(i, node * nproc + i) for i in range(nproc)}, (epoch, task, pairs)


def pids(outdir: Path, job: str, epoch: int) -> dict[str, set[int]]:
    """task:local → the pids of its process in ``epoch``."""
    out: dict[str, set[int]] = {}
    for r in read(outdir, job).in_epoch(epoch):
        out.setdefault(r["task"], set()).add(r["pid"])
    return out


def test_two_processes_per_node_grow_then_preemption(cluster: LocalCluster,
                                                     daemon: LocalDaemon,
                                                     outdir: Path) -> None:
    """1 → 2 nodes (a prod job ends; the joining node's 2 processes receive the state),
    then a prod job preempts one node (2 → 1, abandon): ranks 2 → 4 → 2, in place, the
    survivor node's two processes kept, at most one step lost."""
    prod(cluster, 6)
    one = prod(cluster, 1)                      # 1 node stays idle
    job = submit(cluster, daemon, "1-2", outdir, nproc=2)
    e0 = wait_world(cluster, outdir, job, 1, nproc=2, timeout_s=150)
    cluster.run(["scancel", one])
    e1 = wait_world(cluster, outdir, job, 2, nproc=2, after=e0)
    prod(cluster, 1, "-w", nodes_of(cluster, job)[-1])
    e2 = wait_world(cluster, outdir, job, 1, nproc=2, after=e1)

    epochs = daemon_epochs(daemon.log_text(), job)
    first = min(epochs)
    assert epochs[first][1] == "disk", epochs
    assert all(epochs[e][1] == "inplace" for e in epochs if first < e <= e2), epochs
    assert epochs[e2][1:] == ("inplace", True), f"the preemption: {epochs[e2]}"
    assert epochs[e1][0] == 2, "the daemon sizes the job in nodes"
    log = read(outdir, job)
    assert change(log, e0, e1)[1] == 0, "the grow lost a step"
    assert change(log, e1, e2)[1] <= 1, "the preemption lost more than the step in flight"
    before, after = pids(outdir, job, e1), pids(outdir, job, e2)
    assert len(after) == 2 and all(after[k] == before.get(k) for k in after), \
        f"a survivor was restarted: {before} → {after}"
    check_layout(outdir, job, 2, [e0, e1, e2])
    check(outdir, job)
    report("2 per node", outdir, job, [("grow 1→2 nodes", e0, e1),
                                       ("one node of 2 preempted", e1, e2)])


def test_three_processes_per_node_planned_shrink_then_grow(cluster: LocalCluster,
                                                           daemon: LocalDaemon,
                                                           outdir: Path) -> None:
    """2 nodes × 3 processes; a second elastic job takes its share (planned 2 → 1 nodes,
    ranks 6 → 3: the leaving node's three processes exit at the same step boundary), then
    leaves (1 → 2 again): in place, no step lost."""
    prod(cluster, 6)                            # 2 nodes stay idle
    job = submit(cluster, daemon, "1-2", outdir, nproc=3)
    e0 = wait_world(cluster, outdir, job, 2, nproc=3, timeout_s=150)
    other = cluster.sbatch("--qos=malletrain", "-N", "1-1", "--comment=profile=no",
                           "-o", "/dev/null", "--chdir=/tmp", script=STANDIN)
    e1 = wait_world(cluster, outdir, job, 1, nproc=3, after=e0)
    cluster.run(["scancel", other])
    e2 = wait_world(cluster, outdir, job, 2, nproc=3, after=e1)

    epochs = daemon_epochs(daemon.log_text(), job)
    first = min(epochs)
    assert epochs[first][1] == "disk", epochs
    assert all(epochs[e][1] == "inplace" for e in epochs if first < e <= e2), epochs
    assert not epochs[e1][2], "the planned shrink abandoned"
    log = read(outdir, job)
    for a, b in ((e0, e1), (e1, e2)):
        assert change(log, a, b)[1] == 0, f"epoch {a} → {b} lost a step"
    before, after = pids(outdir, job, e0), pids(outdir, job, e1)
    assert len(after) == 3 and all(after[k] == before.get(k) for k in after), \
        f"a survivor was restarted: {before} → {after}"
    check_layout(outdir, job, 3, [e0, e1, e2])
    check(outdir, job)
    report("3 per node", outdir, job, [("shrink 2→1 nodes", e0, e1),
                                       ("grow 1→2 nodes", e1, e2)])
