"""In place: which way a group holding an abandoned operation is let go (by its backend), the
store meeting that gives up a re-form the daemon replaced, and gradient averaging without DDP.

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
        assert el.holds_abandoned and len(el._graveyard) == 1  # forgotten, kept referenced
    finally:
        el.holds_abandoned = False  # nothing is pending in a one-rank group: exit normally
        el._graveyard.clear()
        if dist.is_initialized():
            dist.destroy_process_group()


def meeting(world: int, epoch: int = 1):
    port = free_port()
    el = elastic(collective_timeout_s=20)
    el._store = dist.TCPStore("127.0.0.1", port, world, is_master=True,
                              timeout=dt.timedelta(seconds=20), wait_for_workers=False)
    m = inplace.Membership(epoch=epoch, rank=0, world=world, master="127.0.0.1", port=port)
    return el, m, port


def test_a_replaced_reform_is_given_up_at_once():
    el, m, _ = meeting(world=2)
    el._latest = inplace.Membership(epoch=2, rank=0, world=1, master="127.0.0.1", port=1,
                                    abandon=True)
    t0 = time.monotonic()
    with pytest.raises(inplace.StepAbandoned, match="given up"):
        el._meet(m)  # rank 1 never comes: a newer membership says it was lost
    assert time.monotonic() - t0 < 2.0
    assert el._store.get("mt/verdict") == b"abandon"


def test_all_members_met_go_and_the_verdict_binds_late_readers():
    el, m, port = meeting(world=2)
    other = dist.TCPStore("127.0.0.1", port, 2, is_master=False,
                          timeout=dt.timedelta(seconds=20))
    other.add("mt/joined", 1)
    el._meet(m)  # both are there: go
    assert other.get("mt/verdict") == b"go"
    # a member that sees a newer membership only now still follows the verdict
    el._latest = inplace.Membership(epoch=5, rank=0, world=1, master="127.0.0.1", port=1)
    el._meet(m)


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
