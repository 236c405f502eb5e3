"""The few lines a plain torchrun DDP script adds to train elastically under MalleTrain.

    from malletrain_core.worker import elastic

    sampler = elastic.ElasticSampler(dataset, batch_size=args.batch_size)
    loader = DataLoader(dataset, batch_sampler=sampler)       # instead of DistributedSampler
    run = elastic.Run(ddp_model, optimizer, sampler=sampler)  # resumes at this world size
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            ...one optimiser step...
            run.step()          # progress report; checkpoint when due or when the daemon asks

Checkpoints go through ``torch.distributed.checkpoint`` (:mod:`.checkpoint`) into
``$MALLETRAIN_CHECKPOINT_DIR/dcp``, every ``$MALLETRAIN_CHECKPOINT_EVERY_S`` seconds (default
300) and before each planned rescale; the decision is rank 0's and every rank takes it at the
same step. Outside MalleTrain the same script runs as before (checkpoints in ``checkpoints/``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from .. import training
from . import checkpoint
from .runid import run_id
from .sampler import ElasticSampler

__all__ = ["ElasticSampler", "Run", "run_id"]

ENV_EVERY_S = "MALLETRAIN_CHECKPOINT_EVERY_S"


def _every_s(value: float | None) -> float:
    if value is not None:
        return float(value)
    text = os.environ.get(ENV_EVERY_S, "").strip()
    try:
        return float(text) if text else 300.0
    except ValueError:
        raise ValueError(f"{ENV_EVERY_S}={text!r} is not a number of seconds") from None


class Run:
    """One worker's elastic training state: resume on creation, :meth:`step` after each step.

    ``resume=True`` loads the newest checkpoint at once (every rank: call it after
    ``init_process_group``); :attr:`step` is then the step to continue from and
    :attr:`resumed` the folder loaded (None for a fresh start).
    """

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None,
                 scheduler: Any = None, sampler: ElasticSampler | None = None,
                 checkpoint_every_s: float | None = None, resume: bool = True,
                 extra: Mapping[str, Any] | None = None,
                 session: training.Session | None = None) -> None:
        self.session = session or training.Session(checkpoint_every_s=_every_s(checkpoint_every_s))
        self.sampler = sampler
        self.app = checkpoint.AppState(model, optimizer, scheduler, sampler, extra=extra)
        self.directory = Path(self.session.checkpoint_dir) / "dcp"
        self.resumed: Path | None = None
        self.checkpoints = 0
        if resume:
            self.resume()

    @property
    def step_count(self) -> int:
        return self.app.step

    @property
    def extra(self) -> dict[str, Any]:
        return self.app.extra

    def resume(self) -> int:
        """Load the newest checkpoint (if any); returns the step to continue from."""
        self.resumed = checkpoint.load(self.app, self.directory)
        if self.resumed is not None:
            self.session.samples = float(self.app.extra.get("malletrain_samples", 0.0))
        return self.app.step

    def _due(self) -> bool:
        want = self.session.should_checkpoint()
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            flag = torch.tensor([1 if want else 0], dtype=torch.int32)
            dist.broadcast(flag, src=0)
            return bool(flag.item())
        return want

    def step(self, samples: float | None = None) -> bool:
        """One optimiser step is done: count it, report progress, checkpoint when due.
        ``samples`` (global, this step) defaults to the sampler's batch. Returns True when it
        checkpointed."""
        self.app.step += 1
        trained = self.sampler.mark_trained() if self.sampler is not None else 0
        self.session.report(samples=float(trained if samples is None else samples))
        if self._due():
            self.checkpoint()
            return True
        return False

    def checkpoint(self) -> Path:
        """Checkpoint now (every rank must call it at the same step)."""
        self.app.extra["malletrain_samples"] = self.session.samples
        path = checkpoint.save(self.app, self.directory, tag=f"e{self.session.epoch}")
        self.checkpoints += 1
        if self.session.is_chief:
            self.session.checkpointed(self.app.step)
        return path
