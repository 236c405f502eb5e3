"""Bring-your-own loops rescaled in process under real Slurm and a real daemon.

The same scripts and the same scenario as tests/slurm/test_byo_e2e.py (start on 2 nodes, grow
to 3, lose 2 to a preempting prod job, grow back to 3), but the tasks run
``malletrain-run --inplace``: the training processes, their imports, data and model live
across the changes, and the state is handed over in memory. Besides that test's checks (world
sizes, equal parameters on every rank after every step, global sample positions without gap or
overlap along the surviving updates, the loss going down, one run id), every change after the
first is in memory, some process lives through every change, a planned change loses no
sample and the preemption at most the step in flight.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from test_byo_e2e import SCRIPTS as RESTART_SCRIPTS
from test_byo_e2e import check_training, grow_preempt_grow_back
from test_training_e2e import daemon  # noqa: F401  (the daemon fixture)

from devtools.localcluster import LocalCluster
from devtools.localcluster.daemon import LocalDaemon
from devtools.runlogs.byo_logs import lost_per_epoch_change, read

pytestmark = [pytest.mark.torch, pytest.mark.slow]

SCRIPTS = RESTART_SCRIPTS  # the same scripts
IN_FLIGHT = {"torchrun": 8 * 3, "lightning": 8 * 3, "hf": 48}
"""The samples of one step at world 3: 8 per rank (torchrun, Lightning), a global batch of 48
(HF)."""
START_PID = re.compile(r"malletrain: start step=\d+ epoch=(\d+) .* pid=(\d+)")


def pids_by_epoch(outdir: Path, job: str) -> dict[int, set[str]]:
    """The processes (pids) that started each epoch, from their ``start`` lines."""
    out: dict[int, set[str]] = {}
    for path in outdir.glob(f"task-{job}_*.out"):
        for m in START_PID.finditer(path.read_text(errors="replace")):
            out.setdefault(int(m.group(1)), set()).add(m.group(2))
    return out


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_grow_preempt_grow_back_in_process(name: str, cluster: LocalCluster,
                                           daemon: LocalDaemon, tmp_path: Path) -> None:  # noqa: F811
    if name != "torchrun":
        pytest.importorskip({"hf": "transformers"}.get(name, name))
    outdir, job, worlds, epochs = grow_preempt_grow_back(cluster, daemon, tmp_path,
                                                         SCRIPTS[name], inplace=True)
    log = read(outdir, job)
    kept, head, tail = check_training(log, job, worlds)
    # every epoch after the first 2-node one took its state from memory, none from disk
    later = [e for e in log.epochs if e > epochs[0] and log.starts.get(e)]
    assert later and set(later) <= log.in_memory, (later, sorted(log.in_memory))
    # processes lived through every change (on the restart path none does)
    pids = pids_by_epoch(outdir, job)
    for a, b in zip(epochs, epochs[1:]):
        assert pids.get(a, set()) & pids.get(b, set()), (a, b, pids)
    changes = lost_per_epoch_change(log)
    for change, lost, _pause in changes:
        before, after = (int(x) for x in change.split("→"))
        limit = 0 if after >= before else IN_FLIGHT[name]  # at most the step in flight
        assert lost <= limit, f"{change} lost {lost} samples (limit {limit}): {changes}"
    print(f"\n{name} in process: worlds {worlds}; per epoch change (W→W', samples lost, pause "
          f"s): {changes}; surviving steps {len(kept)}, loss {head:.4f} → {tail:.4f}")
