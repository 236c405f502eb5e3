"""examples/train_sharded.py: its model's size, a plain run that resumes from its DCP
checkpoint, and the script unchanged in place through a grow, with real gloo processes driven
through the control folder (tests/test_inplace_sharded.py's driver)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from script_module import ROOT, load_script

from tests.test_inplace import wait_for
from tests.test_inplace_sharded import Driver

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch

SCRIPT = ROOT / "examples" / "train_sharded.py"
TINY = ["--vocab", "64", "--dim", "32", "--layers", "2", "--heads", "2", "--seq", "16",
        "--batch", "4", "--log-every", "1"]


def test_the_default_model_has_over_ten_million_parameters() -> None:
    mod = load_script("examples/train_sharded.py", "train_sharded_size")
    a = mod.parse_args([])
    with torch.device("meta"):
        model = mod.TinyLM(a.vocab, a.dim, a.layers, a.heads, a.seq)
    assert sum(p.numel() for p in model.parameters()) >= 10_000_000
    assert a.mode == "hsdp"


def test_a_plain_run_resumes_from_its_sharded_checkpoint(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1",
               MALLETRAIN_CHECKPOINT_DIR=str(tmp_path / "ck"))

    def run(steps: int, mode: str) -> str:
        out = subprocess.run([sys.executable, str(SCRIPT), "--steps", str(steps), "--mode",
                              mode, *TINY], env=env, capture_output=True, text=True,
                             timeout=240, cwd=tmp_path)
        assert out.returncode == 0, out.stderr[-3000:]
        return out.stdout

    first = run(2, "fsdp")
    assert "start step=0 " in first and "done step=2 " in first
    second = run(4, "hsdp")  # DCP re-shards the saved state to whatever mesh reads it
    assert "start step=2 " in second and "done step=4 " in second, second


def test_the_example_grows_in_place(tmp_path: Path) -> None:
    """HSDP, one process per node: 1 → 2 nodes; the joiner's first step is the survivor's
    next, and the shards reached it in memory."""
    d = Driver(tmp_path / "job", "hsdp", 1,
               command=[str(SCRIPT), "--mode", "hsdp", "--steps", "0", *TINY])
    d.tmp.mkdir()
    try:
        a = d.start("a")
        d.change([a])
        log_a = a.procs[0].log
        wait_for(lambda: log_a.read_text().count("\nstep=") >= 3, 120, "a's steps", d.logs)
        b = d.start("b")
        d.change([a, b])
        log_b = b.procs[0].log
        wait_for(lambda: "\nstep=" in log_b.read_text(), 120, "b's steps", d.logs)
        start = re.search(r"start step=(\d+) epoch=\S+ world=2 .*'received_bytes': (\d+)",
                          log_b.read_text())
        assert start and int(start.group(1)) > 0 and int(start.group(2)) > 0, \
            log_b.read_text()[-2000:]
    finally:
        d.stop()
