"""A training process that rescales in place (driven by tests/test_inplace.py).

Prints one JSON line per step: time, global step, epoch, world, rank, local rank (several
processes per node share a log), state digest, learning rate, sampler position, live threads
and open file descriptors.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import fcntl
import json
import os
import signal
import sys
import threading
import time

import torch
from torch import nn

from malletrain_core.worker import inplace, training


def emit(record: dict) -> None:
    """One JSON line in one write: the N processes of a node share their task's output file
    (opened for appending, see main), so a line is never cut by another process's."""
    os.write(sys.stdout.fileno(), (json.dumps(record) + "\n").encode())


class Position:
    """A sampler's position (samples consumed), handed over with the model."""

    def __init__(self) -> None:
        self.pos = 0

    def state_dict(self) -> dict[str, int]:
        return {"pos": self.pos}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.pos = int(state["pos"])


def rss_kb() -> int:
    with open("/proc/self/status") as f:
        return next(int(ln.split()[1]) for ln in f if ln.startswith("VmRSS:"))


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=0)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--sleep", type=float, default=0.0)
    p.add_argument("--digest-every", type=int, default=1)
    p.add_argument("--checkpoint-every-s", type=float, default=300.0)
    p.add_argument("--no-ddp", action="store_true",
                   help="no DDP: Elastic.average_gradients() after backward()")
    p.add_argument("--compute-s", type=float, default=0.0,
                   help="a wait inside the step, before its all-reduce")
    p.add_argument("--batchnorm", action="store_true",
                   help="a BatchNorm layer: running statistics that each rank's batch moves")
    args = p.parse_args()
    with contextlib.suppress(OSError):  # each write at the end, whoever else writes there
        fcntl.fcntl(1, fcntl.F_SETFL, fcntl.fcntl(1, fcntl.F_GETFL) | os.O_APPEND)
    torch.set_num_threads(1)
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    session = training.Session(handle_sigterm=False, checkpoint_every_s=args.checkpoint_every_s)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), *([nn.BatchNorm1d(64)] if args.batchnorm else []),
                          nn.ReLU(), nn.Linear(64, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1000, gamma=0.5)
    pos = Position()
    el = inplace.Elastic(session, model, opt, scheduler=sched, extra={"sampler": pos},
                         lr_for=lambda world: 0.01 * world, collective_timeout_s=20,
                         ddp=not args.no_ddp)
    shown = saved = 0
    for step in el.steps(args.steps):
        for change in el.changes[shown:]:
            emit({"change": change, "t": time.time(), "pid": os.getpid(),
                  "local": el.local_rank, "resumed_from": el.resumed_from})
        shown = len(el.changes)
        for ckpt in el.checkpoints[saved:]:
            emit({"checkpoint": ckpt, "t": time.time()})
        saved = len(el.checkpoints)
        with el.guard():
            if args.compute_s:
                time.sleep(args.compute_s)
            g = torch.Generator().manual_seed(step * 1009 + el.rank)
            x, y = torch.randn(args.batch, 32, generator=g), torch.randint(0, 4, (args.batch,),
                                                                         generator=g)
            loss = nn.functional.cross_entropy(el.net(x), y)
            opt.zero_grad()
            loss.backward()
            if args.no_ddp:
                el.average_gradients()
            opt.step()
            pos.pos += args.batch * el.world
        session.report(samples=0 if el._step_failed else args.batch * el.world)
        if args.sleep:
            time.sleep(args.sleep)
        done = el.step + (0 if el._step_failed else 1)
        rec = {"t": time.time(), "step": done, "failed": el._step_failed, "epoch": el.epoch,
               "world": el.world, "rank": el.rank, "local": el.local_rank,
               "lr": opt.param_groups[0]["lr"],
               "pos": pos.pos, "threads": threading.active_count(),
               "fds": len(os.listdir("/proc/self/fd")), "pid": os.getpid(),
               "rss_kb": rss_kb(), "retired": len(el.retired),
               "retire_errors": sum(1 for r in el.retired if r["error"])}
        if done % args.digest_every == 0 and not el._step_failed:
            st = el.state()
            st["step"] = done
            rec["digest"] = inplace.digest(st)[:16]
        emit(rec)
    el.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
