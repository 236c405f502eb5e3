"""In-process rescaling for the Hugging Face Trainer (``hf.train(trainer)`` under
``malletrain-run --inplace``).

The Trainer runs as if alone (one process, no DDP, its own sampler replaced): the job's group
is :class:`~.byo_inplace.LoopElastic`'s, which re-forms it and hands the state over in memory,
exactly as for a torchrun script. What it takes over from the Trainer:

* the data: one endless stream of seeded permutations (:class:`StreamSampler`), each optimiser
  step the next global batch of ``global_batch`` positions, this rank's contiguous share of it
  split into the Trainer's micro-batches (``global_batch = per device × world × accumulation``
  at every world size, as on the restart path);
* the gradients: averaged over the group before the Trainer clips them (its
  ``_clip_grad_norm``) or, without clipping, in the optimizer's step; a step the new group
  cannot finish after a lost peer is dropped (no update, not counted, its batch trained again;
  the Trainer still steps its scheduler after it, which the step boundary undoes);
* the step boundary (the callback's ``on_step_end``): the members agree on the newest epoch and
  on a checkpoint; a checkpoint is the Trainer's own ``checkpoint-N``, saved by rank 0 alone;
  after a re-form the Trainer's ``train`` is left and re-entered with the accumulation for the
  new world, at the same global step, with its optimizer and scheduler kept.

The job's first epoch loads the newest ``checkpoint-N`` (if any) before joining; the Trainer
then never fast-forwards its data (``ignore_data_skip``): the stream's position is the global
step × the global batch. Tested with transformers 5.23 on CPU (gloo), with one and with two
processes per node (each a Trainer alone; on a GPU node each keeps its own GPU: :func:`own_gpu`,
not yet run on a GPU).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from . import byo_inplace, inplace
from .sampler import ElasticSampler

TESTED_TRANSFORMERS = ((5, 23),)
LAYOUT = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
_stashed: dict[str, str] = {}


def unsupported(version: str) -> str:
    """Why this transformers (and this torch) cannot rescale in process ("" when it can)."""
    import torch

    why = byo_inplace.unsupported(torch.__version__)
    if why:
        return why
    try:
        major, minor = (int(p) for p in version.split(".")[:2])
    except ValueError:
        return f"transformers {version!r} is not a version this MalleTrain can read"
    if (major, minor) not in TESTED_TRANSFORMERS:
        tested = ", ".join(f"{a}.{b}" for a, b in TESTED_TRANSFORMERS)
        return (f"transformers {major}.{minor} is not one this MalleTrain was tested with "
                f"({tested})")
    return ""


def hide_layout() -> None:
    """Keep the Trainer single-process: it must not see the first epoch's ``RANK`` and
    ``WORLD_SIZE`` (the launcher's), which :func:`train` gives back to the job's group.
    With several processes on a node, each keeps its own GPU (:func:`own_gpu`) first."""
    visible = own_gpu(os.environ, _nvidia_gpus())
    if visible is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = visible
    for name in LAYOUT:
        if name in os.environ:
            _stashed[name] = os.environ.pop(name)


def _nvidia_gpus() -> int:
    """The node's NVIDIA GPUs, counted without starting CUDA (whose device list is fixed at
    its first use, so ``CUDA_VISIBLE_DEVICES`` must be set before)."""
    try:
        return len(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        return 0


def own_gpu(env: Mapping[str, str], gpus: int) -> str | None:
    """The ``CUDA_VISIBLE_DEVICES`` that leaves this process only its own GPU, when several
    processes share a node (``LOCAL_WORLD_SIZE`` > 1); None to leave it as it is.

    A Trainer that sees several GPUs in one process spreads each batch over all of them
    (``DataParallel``), so every process of the node would use every GPU. The process of local
    rank *i* keeps the *i*-th GPU the node left visible (all of them when unset), as
    ``--device auto`` does for the other scripts; with fewer GPUs than processes they are
    shared in turn (rank *i* keeps GPU *i* mod their number)."""
    local_rank, local_world = inplace.local_layout(env)
    if local_world <= 1:
        return None
    given = env.get("CUDA_VISIBLE_DEVICES")
    devices = ([d.strip() for d in given.split(",") if d.strip()] if given is not None
               else [str(i) for i in range(gpus)])
    return devices[local_rank % len(devices)] if devices else None


class StreamSampler(ElasticSampler):
    """:class:`~.sampler.ElasticSampler` as one endless stream for the Trainer: each iteration
    starts at the last step boundary (a micro-batch the data loader fetched ahead is handed
    out again), and the Trainer's epochs are only a length (one data epoch of batches)."""

    def __init__(self, num_samples: int, global_batch: int, seed: int) -> None:
        super().__init__(num_samples, global_batch=global_batch, world_size=1, rank=0,
                         seed=seed)
        self.boundary = 0

    @property
    def saved_cursor(self) -> int:  # type: ignore[override]
        return self.boundary

    def set_epoch(self, epoch: int) -> None:
        """The Trainer's epochs restart at 0 at every ``train``: the stream ignores them."""

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.boundary = self.cursor

    def __iter__(self) -> Any:  # type: ignore[override]
        self.cursor = self.boundary
        while True:
            lo, hi = self.rank_batch(self.cursor)
            self.cursor += self.global_batch
            yield from self.indices(lo, hi)

    def __len__(self) -> int:
        lo, hi = self.rank_batch(0)
        return math.ceil(self.num_samples / self.global_batch) * (hi - lo)


