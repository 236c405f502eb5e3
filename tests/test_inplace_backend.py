"""In place: which way a group holding an abandoned operation is let go (by its backend), and
gradient averaging without DDP.

NCCL itself is not run here (no GPU): only the selection between NCCL's abort and gloo's
forget is checked, and the gloo side of it on a real gloo group.
"""

from __future__ import annotations

import datetime as dt
import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from malletrain_core.worker import inplace, training

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

pytestmark = pytest.mark.torch

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def elastic(**kw):
    model = torch.nn.Linear(3, 2)
    session = training.Session(env={}, handle_sigterm=False)
    return inplace.Elastic(session, model, torch.optim.SGD(model.parameters(), lr=0.1), **kw)


def test_abandon_action_follows_the_backend():
    assert inplace.abandon_action("nccl") == "abort"
    assert inplace.abandon_action("NCCL") == "abort"
    assert inplace.abandon_action("gloo") == "forget"
    assert inplace.abandon_action("cuda:nccl,cpu:gloo") == "abort"
    with pytest.raises(ValueError, match="gloo or nccl"):
        elastic(backend="mpi")


def test_an_abandoned_gloo_group_is_forgotten_not_aborted():
    store = dist.TCPStore("127.0.0.1", free_port(), 1, is_master=True,
                          timeout=dt.timedelta(seconds=10), wait_for_workers=False)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    el = elastic()
    try:
        assert inplace.abandon_action(dist.get_backend()) == "forget"
        el._pending.abandon("a peer hung")
        el._teardown()
        assert not dist.is_initialized()
        assert el.holds_abandoned and len(el._old.graveyard) == 1  # forgotten, kept referenced
    finally:
        el.holds_abandoned = False  # nothing is pending in a one-rank group: exit normally
        el._old.graveyard.clear()
        if dist.is_initialized():
            dist.destroy_process_group()


HUNG_ABORT = textwrap.dedent("""
    import datetime as dt, sys, time, torch, torch.distributed as dist
    from malletrain_core.worker import inplace, training
    from malletrain_core.worker.inplace import group, letgo
    store = dist.TCPStore("127.0.0.1", int(sys.argv[1]), 1, is_master=True,
                          timeout=dt.timedelta(seconds=10), wait_for_workers=False)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    model = torch.nn.Linear(2, 1)
    el = inplace.Elastic(training.Session(env={}, handle_sigterm=False), model, None,
                         control_dir="")
    kind = sys.argv[2]
    if kind == "abort":
        group.abandon_action = lambda backend: "abort"      # as NCCL's group would be
        letgo._abort_group = lambda group: time.sleep(600)  # an abort stuck in the driver
        el._pending.abandon("a peer hung")
    else:
        letgo._shutdown_group = lambda group: time.sleep(600)  # a planned shut-down stuck
    el.retire_bound_s = 0.5
    started = time.monotonic()
    el._teardown()
    # the abort runs beside: the next group can be formed and trained on at once
    print(f"went on after {time.monotonic() - started:.3f} s", flush=True)
    assert not dist.is_initialized() and el.holds_abandoned == (kind == "abort")
    el._settle_retiring(wait=False)                           # within the bound: nothing
    print("still here", flush=True)
    time.sleep(0.6)
    el._settle_retiring(wait=False)                           # past it: the restart path
    print("not reached", flush=True)
""")


@pytest.mark.parametrize("kind", ["abort", "shutdown"])
def test_a_hung_let_go_makes_the_process_leave_for_the_restart_path(tmp_path, kind):
    """The old group's abort (NCCL, an abandoned operation) or planned shut-down runs beside
    the next group; one that never returns sends the process to the restart path once it is
    past its bound, never holding the training meanwhile."""
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", HUNG_ABORT, str(free_port()), kind],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == inplace.EXIT_ABORT_HUNG, proc.stderr[-2000:]
    went_on = float(proc.stdout.split("went on after ")[1].split()[0])
    assert went_on < 0.4, proc.stdout   # the abort did not hold the caller
    assert "still here" in proc.stdout and "not reached" not in proc.stdout
    assert f"the {kind} of epoch" in proc.stderr and "restart path" in proc.stderr
    assert "did not return within 0.5 s" in proc.stderr
    assert time.monotonic() - started < 60  # the bound, not the 600 s of the stuck abort


WORKER = textwrap.dedent("""
    import os, sys, torch
    from malletrain_core.worker import inplace, training
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1, bias=False)
    session = training.Session(handle_sigterm=False)
    el = inplace.Elastic(session, model, None, control_dir="", ddp=False,
                         collective_timeout_s=20)
    el._start()
    rank = session.rank
    model.weight.grad = torch.full((1, 4), float(rank + 1))
    el.average_gradients()
    print(" ".join(f"{v:g}" for v in model.weight.grad.flatten().tolist()), flush=True)
    assert el.net is model and "torch._dynamo" not in sys.modules, "DDP was used"
""")


def test_average_gradients_without_ddp_over_real_gloo(tmp_path):
    port = free_port()
    procs = []
    for rank in range(2):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(port), "PYTHONPATH": str(ROOT)}
        env.pop(training.ENV_CONTROL_DIR, None)
        procs.append(subprocess.Popen([sys.executable, "-c", WORKER], env=env, cwd=tmp_path,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-2000:]
        assert out.split() == ["1.5"] * 4  # (1 + 2) / 2 on both ranks


CRASH = textwrap.dedent("""
    import torch
    from malletrain_core.worker import inplace, training
    model = torch.nn.Linear(2, 1)
    el = inplace.Elastic(training.Session(env={}, handle_sigterm=False), model, None,
                         control_dir="")
    el.holds_abandoned = True  # as guard() sets it after a step abandoned by a lost peer
    raise TimeoutError("epoch 17: not every rank came to the group")
""")


def test_a_crash_while_holding_an_abandoned_operation_exits_non_zero(tmp_path):
    # seen in the demo: a re-form timed out after a step was abandoned, and the process left
    # with 0, which the launcher reported as training finished
    proc = subprocess.run([sys.executable, "-c", CRASH], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert "TimeoutError" in proc.stderr
    assert proc.returncode == 1
