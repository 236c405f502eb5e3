"""An elastic training script for MalleTrain: a small CNN on random 32×32 images.

Written on ``inplace.Elastic``, so one script serves both paths: started by
``malletrain-run --inplace`` the process stays alive across epochs and re-forms its group in
place (joiners get the state from a member); started by ``malletrain-run`` (one ``torchrun``
per epoch) it resumes from the last checkpoint at whatever world size the epoch has. Elastic
wraps DDP, applies the learning-rate rule (linear in the global batch) on every change, and
checkpoints periodically and when the daemon asks. ``--device auto`` (the default) trains on
the GPU with NCCL when the process sees one, else on the CPU with gloo; ``--device cpu|cuda``
forces either. Without MalleTrain it runs as a plain one-process training:

    python train_elastic.py --steps 100

Each step prints one line, e.g.
``step=12 epoch=1 world=2 rank=0 samples=384 loss=2.3012 params=3f9a0c1d2e4b``, where
``params`` is a digest of the model's parameters (equal on every rank of an epoch).
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time

import torch
from torch import nn

from malletrain_core.worker import inplace, training


def build_model() -> nn.Module:
    """A small CNN for 3×32×32 inputs and 10 classes."""
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        nn.Flatten(), nn.Linear(16, 10))


def digest(model: nn.Module) -> str:
    """A short digest of every parameter's bytes: identical models give identical digests."""
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:12]


def batch(seed: int, step: int, rank: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random images and labels, different on every rank and step, reproducible."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step * 1009 + rank)
    return torch.randn(size, 3, 32, 32, generator=g), torch.randint(0, 10, (size,), generator=g)


def pick_device(name: str) -> torch.device:
    """``--device``: ``auto`` is the GPU when this process sees one, else the CPU; a GPU is
    bound the way ``Elastic(backend="nccl")`` binds it (one per process: the only one
    CUDA_VISIBLE_DEVICES leaves, else LOCAL_RANK's). Exits with one line when ``cuda`` is
    asked for and no GPU is visible."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cpu":
        return torch.device("cpu")
    if torch.cuda.device_count() < 1:
        raise SystemExit("--device cuda: this process sees no GPU (CUDA_VISIBLE_DEVICES, the "
                         "node's driver); use --device auto or cpu")
    try:
        return torch.device("cuda", inplace.bind_device())
    except RuntimeError as exc:
        raise SystemExit(f"--device {name}: {exc}") from None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=1000, help="train until this step (0: forever)")
    p.add_argument("--batch", type=int, default=32, help="samples per worker and step")
    p.add_argument("--lr", type=float, default=0.01, help="learning rate at --reference-batch")
    p.add_argument("--reference-batch", type=int, default=32,
                   help="global batch at which --lr applies (linear scaling rule)")
    p.add_argument("--checkpoint-every-s", type=float, default=300.0)
    p.add_argument("--step-sleep-s", type=float, default=0.0,
                   help="pause after each step (demos on a busy machine)")
    p.add_argument("--log-every", type=int, default=10, help="print every N steps")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="auto: the GPU with NCCL when one is visible, else the CPU with gloo")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = pick_device(args.device)
    session = training.Session(checkpoint_every_s=args.checkpoint_every_s)
    torch.manual_seed(args.seed)
    model = build_model().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    el = inplace.Elastic(session, model, optimizer, lr_for=lambda world: training.scale_lr(
        args.lr, global_batch=args.batch * world, reference_batch=args.reference_batch),
        on_save=lambda step: print(f"checkpoint step={step} epoch={session.epoch} "
                                   f"world={session.world_size}", flush=True),
        backend="nccl" if device.type == "cuda" else "gloo")
    loss_fn = nn.CrossEntropyLoss()
    shown: object = ""
    for step in el.steps(args.steps):
        if el.epoch != shown:  # a new epoch (a restart, or a change in place)
            shown = el.epoch
            print(f"start step={step} epoch={session.epoch} world={el.world} rank={el.rank} "
                  f"lr={optimizer.param_groups[0]['lr']:g} resumed="
                  f"{'yes' if el.resumed_from is not None else 'no'} params={digest(model)}",
                  flush=True)
        with el.guard():  # a step failed by a lost peer is dropped and run again
            x, y = batch(args.seed, step, el.rank, args.batch)  # made on the CPU: reproducible
            loss = loss_fn(el.net(x.to(device)), y.to(device))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            session.report(samples=args.batch * el.world)
            if (step + 1) % args.log_every == 0:
                print(f"step={step + 1} epoch={session.epoch} world={el.world} rank={el.rank} "
                      f"samples={int(session.samples)} loss={loss.item():.4f} "
                      f"params={digest(model)}", flush=True)
        if args.step_sleep_s > 0:
            time.sleep(args.step_sleep_s)
    el.save()  # the last checkpoint (rank 0); periodic ones and the daemon's are Elastic's
    print(f"done step={el.step} world={el.world} rank={el.rank}", flush=True)
    el.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