def _innermost(optimizer: Any) -> Any:
    while hasattr(optimizer, "optimizer"):
        optimizer = optimizer.optimizer
    return optimizer


class TrainerInProcess:
    """One Trainer's in-process run (see the module doc); made by :func:`train`."""

    def __init__(self, trainer: Any, callback: Any, resume_from: str | None) -> None:
        args = trainer.args
        self.trainer = trainer
        self.per_device = int(args.per_device_train_batch_size)
        self.global_batch = self.per_device * int(args.gradient_accumulation_steps)
        self.sampler = StreamSampler(len(trainer.train_dataset), self.global_batch, args.seed)
        trainer._get_train_sampler = lambda *a, **k: self.sampler
        args.ignore_data_skip = True
        steps = args.max_steps if args.max_steps > 0 else math.ceil(
            math.ceil(len(trainer.train_dataset) / self.global_batch) * args.num_train_epochs)
        trainer.create_optimizer_and_scheduler(num_training_steps=steps)
        trainer._created_lr_scheduler = False  # kept by every train(), as a user's would be
        step = self._load(resume_from) if resume_from else 0
        self.sampler.boundary = step * self.global_batch
        callback.session.samples = float(step * self.global_batch)
        os.environ.update(_stashed)
        self.host = byo_inplace.LoopHost(callback, self.sampler, _innermost(trainer.optimizer),
                                         trainer.lr_scheduler, step)
        clip = trainer._clip_grad_norm

        def averaged_clip(model: Any) -> Any:
            self.el.average_once()
            return clip(model)

        trainer._clip_grad_norm = averaged_clip
        self.el = byo_inplace.LoopElastic(self.host, trainer.model, "gloo")  # type: ignore[arg-type]
        self.el.step, self.el.has_state = step, step > 0
        if resume_from:
            self.el.resumed = "yes"
        self.changed = False
        self._epoch_in_train: int | None = None
        self.el.start()

    def _load(self, path: str) -> int:
        """The newest ``checkpoint-N`` into the model, optimizer and scheduler; its step."""
        self.trainer._load_from_checkpoint(path)
        self.trainer._load_optimizer_and_scheduler(path)
        state = json.loads((Path(path) / "trainer_state.json").read_text())
        return int(state.get("global_step", 0))

    def accumulation(self) -> int:
        per_step = self.per_device * self.el.world
        if self.global_batch % per_step:
            raise SystemExit(f"malletrain: a global batch of {self.global_batch} is not a "
                             f"multiple of {self.per_device} per device × {self.el.world} "
                             "processes: choose one that every world size of the job divides")
        return self.global_batch // per_step

    def run(self) -> Any:
        """``train`` until it ends by itself, re-entered after every re-form."""
        while True:
            self.trainer.args.gradient_accumulation_steps = self.accumulation()
            self.sampler.rank, self.sampler.world_size = self.el.rank, self.el.world
            self.changed = False
            result = self.trainer.train()
            if not self.changed:
                return result

    def only_rank_zero_saves(self, control: Any, due: bool = False) -> None:
        """Every process's Trainer thinks it is rank 0 of 1 (its own ``save_steps``, a save at
        an epoch's end): only the job's rank 0 writes ``checkpoint-N``, each other rank would
        write the same folder at once."""
        control.should_save = self.el.rank == 0 and (control.should_save or due)

    # ----- from the callback ----------------------------------------------------------
    def on_train_begin(self, state: Any) -> None:
        state.global_step = self.el.step
        self._epoch_in_train = self.el.epoch

    def on_step_end(self, state: Any, control: Any) -> None:
        el = self.el
        if not el._step_failed:  # a dropped step: the Trainer counted it, el.step does not
            first = self.sampler.boundary
            self.sampler.boundary = first + self.global_batch
            if el.cursor is not None:
                el.cursor.boundary = self.sampler.boundary
            self.host.session.report(samples=float(self.global_batch))
            if self.host.log_every > 0 and state.global_step % self.host.log_every == 0:
                losses = [h["loss"] for h in state.log_history if "loss" in h]
                self.host._log(
                    f"step={state.global_step} epoch={el.epoch} world={el.world} "
                    f"rank={el.rank} batch={first}-{self.sampler.boundary} "
                    f"samples={int(self.host.session.samples)} "
                    f"loss={losses[-1] if losses else float('nan'):.5f} "
                    f"params={byo_inplace._params(el.model)} run={self.host.run_id} "
                    f"t={time.time():.3f}")
        self.host.pacer.wait()
        self.host.save_due = False
        el.after_boundary()
        state.global_step = el.step
        self.only_rank_zero_saves(control, due=self.host.save_due)
        if el.epoch != self._epoch_in_train:  # re-formed: train again at the new world
            self.changed = True
            control.should_training_stop = True
