"""A sharded elastic training script for MalleTrain: a small transformer language model
(about 14 M parameters) sharded with FSDP2, or HSDP by ``--mode hsdp``, on random tokens.

Written on ``sharded.Elastic``: the script gives how to build the model on a mesh (its usual
``fully_shard`` calls) and its optimizer, instead of the model, since a sharded model exists
only on a group's mesh and is built again on every new one. Started by
``malletrain-run --inplace`` (``--nproc-per-node N`` for several processes per node) the
processes stay alive across epochs and the shards move in memory: ``--mode hsdp`` (a node's
processes shard among themselves, nodes are replicas: a joining node heals from a surviving
one, a lost node costs nothing) or ``--mode fsdp`` (the shard count follows the world: a grow
or a planned shrink re-shards in memory, a node lost without warning reads the last
checkpoint). Started by ``malletrain-run`` (one ``torchrun`` per epoch) it resumes from the
last DCP checkpoint at whatever world the epoch has. Without MalleTrain it runs as a plain
one-process training:

    python train_sharded.py --steps 20

Each logged step prints one line, e.g.
``step=10 epoch=1 world=4 rank=0 samples=1280 loss=8.3012 t=1796543210.123 copies=None``
(``t``: the wall-clock time, which bench/sharded.py times the changes by).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import torch
from torch import nn

from malletrain_core.worker import sharded, training


class TinyLM(nn.Module):
    """A decoder-only transformer: token and position embeddings, pre-norm blocks under a
    causal mask, and an output head."""

    def __init__(self, vocab: int, dim: int, layers: int, heads: int, seq: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(seq, dim)
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.0, batch_first=True,
                                       norm_first=True) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        n = tokens.shape[1]
        x = self.embed(tokens) + self.pos(torch.arange(n, device=tokens.device))
        mask = nn.Transformer.generate_square_subsequent_mask(n, device=tokens.device)
        for block in self.blocks:
            x = block(x, src_mask=mask, is_causal=True)
        return self.head(self.norm(x))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", choices=(sharded.FSDP, sharded.HSDP), default=sharded.HSDP,
                   help="hsdp: shards within a node, nodes as replicas; fsdp: shards across "
                        "the whole job")
    p.add_argument("--steps", type=int, default=1000, help="train until this step (0: forever)")
    p.add_argument("--batch", type=int, default=8, help="sequences per process and step")
    p.add_argument("--seq", type=int, default=64, help="tokens per sequence")
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--dim", type=int, default=384)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--heads", type=int, default=6)
    p.add_argument("--lr", type=float, default=3e-4, help="learning rate at --reference-batch")
    p.add_argument("--reference-batch", type=int, default=8,
                   help="global batch at which --lr applies (linear scaling rule)")
    p.add_argument("--checkpoint-every-s", type=float, default=300.0)
    p.add_argument("--buddy-every", type=int, default=sharded.BUDDY_EVERY,
                   help="fsdp: steps between refreshes of the buddy copies, what a lost node "
                        "costs at most (0: none, a lost node reads the last checkpoint)")
    p.add_argument("--log-every", type=int, default=10, help="print every N steps")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    session = training.Session(checkpoint_every_s=args.checkpoint_every_s)

    def build(mesh: Any) -> nn.Module:
        """The model on ``mesh``: each block its own FSDP unit, then the root."""
        from torch.distributed.fsdp import fully_shard

        model = TinyLM(args.vocab, args.dim, args.layers, args.heads, args.seq)
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        return fully_shard(model, mesh=mesh)

    el = sharded.Elastic(
        session, build, lambda model: torch.optim.AdamW(model.parameters(), lr=args.lr),
        mode=args.mode, seed=args.seed, buddy_every=args.buddy_every,
        lr_for=lambda world: training.scale_lr(args.lr, global_batch=args.batch * world,
                                               reference_batch=args.reference_batch))
    loss_fn = nn.CrossEntropyLoss()
    shown: object = ""
    for step in el.steps(args.steps):
        if el.epoch != shown:  # a new epoch (a restart, or a change in place)
            shown = el.epoch
            params = sum(p.numel() for p in el.model.parameters())
            print(f"start step={step} epoch={session.epoch} world={el.world} rank={el.rank} "
                  f"mode={args.mode} params={params} reform_s="
                  f"{el.changes[-1]['reform_s'] if el.changes else 0} t={time.time():.3f} "
                  f"moved={el.sharding.moved}",
                  flush=True)
        with el.guard():  # a step failed by a lost peer is dropped and run again
            # every rank its own sequences, reproducible (random tokens: a stand-in corpus)
            g = torch.Generator().manual_seed(args.seed * 1_000_003 + step * 1009 + el.rank)
            tokens = torch.randint(0, args.vocab, (args.batch, args.seq + 1), generator=g)
            logits = el.model(tokens[:, :-1])
            loss = loss_fn(logits.reshape(-1, args.vocab), tokens[:, 1:].reshape(-1))
            el.optimizer.zero_grad()
            loss.backward()
            el.optimizer.step()
            session.report(samples=args.batch * el.world)
            if (step + 1) % args.log_every == 0:
                print(f"step={step + 1} epoch={session.epoch} world={el.world} rank={el.rank} "
                      f"samples={int(session.samples)} loss={loss.item():.4f} "
                      f"t={time.time():.3f} copies={el.sharding.copies.last}", flush=True)
    el.save()  # the last checkpoint (DCP, every rank); periodic ones are Elastic's
    print(f"done step={el.step} world={el.world} rank={el.rank}", flush=True)
    el.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
