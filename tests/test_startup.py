"""A training process starts without importing torch._dynamo, and compiled scripts still work.

Each case runs in a fresh interpreter: whether ``torch._dynamo`` is loaded is a fact about the
whole process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch")

pytestmark = pytest.mark.torch

ROOT = Path(__file__).resolve().parents[1]

TRAIN = textwrap.dedent("""
    import json, os, sys, torch
    from malletrain_core.worker import startup, training
    session = training.Session(env={}, handle_sigterm=False)   # defers, as in a script
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    compile_backend = sys.argv[1]
    def step(x, y):
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss
    run = torch.compile(step, backend=compile_backend) if compile_backend else step
    for i in range(4):
        g = torch.Generator().manual_seed(i)
        run(torch.randn(4, 8, generator=g), torch.randn(4, 2, generator=g))
    state = opt.state_dict()
    opt.load_state_dict(state)
    zero_grad = torch.optim.Optimizer.zero_grad.__wrapped__
    left = getattr(zero_grad, startup.CACHE_ATTR, None)
    print(json.dumps({
        "dynamo": "torch._dynamo" in sys.modules,
        "deferred": len(startup._deferred),
        "stand_in_left": isinstance(left, startup._Plain),
        "weights": [round(float(v), 6) for v in torch.cat(
            [p.detach().reshape(-1) for p in model.parameters()])[:16]],
    }))
""")


def run(backend: str, defer: bool = True) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    env["MALLETRAIN_DEFER_DYNAMO"] = "1" if defer else "0"
    proc = subprocess.run([sys.executable, "-c", TRAIN, backend], capture_output=True,
                          text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_an_eager_script_never_imports_dynamo():
    deferred = run("")
    assert not deferred["dynamo"], "the optimizer's first call imported torch._dynamo"
    assert deferred["deferred"] > 50          # the optimizer's, DDP's, ...: torch's own wrappers
    plain = run("", defer=False)
    assert plain["dynamo"], "torch no longer imports dynamo there: this module is not needed"
    assert deferred["weights"] == plain["weights"]


def test_a_compiled_step_is_traced_as_torch_would_and_trains_the_same():
    """torch.compile imports dynamo: from then on every stand-in is gone (torch's own wrappers
    run), and a step compiled with the optimizer inside trains exactly as without deferring."""
    deferred = run("aot_eager")
    assert deferred["dynamo"] and deferred["deferred"] == 0 and not deferred["stand_in_left"]
    plain = run("aot_eager", defer=False)
    assert deferred["weights"] == plain["weights"]
    assert deferred["weights"] == run("")["weights"]   # and as the eager step


def test_nas_example_trains_compiled(tmp_path):
    """The example with --compile: trains, and its checkpoint loads back into it."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
           "MALLETRAIN_CHECKPOINT_DIR": str(tmp_path / "ckpt")}
    for steps in (3, 5):   # the second run resumes from the first one's checkpoint
        proc = subprocess.run([sys.executable, str(ROOT / "examples" / "nas_cell.py"),
                               "--steps", str(steps), "--compile", "aot_eager",
                               "--log-every", "1", "--batch", "4"],
                              capture_output=True, text=True, env=env, timeout=600,
                              cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert f"done step={steps} world=1" in proc.stdout, proc.stdout[-2000:]
    assert "resumed=yes" in proc.stdout
