"""The Hugging Face Trainer under MalleTrain: a ``TrainerCallback`` and the global-batch rule.

    from malletrain_core.worker import hf as mt

    args = TrainingArguments(..., per_device_train_batch_size=8,
                             gradient_accumulation_steps=mt.accumulation(global_batch=48, per_device=8))
    trainer = Trainer(..., callbacks=[mt.MalleTrainCallback()])
    mt.train(trainer, resume_from_checkpoint=mt.last_checkpoint(args.output_dir))

``mt.train`` is ``trainer.train`` on the restart path; under ``malletrain-run --inplace`` it
rescales in process (:mod:`.hf_inplace`), or, where it cannot (another transformers or torch,
several processes per node), takes the restart path with one line saying why.

The global batch is constant by default: :func:`accumulation` gives the gradient accumulation
steps that make ``per_device × world size × steps`` equal ``global_batch`` at this epoch's world
size (choose a global batch that every world size the job may have divides, e.g. 48 for 1–4
nodes of 1 process with a per-device batch of 4: lcm(1, 2, 3, 4) × 4). The Trainer's sampler
then walks one seeded permutation per data epoch, and on resume it skips ``global_step ×
accumulation`` batches of the new world size: exactly the samples trained before, at any world
size. (Linear learning-rate scaling instead — accumulation 1, ``training.scale_lr`` — changes
the samples per step with the world size; the Trainer then skips by steps, not samples, so a
resume at another world size is not sample-exact.)

:class:`MalleTrainCallback` reports progress to the daemon, asks the Trainer to save
(``control.should_save``) when the period has passed or the daemon asks before a rescale, and
acknowledges the save. :func:`last_checkpoint` is the newest complete ``checkpoint-N`` folder.

Needs ``pip install malletrain[hf]``; the core package never imports transformers.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any

import transformers
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from ..errors import MalleTrainError
from . import byo_inplace, hf_inplace, training
from .elastic import (
    ENV_LOG_EVERY,
    Pacer,
    agree,
    env_number,
    every_s,
    exit_on_sigterm,
    params_digest,
)
from .runid import run_id

_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")

_INPROCESS_WHY = hf_inplace.unsupported(transformers.__version__) \
    if byo_inplace.requested() else "not under malletrain-run --inplace"
if byo_inplace.requested():  # before the Trainer reads torchrun's variables
    if _INPROCESS_WHY:
        byo_inplace.restart_in_place(_INPROCESS_WHY)
    else:
        hf_inplace.hide_layout()


def train(trainer: Any, resume_from_checkpoint: str | None = None, **kwargs: Any) -> Any:
    """``trainer.train(resume_from_checkpoint=...)``, in process under ``malletrain-run
    --inplace`` (:mod:`.hf_inplace`: the process re-forms its group and re-enters ``train`` at
    every membership change)."""
    if _INPROCESS_WHY:
        return trainer.train(resume_from_checkpoint=resume_from_checkpoint, **kwargs)
    callback = next((c for c in trainer.callback_handler.callbacks
                     if isinstance(c, MalleTrainCallback)), None)
    if callback is None:
        raise MalleTrainError("hf.train in process needs MalleTrainCallback among the "
                              "Trainer's callbacks")
    callback.inprocess = hf_inplace.TrainerInProcess(trainer, callback, resume_from_checkpoint)
    return callback.inprocess.run()


def accumulation(global_batch: int, per_device: int, world_size: int | None = None) -> int:
    """Gradient accumulation steps that keep ``global_batch`` at this world size."""
    world = int(os.environ.get("WORLD_SIZE", "1")) if world_size is None else int(world_size)
    per_step = per_device * world
    if global_batch <= 0 or per_device <= 0 or global_batch % per_step:
        raise MalleTrainError(f"a global batch of {global_batch} is not a multiple of "
                              f"{per_device} per device × {world} processes: choose one that "
                              "every world size of the job divides")
    return global_batch // per_step


def last_checkpoint(output_dir: str | os.PathLike[str]) -> str | None:
    """The newest ``checkpoint-N`` folder whose save completed (None when there is none)."""
    root = Path(output_dir)
    if not root.is_dir():
        return None
    done = [(int(m.group(1)), p) for p in root.iterdir()
            if (m := _CHECKPOINT.match(p.name)) and (p / "trainer_state.json").is_file()]
    return str(max(done)[1]) if done else None


class MalleTrainCallback(TrainerCallback):  # type: ignore[misc]
    """Reports progress and saves when due or when the daemon asks."""

    def __init__(self, checkpoint_every_s: float | None = None) -> None:
        self.session = training.Session(checkpoint_every_s=every_s(checkpoint_every_s),
                                        handle_sigterm=False)
        exit_on_sigterm()
        self.log_every = int(env_number(ENV_LOG_EVERY, 0))
        self.pacer = Pacer()
        self.run_id = run_id()
        self.inprocess: hf_inplace.TrainerInProcess | None = None

    @staticmethod
    def global_batch(args: TrainingArguments) -> int:
        return int(args.per_device_train_batch_size * args.world_size
                   * args.gradient_accumulation_steps)

    def _print(self, text: str) -> None:
        if self.log_every > 0:
            print(f"malletrain: {text}", flush=True)

    def on_train_begin(self, args: TrainingArguments, state: TrainerState,
                       control: TrainerControl, **kwargs: Any) -> None:
        if self.inprocess is not None:
            self.inprocess.on_train_begin(state)
            return
        g = self.global_batch(args)
        self.session.samples = float(state.global_step * g)
        model = kwargs.get("model")
        digest = params_digest(model) if model is not None else "-"
        self._print(f"start step={state.global_step} epoch={self.session.epoch} "
                    f"world={args.world_size} rank={args.process_index} "
                    f"resumed={'yes' if state.global_step else 'no'} "
                    f"cursor={state.global_step * g} params={digest} run={self.run_id}")

    def on_step_end(self, args: TrainingArguments, state: TrainerState,
                    control: TrainerControl, **kwargs: Any) -> None:
        if self.inprocess is not None:
            self.inprocess.on_step_end(state, control)
            return
        g = self.global_batch(args)
        self.session.report(samples=float(g))
        step = state.global_step
        if self.log_every > 0 and step % self.log_every == 0:
            losses = [h["loss"] for h in state.log_history if "loss" in h]
            model = kwargs.get("model")
            self._print(f"step={step} epoch={self.session.epoch} world={args.world_size} "
                        f"rank={args.process_index} batch={(step - 1) * g}-{step * g} "
                        f"samples={int(self.session.samples)} "
                        f"loss={losses[-1] if losses else float('nan'):.5f} "
                        f"params={params_digest(model) if model is not None else '-'} "
                        f"run={self.run_id} t={time.time():.3f}")
        self.pacer.wait()
        if agree(self.session.should_checkpoint()):
            control.should_save = True

    def on_epoch_end(self, args: TrainingArguments, state: TrainerState,
                     control: TrainerControl, **kwargs: Any) -> None:
        if self.inprocess is not None:
            self.inprocess.only_rank_zero_saves(control)

    def on_substep_end(self, args: TrainingArguments, state: TrainerState,
                       control: TrainerControl, **kwargs: Any) -> None:
        self.pacer.wait()   # pacing is per micro-batch: the work of a step grows with them

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                **kwargs: Any) -> None:
        if self.session.is_chief:
            self.session.checkpointed(state.global_step)
        g, world = self.global_batch(args), args.world_size
        if self.inprocess is not None:  # the Trainer sees one process
            g, world = self.inprocess.global_batch, self.inprocess.el.world
        self._print(f"checkpoint step={state.global_step} epoch={self.session.epoch} "
                    f"world={world} cursor={state.global_step * g}")
