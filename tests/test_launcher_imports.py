"""``malletrain-run`` starts on every node that becomes idle: it must not import numpy or torch
(their import is time the node does not train)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from malletrain_core import config, model

ROOT = Path(__file__).resolve().parents[1]


def test_the_config_default_look_ahead_is_the_model_one():
    assert config.DEFAULT_LOOKAHEAD_S == model.DEFAULT_LOOKAHEAD_S
    assert config.AllocatorConfig().lookahead_s == model.DEFAULT_LOOKAHEAD_S


def test_the_launcher_imports_neither_numpy_nor_torch_nor_the_training_side():
    """The control-file format is worker/control.py: the launcher does not load the in-place
    training code (worker/inplace/) to write a membership."""
    banned = ("numpy", "torch", "malletrain_core.worker.inplace")
    out = subprocess.run(
        [sys.executable, "-c", "import sys, malletrain_core.worker.launcher; "
         f"print(sorted(m for m in {banned!r} if m in sys.modules))"],
        capture_output=True, text=True, timeout=60, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]"
