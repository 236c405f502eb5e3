"""One phase of an elastic run for tests/test_worker_dcp.py: a rank of a gloo DDP job.

Trains a small regression with the global-cursor sampler and DCP checkpoints: ``--kept``
steps, a checkpoint, then ``--lost`` steps that no checkpoint keeps (the phase ends as a
preempted epoch would). Each line of ``--out`` (one file per rank) is JSON: the state digest
on start, then per step the indices this rank trained and the digest after the step.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from malletrain_core.worker.elastic import Run
from malletrain_core.worker.sampler import ElasticBatchSampler

N, GLOBAL_BATCH = 53, 7


def dataset() -> TensorDataset:
    g = torch.Generator().manual_seed(11)
    x = torch.randn(N, 4, generator=g)
    y = x @ torch.tensor([[1.5], [-2.0], [0.5], [3.0]]) + 0.01 * torch.randn(N, 1, generator=g)
    return TensorDataset(torch.arange(N), x, y)


def state_digest(model: nn.Module, opt: torch.optim.Optimizer, sched: object,
                 sampler: ElasticBatchSampler, step: int) -> str:
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().numpy().tobytes())
        buf = opt.state.get(p, {}).get("momentum_buffer")
        if buf is not None:
            h.update(buf.numpy().tobytes())
    h.update(json.dumps([sched.state_dict()["last_epoch"], opt.param_groups[0]["lr"],  # type: ignore[attr-defined]
                         sampler.state_dict(), step]).encode())
    return h.hexdigest()[:16]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--kept", type=int, required=True)
    p.add_argument("--lost", type=int, default=0)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    world = int(os.environ["WORLD_SIZE"])
    if world > 1:
        dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    net = nn.parallel.DistributedDataParallel(model) if world > 1 else model
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.9)
    data = dataset()
    sampler = ElasticBatchSampler(data, global_batch=GLOBAL_BATCH, seed=3)
    loader = DataLoader(data, batch_sampler=sampler)
    run = Run(net, opt, sched, sampler=sampler, checkpoint_every_s=1e9)
    out = open(args.out, "a")

    def record(**row: object) -> None:
        row["digest"] = state_digest(model, opt, sched, sampler, run.step_count)
        out.write(json.dumps(row) + "\n")
        out.flush()

    record(kind="start", step=run.step_count, resumed=run.resumed is not None, world=world)
    done, end = 0, args.kept + args.lost
    epoch = 0
    while done < end:
        sampler.set_epoch(epoch)
        for idx, x, y in loader:
            loss = nn.functional.mse_loss(net(x), y) * sampler.loss_weight
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            run.step()
            done += 1
            record(kind="step", step=run.step_count, idx=idx.tolist(),
                   first=sampler.last_batch[0], loss=loss.item() / sampler.loss_weight)
            if done == args.kept:
                run.checkpoint()
                record(kind="checkpoint", step=run.step_count)
            if done == end:
                break
        epoch += 1
    record(kind="end", step=run.step_count,
           params=[p.detach().flatten().tolist() for p in model.parameters()])
    out.close()
    if world > 1:
        # Drop DDP first: torch 2.13 can deadlock when the DDP reducer holds the last
        # reference to a gloo group (its destructor joins a thread that waits for the GIL).
        # Drop the model and optimizer too: the reducer's autograd hooks on the parameters keep
        # it, and so the group and its worker threads, alive past destroy_process_group(); a
        # worker thread that then frees its last all-reduce while the interpreter finalizes
        # needs the GIL and ends the process with SIGABRT ("terminate called without an
        # active exception": seen in gdb on a core, one world-3 phase in seven beside a busy
        # loop). Collected here, the group's destructor joins its threads while Python lives.
        del net, run, model, opt, sched, loader, sampler
        gc.collect()
        dist.destroy_process_group()
        gc.collect()


if __name__ == "__main__":
    main()
