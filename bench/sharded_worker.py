"""The training process of bench/sharded_reference.py, and the model, optimizer and digest that
tests/workers/sharded_train.py imports from here (a bench takes nothing from tests/, so the
pieces live here), with that worker's batch and step: every rank trains on the same
batch, and each step's line carries the digest of the FULL state at its start (every parameter
and optimizer state gathered), comparable across layouts. Added: ``--save-at-end``, after its
last step the group writes a DCP checkpoint, from which the next segment of a save-and-restart
run resumes.

Run by the reference's driver (a control folder per node, ``LOCAL_RANK``/``LOCAL_WORLD_SIZE``),
never alone: ``python -m bench.sharded_worker --mode fsdp --steps 40 --save-at-end``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from typing import Any

import torch
from torch import nn

from malletrain_core.worker import sharded, training


class Net(nn.Module):
    """Rows uneven at every world (13, 7, 3), a LayerNorm and a buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(6, 13)
        self.norm = nn.LayerNorm(13)
        self.b = nn.Linear(13, 7)
        self.c = nn.Linear(7, 3)
        self.register_buffer("scale", torch.tensor([0.5, 2.0, 1.0]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c(torch.relu(self.b(torch.relu(self.norm(self.a(x)))))) * self.scale


def build(mesh: Any) -> Any:
    """Each linear layer its own FSDP unit, then the root."""
    from torch.distributed.fsdp import fully_shard

    model = Net()
    for part in (model.a, model.b, model.c):
        fully_shard(part, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def make_optimizer(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.1)


class Position:
    """A sampler's position (samples consumed), handed over with the model."""

    def __init__(self) -> None:
        self.pos = 0

    def state_dict(self) -> dict[str, int]:
        return {"pos": self.pos}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.pos = int(state["pos"])


def full_digest(el: sharded.Elastic) -> str:
    """The digest of every parameter and optimizer state, gathered whole (a collective)."""
    from torch.distributed.tensor import DTensor

    h = hashlib.sha256()
    with torch.no_grad():
        for name, p in el.model.named_parameters():
            tensors = {"p": p, **el.optimizer.state.get(p, {})}
            for k in sorted(tensors):
                t = tensors[k]
                t = t.full_tensor() if isinstance(t, DTensor) else t
                h.update(f"{name}/{k}".encode())
                h.update(t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def emit(record: dict[str, object]) -> None:
    """One JSON line, written at once (the processes of a node may share a file)."""
    os.write(sys.stdout.fileno(), (json.dumps(record) + "\n").encode())


def train_step(el: Any, session: Any, pos: Any, step: int) -> tuple[str | None, bool]:
    """One step on every rank's same batch: (the full-state digest at its start, or None when
    the step failed before it; whether the step was dropped)."""
    before = None
    with el.guard():
        before = full_digest(el)
        g = torch.Generator().manual_seed(step * 1009)
        x, y = torch.randn(8, 6, generator=g), torch.randn(8, 3, generator=g)
        loss = nn.functional.mse_loss(el.model(x), y)
        el.optimizer.zero_grad()
        loss.backward()
        el.optimizer.step()
        el.scheduler.step()
        pos.pos += 8
    failed = el._step_failed
    session.report(samples=0 if failed else 8)
    return before, failed


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", choices=(sharded.FSDP, sharded.HSDP), required=True)
    p.add_argument("--steps", type=int, default=0, help="train until this step (0: forever)")
    p.add_argument("--sleep", type=float, default=0.0, help="seconds after each step")
    p.add_argument("--buddy-every", type=int, default=0)
    p.add_argument("--save-at-end", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(1)
    session = training.Session(handle_sigterm=False, checkpoint_every_s=3600.0)
    pos = Position()
    el = sharded.Elastic(session, build, make_optimizer,
                         mode=args.mode, extra={"sampler": pos}, buddy_every=args.buddy_every,
                         collective_timeout_s=20, make_scheduler=lambda opt: torch.optim.
                         lr_scheduler.StepLR(opt, step_size=10_000, gamma=0.5))
    shown = 0
    for step in el.steps(args.steps):
        for change in el.changes[shown:]:
            emit({"change": change, "moved": el.sharding.moved, "local": el.local_rank})
        shown = len(el.changes)
        before, failed = train_step(el, session, pos, step)
        if args.sleep:
            time.sleep(args.sleep)
        emit({"t": time.time(), "step": step, "failed": failed, "epoch": el.epoch,
              "world": el.world, "rank": el.rank, "local": el.local_rank, "before": before, "pos": pos.pos,
              "scheduled": el.scheduler.last_epoch, "resumed_from": el.resumed_from})
    if args.save_at_end:
        el.save()
        emit({"saved": el.step, "rank": el.rank})
    el.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
