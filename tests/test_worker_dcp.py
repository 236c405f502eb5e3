"""DCP checkpoints and the global cursor with real torch and gloo, in real processes.

An elastic run changes its world size 2 → 3 → 1; each phase checkpoints, then trains steps
that no checkpoint keeps (as a preempted epoch does). The steps that survive must have
trained every sample exactly once per data epoch, all ranks must hold the same state after
every step and after every load, and the result must equal one process trained straight
through the surviving steps (the global batch is the same at every world size).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from devtools.localcluster.daemon import free_port

pytestmark = pytest.mark.torch
torch = pytest.importorskip("torch")

REPO = Path(__file__).resolve().parent.parent
PHASE = Path(__file__).resolve().parent / "elastic_phase.py"


def run_phase(world: int, kept: int, lost: int, ckpt: Path, out: Path) -> list[list[dict]]:
    port = free_port()
    procs = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                   LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   MALLETRAIN_CHECKPOINT_DIR=str(ckpt), PYTHONPATH=str(REPO),
                   OMP_NUM_THREADS="1")
        with open(out / f"w{world}-r{rank}.err", "wb") as err:
            procs.append(subprocess.Popen(
                [sys.executable, str(PHASE), "--kept", str(kept), "--lost", str(lost),
                 "--out", str(out / f"w{world}-r{rank}.jsonl")], env=env, stderr=err))
    for rank, proc in enumerate(procs):
        code = proc.wait(timeout=120)
        err = (out / f"w{world}-r{rank}.err").read_text(errors="replace")
        assert code == 0, f"world {world} rank {rank} exited {code}; its stderr ends:\n" \
            + err[-3000:]
    rows = []
    for rank in range(world):
        path = out / f"w{world}-r{rank}.jsonl"
        rows.append([json.loads(line) for line in path.read_text().splitlines()])
        path.unlink()
    return rows


# Three torchrun epochs of real gloo processes. A worker used to die of SIGABRT (-6) at exit
# now and then on a loaded host: its gloo group outlived destroy_process_group() (the model and
# optimizer kept it), and freeing its last work during interpreter finalization aborted
# (tests/elastic_phase.py's end says how it is torn down now).
def test_world_2_to_3_to_1_keeps_every_sample_once_and_equal_state(tmp_path: Path) -> None:
    ckpt, out = tmp_path / "ckpt", tmp_path / "out"
    out.mkdir()
    surviving: list[int] = []          # indices trained by the steps that survive
    step = 0
    for world, kept, lost in ((2, 9, 3), (3, 11, 2), (1, 6, 0)):
        ranks = run_phase(world, kept, lost, ckpt, out)
        starts = [r[0] for r in ranks]
        assert {s["step"] for s in starts} == {step}
        assert all(s["resumed"] == (step > 0) for s in starts)
        assert len({s["digest"] for s in starts}) == 1, f"ranks loaded different states {starts}"
        by_step: dict[int, list[dict]] = {}
        for rows in ranks:
            for row in rows:
                if row["kind"] == "step":
                    by_step.setdefault(row["step"], []).append(row)
        for s, rows in by_step.items():
            assert len({r["digest"] for r in rows}) == 1, f"world {world} step {s}: ranks differ"
            assert len({r["first"] for r in rows}) == 1
        for s in range(step + 1, step + kept + 1):
            surviving += [i for r in by_step[s] for i in r["idx"]]  # rank order = file order
        step += kept
    n, g = 53, 7
    assert len(surviving) == step * g
    for epoch in range(len(surviving) // n):
        assert sorted(surviving[epoch * n:(epoch + 1) * n]) == list(range(n))

    elastic_end = ranks[0][-1]["params"]
    straight = run_phase(1, step, 0, tmp_path / "straight", out)[0]
    straight_idx = [i for row in straight if row["kind"] == "step" for i in row["idx"]]
    assert straight_idx == surviving
    for a, b in zip(elastic_end, straight[-1]["params"]):
        assert torch.allclose(torch.tensor(a), torch.tensor(b), atol=1e-5), (a, b)
    losses = [row["loss"] for row in straight if row["kind"] == "step"]
    assert sum(losses[-5:]) < 0.2 * sum(losses[:5])


def test_latest_names_only_complete_checkpoints(tmp_path: Path) -> None:
    from torch import nn

    from malletrain_core.worker import checkpoint

    model = nn.Linear(2, 1)
    app = checkpoint.AppState(model, step=4)
    first = checkpoint.save(app, tmp_path)
    assert checkpoint.latest(tmp_path) == first
    half = tmp_path / "step-000000009-x-000000000001"   # a save killed before its metadata
    half.mkdir()
    (half / "__0_0.distcp").write_bytes(b"partial")
    (tmp_path / "latest").write_text(half.name + "\n")
    assert checkpoint.latest(tmp_path) == first
    with torch.no_grad():
        model.weight.fill_(7.0)
    app.step = 0
    assert checkpoint.load(app, tmp_path) == first and app.step == 4
    assert float(model.weight.detach().sum()) != 14.0
    for _ in range(3):
        app.step += 1
        checkpoint.save(app, tmp_path)
    assert len([p for p in tmp_path.glob("step-*") if (p / ".metadata").exists()]) == 2
