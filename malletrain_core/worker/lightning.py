"""PyTorch Lightning under MalleTrain: a cluster environment and a callback.

    from malletrain_core.worker import lightning as mt

    trainer = L.Trainer(..., plugins=[mt.MalleTrainEnvironment()], callbacks=[mt.MalleTrainCallback()])
    trainer.fit(model, train_loader, ckpt_path=mt.last_checkpoint())

* :class:`MalleTrainEnvironment` takes the world size and ranks of the epoch from the launcher
  (torchrun's variables) whatever ``num_nodes`` the Trainer was given, and keeps Lightning
  from taking the Slurm environment (no SIGUSR1 handler, no ``scontrol requeue``: the daemon
  owns preemption).
* :class:`MalleTrainCallback` gives the strategy the epoch's node count, replaces the
  training loader's sampler by the global-cursor :class:`~.sampler.ElasticSampler` (same
  per-rank batch and shuffling; its cursor is saved in the checkpoint), reports progress, and
  saves a checkpoint (``trainer.save_checkpoint``, every rank) when the period has passed or
  the daemon asks; ``latest`` then names it.
* :func:`last_checkpoint` is the checkpoint to resume from (None at the first start); Lightning
  loads it at the current world size.
* Under ``malletrain-run --inplace`` both rescale in process (:mod:`.lightning_inplace`), or,
  where they cannot, take the restart path with one line saying why.

Needs ``pip install malletrain[lightning]``; the core package never imports Lightning.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.fabric.plugins.environments import TorchElasticEnvironment
from torch.utils.data import DataLoader, DistributedSampler, SequentialSampler

from . import byo_inplace, checkpoint, lightning_inplace, training
from .elastic import (
    ENV_LOG_EVERY,
    Pacer,
    env_number,
    every_s,
    exit_on_sigterm,
    params_digest,
)
from .runid import run_id
from .sampler import ElasticSampler
from .startup import defer_dynamo

SUBDIR = "lightning"

INPROCESS = byo_inplace.requested() and not lightning_inplace.unsupported(pl.__version__)
"""Under ``malletrain-run --inplace``, rescaled in process (:mod:`.lightning_inplace`)."""
if byo_inplace.requested() and not INPROCESS:  # before Lightning reads torchrun's variables
    byo_inplace.restart_in_place(lightning_inplace.unsupported(pl.__version__))


def checkpoint_dir() -> Path:
    return Path(os.environ.get(training.ENV_CHECKPOINT_DIR, "checkpoints")) / SUBDIR


def last_checkpoint() -> str | None:
    """The checkpoint file ``latest`` names (None when there is none yet)."""
    root = checkpoint_dir()
    try:
        name = (root / checkpoint.LATEST).read_text().strip()
    except OSError:
        return None
    path = root / name
    return str(path) if name and "/" not in name and path.is_file() else None


class _LightningSampler(ElasticSampler, DistributedSampler):  # type: ignore[misc]
    """The global-cursor sampler, marked as distributed so Lightning keeps it as it is."""

    def __init__(self, dataset: Any, batch_size: int, shuffle: bool) -> None:
        alone = {"world_size": 1, "rank": 0} if INPROCESS else {}  # the job's group sets them
        ElasticSampler.__init__(self, dataset, batch_size=batch_size, shuffle=shuffle, **alone)

    def __len__(self) -> int:
        """A whole data epoch at this world size: Lightning sizes every epoch by the first
        length it reads; after a resume the epoch ends where the data epoch does."""
        per_rank = self.global_batch // self.world_size
        return -(-self.num_samples // self.global_batch) * per_rank


class MalleTrainEnvironment(TorchElasticEnvironment):
    """The epoch's world from malletrain-run's torchrun, whatever ``num_nodes`` says."""

    @staticmethod
    def detect() -> bool:
        return bool(os.environ.get(training.ENV_JOB)) or TorchElasticEnvironment.detect()

    # In process (lightning_inplace), Lightning trains alone on a private group: a world of
    # one, at the job's rank once the process joined (only rank 0 writes checkpoints).
    @property
    def main_address(self) -> str:
        return "127.0.0.1" if INPROCESS else super().main_address

    @property
    def main_port(self) -> int:
        return lightning_inplace.private_port() if INPROCESS else super().main_port

    def world_size(self) -> int:
        return 1 if INPROCESS else int(os.environ.get("WORLD_SIZE", "1"))

    def global_rank(self) -> int:
        return lightning_inplace.live_rank[0] if INPROCESS else int(os.environ.get("RANK", "0"))

    def local_rank(self) -> int:
        return 0 if INPROCESS else int(os.environ.get("LOCAL_RANK", "0"))

    def node_rank(self) -> int:
        return 0 if INPROCESS else int(os.environ.get("GROUP_RANK", "0"))

    def set_world_size(self, size: int) -> None:
        pass   # the launcher's epoch decides; the Trainer's num_nodes is rewritten in setup

    def set_global_rank(self, rank: int) -> None:
        pass

    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        local = 1 if INPROCESS else int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        if num_devices != local:
            raise ValueError(f"Trainer(devices={num_devices}) but malletrain-run starts {local} "
                             f"workers per node: give devices={local} (--nproc-per-node)")


class MalleTrainCallback(pl.Callback):
    """Reports, checkpoints when due or asked, and keeps the data position across rescales."""

    def __init__(self, checkpoint_every_s: float | None = None) -> None:
        defer_dynamo()   # before the Trainer builds the optimizer (see .startup)
        self.every_s = checkpoint_every_s
        self.session: training.Session | None = None
        self.sampler: ElasticSampler | None = None
        self._resumed = False
        self.log_every = int(env_number(ENV_LOG_EVERY, 0))
        self.pacer = Pacer()
        self.run_id = run_id()
        self.inprocess: lightning_inplace.FitInProcess | None = None
        self._step: int | None = None  # the global step a checkpoint held (in process)

    # ----- setup ---------------------------------------------------------------------------
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        world = 1 if INPROCESS else int(os.environ.get("WORLD_SIZE", "1"))
        strategy: Any = trainer.strategy
        if hasattr(strategy, "num_nodes"):
            per_node = max(1, int(getattr(strategy, "num_processes", 1)))
            strategy.num_nodes = max(1, world // per_node)
        if self.session is None:
            self.session = training.Session(checkpoint_every_s=every_s(self.every_s),
                                            handle_sigterm=False)
            exit_on_sigterm()
        if stage == "fit":
            self._install_sampler(trainer)

    def _install_sampler(self, trainer: pl.Trainer) -> None:
        """Give the training DataLoader passed to ``fit`` the global-cursor sampler (before
        Lightning would add a ``DistributedSampler``)."""
        source = trainer.fit_loop._data_source
        old = getattr(source, "instance", None)
        if not isinstance(old, DataLoader) or old.batch_size is None:
            raise ValueError("MalleTrainCallback: pass the training DataLoader (with a "
                             "batch_size) to trainer.fit(model, loader)")
        shuffle = not isinstance(old.sampler, SequentialSampler)
        self.sampler = _LightningSampler(old.dataset, batch_size=old.batch_size,  # type: ignore[arg-type]
                                         shuffle=shuffle)
        source.instance = DataLoader(
            old.dataset, batch_size=old.batch_size, sampler=self.sampler,
            num_workers=old.num_workers, collate_fn=old.collate_fn, pin_memory=old.pin_memory,
            worker_init_fn=old.worker_init_fn, persistent_workers=old.persistent_workers)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        assert self.sampler is not None
        if INPROCESS:  # join the job: state from a member, or the checkpoint just restored
            step = self._step if self._step is not None else trainer.global_step
            self.inprocess = lightning_inplace.FitInProcess(self, trainer, pl_module, step,
                                                            from_disk=self._resumed)
            return
        self._log(trainer, f"start step={trainer.global_step} "
                  f"resumed={'yes' if self._resumed else 'no'} "
                  f"cursor={self.sampler.saved_cursor} params={params_digest(pl_module)} "
                  f"run={self.run_id}", head=True)

    # ----- each batch ----------------------------------------------------------------------
    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           outputs: Any, batch: Any, batch_idx: int) -> None:
        assert self.session is not None and self.sampler is not None
        if self.inprocess is not None:
            loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
            self.inprocess.train_batch_end(float(loss) if loss is not None else None)
            return
        samples = self.sampler.mark_trained()
        self.session.report(samples=float(samples))
        step = trainer.global_step
        if self.log_every > 0 and step % self.log_every == 0:
            loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
            first, stop = self.sampler.trained_batch
            self._log(trainer, f"step={step} batch={first}-{stop} "
                      f"samples={int(self.session.samples)} "
                      f"loss={float(loss) if loss is not None else float('nan'):.5f} "
                      f"params={params_digest(pl_module)} run={self.run_id} "
                      f"t={time.time():.3f}", head=False)
        self.pacer.wait()
        if trainer.strategy.broadcast(self.session.should_checkpoint(), src=0):
            self.save(trainer)

    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                                 optimizer: Any) -> None:
        if self.inprocess is not None:
            self.inprocess.before_optimizer_step(pl_module)

    def save(self, trainer: pl.Trainer, quiet: bool = False) -> str:
        """Checkpoint now (every rank; in process rank 0 alone, ``quiet``: its step line is
        the in-process one) and point ``latest`` at it."""
        assert self.session is not None
        root = checkpoint_dir()
        if trainer.is_global_zero:
            root.mkdir(parents=True, exist_ok=True)
        name = trainer.strategy.broadcast(
            f"step-{trainer.global_step:09d}-e{self.session.epoch}-{time.time_ns() % 10**12:012d}"
            ".ckpt", src=0)
        trainer.save_checkpoint(str(root / name))
        trainer.strategy.barrier("malletrain-checkpoint")
        if trainer.is_global_zero:
            checkpoint.point_latest(root, name)
            checkpoint.prune(root, name)
            self.session.checkpointed(trainer.global_step)
        if self.log_every > 0 and not quiet:
            print(f"malletrain: checkpoint step={trainer.global_step} epoch={self.session.epoch} "
                  f"world={trainer.world_size} cursor={self.sampler.saved_cursor if self.sampler else -1}",
                  flush=True)
        return str(root / name)

    def _log(self, trainer: pl.Trainer, text: str, head: bool) -> None:
        if self.log_every <= 0:
            return
        epoch = self.session.epoch if self.session is not None else 0
        where = f"epoch={epoch} world={trainer.world_size} rank={trainer.global_rank}"
        if head:   # "start step=S epoch=E world=W rank=R ..."
            first, _, rest = text.partition(" ")
            step, _, rest = rest.partition(" ")
            print(f"malletrain: {first} {step} {where} {rest}", flush=True)
        else:      # "step=S epoch=E world=W rank=R batch=..."
            step, _, rest = text.partition(" ")
            print(f"malletrain: {step} {where} {rest}", flush=True)

    # ----- state in Lightning's checkpoint -------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        if self.sampler is None:
            return {}
        samples = self.session.samples if self.session is not None else 0.0
        state = {"sampler": self.sampler.state_dict(), "samples": samples}
        if self.inprocess is not None:  # its steps: a dropped one is not Lightning's
            state["step"] = self.inprocess.el.step
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if self.sampler is not None and state_dict.get("sampler") is not None:
            self.sampler.load_state_dict(state_dict["sampler"])
            self._resumed = True
        if self.session is not None:
            self.session.samples = float(state_dict.get("samples", 0.0))
        if "step" in state_dict:
            self._step = int(state_dict["step"])
