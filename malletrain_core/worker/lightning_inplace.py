"""In-process rescaling for PyTorch Lightning (the MalleTrain callback and environment under
``malletrain-run --inplace``).

``fit`` runs once and is never left: Lightning is told it trains alone (a world of one process
on a private group, which its DDP keeps: an all-reduce over one process is the identity, and
its own barriers and broadcasts become the identity too), while
:class:`~.byo_inplace.LoopElastic` forms the job's group, re-forms it at step boundaries and
hands the state over in memory, as for a torchrun script:

* at ``on_train_start`` (the model wrapped, the optimizer made, a checkpoint restored) the
  process joins: ready file, first membership, state from a member or from that checkpoint;
* ``on_before_optimizer_step`` (after ``backward``, before clipping) averages the gradients over
  the job's group; a step the new group cannot finish after a lost peer is dropped (every
  gradient cleared, so the optimizer skips every parameter) and its batch trained again (the
  data fetcher fetches no batch ahead in process: one fetched at the old world would hold
  this rank's old share);
* ``on_train_batch_end`` ends the step: the members agree on the newest epoch and on a
  checkpoint (Lightning's own ``save_checkpoint``, written by rank 0 alone), and re-form when
  told; the sampler's global batch follows the world (per-rank batch, as on the restart path).

The rank Lightning reports after joining is the job's (so only rank 0 writes checkpoints);
the world it reports stays one. Tested with Lightning 2.6 on CPU (gloo), one process per node.
"""

from __future__ import annotations

import os
import socket
from typing import Any

from . import byo_inplace, inplace

TESTED_LIGHTNING = ((2, 6),)
live_rank = [0]
"""This process's rank in the job's group (0 until it joined), what the environment reports."""
_port: list[int] = []


def unsupported(version: str) -> str:
    """Why this Lightning (and torch, and layout) cannot rescale in process ("" when it can)."""
    import torch

    why = byo_inplace.unsupported(torch.__version__)
    if why:
        return why
    if os.environ.get("LOCAL_WORLD_SIZE", "1") not in ("", "1"):
        return "Lightning rescales in process with one process per node only"
    try:
        major, minor = (int(p) for p in version.split(".")[:2])
    except ValueError:
        return f"Lightning {version!r} is not a version this MalleTrain can read"
    if (major, minor) not in TESTED_LIGHTNING:
        tested = ", ".join(f"{a}.{b}" for a, b in TESTED_LIGHTNING)
        return f"Lightning {major}.{minor} is not one this MalleTrain was tested with ({tested})"
    return ""


def private_port() -> int:
    """A free local port for Lightning's one-process group (chosen once)."""
    if not _port:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            _port.append(s.getsockname()[1])
    return _port[0]


def _alone(strategy: Any) -> None:
    """Lightning's collectives as in a world of one (it never reaches the job's group)."""
    strategy.barrier = lambda *a, **k: None
    strategy.broadcast = lambda obj, *a, **k: obj
    strategy.reduce = lambda tensor, *a, **k: tensor
    strategy.all_gather = lambda tensor, *a, **k: tensor
    strategy.reduce_boolean_decision = lambda decision, *a, **k: decision


class FitInProcess:
    """One ``fit``'s in-process run (see the module doc); made at ``on_train_start``."""

    def __init__(self, callback: Any, trainer: Any, pl_module: Any, step: int,
                 from_disk: bool) -> None:
        import torch.distributed as dist

        if len(trainer.optimizers) != 1:
            raise SystemExit("malletrain: Lightning in process needs exactly one optimizer "
                             f"(configure_optimizers gave {len(trainer.optimizers)})")
        self.callback, self.trainer = callback, trainer
        _alone(trainer.strategy)
        # Lightning fetches a batch ahead by default: it would be this rank's share at the
        # old world after a re-form, and a dropped step's batch could not be trained again
        fetcher = getattr(trainer.fit_loop, "_data_fetcher", None)
        if fetcher is None or not hasattr(fetcher, "prefetch_batches"):
            raise SystemExit("malletrain: this Lightning has no fit_loop._data_fetcher."
                             "prefetch_batches; set MALLETRAIN_INPROCESS=0 (restart path)")
        fetcher.prefetch_batches = 0
        if dist.is_initialized():
            inplace._forget_default_group()  # kept by Lightning's DDP, never shut down
        configs = trainer.lr_scheduler_configs
        self.host = byo_inplace.LoopHost(callback, callback.sampler, trainer.optimizers[0],
                                         configs[0].scheduler if configs else None, step)
        backend = "nccl" if pl_module.device.type == "cuda" else "gloo"
        self.el = byo_inplace.LoopElastic(self.host, pl_module, backend,  # type: ignore[arg-type]
                                          patch_optimizer=False)
        self.el.step, self.el.has_state = step, step > 0
        if from_disk:
            self.el.resumed = "yes"
        self.el.start()
        live_rank[0] = self.el.rank

    def before_optimizer_step(self, pl_module: Any) -> None:
        self.el.average_once()
        if self.el._step_failed:  # dropped: no parameter has a gradient, none is updated
            for p in pl_module.parameters():
                p.grad = None

    def train_batch_end(self, loss: float | None) -> None:
        self.host.save_due = False
        self.el.after_step(loss, None)
        live_rank[0] = self.el.rank
        if self.host.save_due and self.el.rank == 0:
            self.callback.save(self.trainer, quiet=True)
