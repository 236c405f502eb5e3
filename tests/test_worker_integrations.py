"""The Lightning and Hugging Face pieces that need no process group."""

from __future__ import annotations

from pathlib import Path

import pytest

from malletrain_core.errors import MalleTrainError

pytestmark = pytest.mark.torch


def test_hf_accumulation_keeps_the_global_batch() -> None:
    hf = pytest.importorskip("malletrain_core.worker.hf", exc_type=ImportError)
    assert [hf.accumulation(48, 8, world_size=w) for w in (1, 2, 3)] == [6, 3, 2]
    with pytest.raises(MalleTrainError, match="every world size"):
        hf.accumulation(48, 8, world_size=4)


def test_hf_last_checkpoint_skips_a_save_cut_short(tmp_path: Path) -> None:
    hf = pytest.importorskip("malletrain_core.worker.hf", exc_type=ImportError)
    assert hf.last_checkpoint(tmp_path / "missing") is None
    for step, complete in ((10, True), (20, True), (30, False)):
        folder = tmp_path / f"checkpoint-{step}"
        folder.mkdir()
        if complete:
            (folder / "trainer_state.json").write_text("{}")
    assert hf.last_checkpoint(tmp_path) == str(tmp_path / "checkpoint-20")


def test_lightning_environment_follows_the_epoch(monkeypatch: pytest.MonkeyPatch,
                                                 tmp_path: Path) -> None:
    mt = pytest.importorskip("malletrain_core.worker.lightning", exc_type=ImportError)
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    monkeypatch.setenv("MALLETRAIN_JOB_ID", "7")
    monkeypatch.setenv("MALLETRAIN_CHECKPOINT_DIR", str(tmp_path))
    env = mt.MalleTrainEnvironment()
    assert mt.MalleTrainEnvironment.detect()
    assert (env.world_size(), env.global_rank()) == (3, 2)
    env.set_world_size(2)                   # the Trainer's num_nodes does not win
    assert env.world_size() == 3
    env.validate_settings(num_devices=1, num_nodes=2)
    with pytest.raises(ValueError, match="devices=1"):
        env.validate_settings(num_devices=2, num_nodes=1)
    assert mt.last_checkpoint() is None
    root = tmp_path / "lightning"
    root.mkdir()
    (root / "step-000000005-e0-1.ckpt").write_bytes(b"x")
    (root / "latest").write_text("step-000000005-e0-1.ckpt\n")
    assert mt.last_checkpoint() == str(root / "step-000000005-e0-1.ckpt")


def test_core_package_does_not_import_the_frameworks() -> None:
    import subprocess
    import sys

    code = ("import sys, malletrain_core.worker.launcher, malletrain_core.worker.elastic; "
            "print(sorted(m for m in ('lightning', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "[]"
