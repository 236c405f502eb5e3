"""A sharded training process that rescales in place (driven by tests/test_inplace_sharded.py).

Every rank trains on the same batch (a function of the step only), so that the sum over ranks
is exact at the world sizes the tests use (1 and 2 ranks per shard: x + x = 2x, and a halving
is exact): the state after each step is then bitwise the one of a run at a fixed world. Each
step prints one JSON line with the digest of the FULL state at its start (every parameter and
optimizer state gathered), comparable across layouts.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import fcntl
import os
import signal
import sys
import time

import torch
from inplace_train import Position  # this folder's: the sampler position, handed over

from bench.sharded_worker import build, emit, make_optimizer, train_step  # one model for both
from malletrain_core.worker import sharded, training


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=("fsdp", "hsdp"), required=True)
    p.add_argument("--steps", type=int, default=0)
    p.add_argument("--sleep", type=float, default=0.0)
    p.add_argument("--checkpoint-every-s", type=float, default=3600.0)
    p.add_argument("--buddy-every", type=int, default=0)
    p.add_argument("--collective-timeout-s", type=float, default=20.0)
    args = p.parse_args()
    with contextlib.suppress(OSError):
        fcntl.fcntl(1, fcntl.F_SETFL, fcntl.fcntl(1, fcntl.F_GETFL) | os.O_APPEND)
    torch.set_num_threads(1)
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    session = training.Session(handle_sigterm=False, checkpoint_every_s=args.checkpoint_every_s)
    pos = Position()
    el = sharded.Elastic(session, build, make_optimizer, mode=args.mode, extra={"sampler": pos},
                         buddy_every=args.buddy_every,
                         collective_timeout_s=args.collective_timeout_s, make_scheduler=lambda opt: torch.optim.
                         lr_scheduler.StepLR(opt, step_size=10_000, gamma=0.5))
    shown = 0
    for step in el.steps(args.steps):
        for change in el.changes[shown:]:
            emit({"change": change, "moved": el.sharding.moved, "t": time.time(),
                  "pid": os.getpid(), "local": el.local_rank})
        shown = len(el.changes)
        before, failed = train_step(el, session, pos, step)
        if args.sleep:
            time.sleep(args.sleep)
        emit({"t": time.time(), "step": step, "failed": failed, "epoch": el.epoch,
              "world": el.world, "rank": el.rank, "local": el.local_rank, "pid": os.getpid(),
              "before": before, "pos": pos.pos, "scheduled": el.scheduler.last_epoch,
              "checkpoints": list(el.checkpoints),
              "resumed_from": el.resumed_from, "copies": el.sharding.copies.last})
    el.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
