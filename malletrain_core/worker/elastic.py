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
import signal
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from . import byo_inplace, checkpoint, training
from .digest import params_digest
from .runid import run_id
from .sampler import ElasticBatchSampler, ElasticSampler
from .startup import defer_dynamo

__all__ = ["ElasticBatchSampler", "ElasticSampler", "Run", "init_process_group", "params_digest",
           "run_id"]

ENV_EVERY_S = "MALLETRAIN_CHECKPOINT_EVERY_S"
ENV_LOG_EVERY = "MALLETRAIN_LOG_EVERY"
ENV_MIN_STEP_S = "MALLETRAIN_MIN_STEP_S"


def env_number(name: str, default: float) -> float:
    text = os.environ.get(name, "").strip()
    try:
        return float(text) if text else default
    except ValueError:
        raise ValueError(f"{name}={text!r} is not a number") from None


def exit_on_sigterm() -> None:
    """SIGTERM ends the worker at once, by the kernel's default action: a handler in Python
    would never run while the main thread waits in C code holding the interpreter lock (as
    torch 2.13's gloo group destructor can at exit, joining a thread that waits for that
    lock), and the worker would hang instead of exiting."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


class Pacer:
    """Paces steps to at least ``$MALLETRAIN_MIN_STEP_S`` seconds (0: no pacing)."""

    def __init__(self) -> None:
        self.min_step_s = env_number(ENV_MIN_STEP_S, 0.0)
        self._last_t = time.monotonic()

    def wait(self) -> None:
        if self.min_step_s > 0:
            left = self.min_step_s - (time.monotonic() - self._last_t)
            if left > 0:
                time.sleep(left)
            self._last_t = time.monotonic()


def init_process_group(backend: str | None = None, **kwargs: Any) -> None:
    """``torch.distributed.init_process_group`` for a script that may rescale in process.

    Under ``malletrain-run --inplace`` the membership is not known yet (and changes while the
    process lives): a private one-process group lets the script go on (``dist.get_rank()``,
    ``DDP(model)``) and :class:`Run` then joins the job's group (:mod:`.byo_inplace`).
    Anywhere else it is torch's own call, torchrun's environment and all. Either way the
    optimizer and DDP built after it do not import ``torch._dynamo`` (:mod:`.startup`)."""
    defer_dynamo()
    if byo_inplace.requested():
        byo_inplace.init_process_group(backend, **kwargs)
    else:
        dist.init_process_group(backend, **kwargs)


def group_device() -> torch.device:
    """Where the default group's collectives take their tensors: this process's GPU on NCCL
    (a CPU tensor there fails: "No backend type associated with device type cpu"), else the
    CPU."""
    if "nccl" in str(dist.get_backend()).lower():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def agree(flag: bool) -> bool:
    """Rank 0's ``flag`` on every rank (one small broadcast; ``flag`` alone without a group).
    The synchronous broadcast waits for its work, so the host read after it sees the result
    on NCCL too."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        box = torch.tensor([1 if flag else 0], dtype=torch.int32, device=group_device())
        dist.broadcast(box, src=0)
        return bool(box.item())
    return flag


def every_s(value: float | None) -> float:
    return float(value) if value is not None else env_number(ENV_EVERY_S, 300.0)


class Run:
    """One worker's elastic training state: resume on creation, :meth:`step` after each step.

    ``resume=True`` loads the newest checkpoint at once (every rank: call it after
    ``init_process_group``); :attr:`step_count` is then the step to continue from and
    :attr:`resumed` the folder loaded (None for a fresh start).

    ``$MALLETRAIN_LOG_EVERY=N`` prints one line every N steps on every rank (step, epoch,
    world size, rank, the global sample positions of the batch, loss, a digest of the
    parameters, the run id); ``$MALLETRAIN_MIN_STEP_S`` paces steps on shared machines.
    """

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None,
                 scheduler: Any = None, sampler: ElasticSampler | None = None,
                 checkpoint_every_s: float | None = None, resume: bool = True,
                 extra: Mapping[str, Any] | None = None,
                 session: training.Session | None = None) -> None:
        if session is None:
            session = training.Session(checkpoint_every_s=every_s(checkpoint_every_s),
                                       handle_sigterm=False)
            exit_on_sigterm()
        self.session = session
        self.sampler = sampler
        self.app = checkpoint.AppState(model, optimizer, scheduler, sampler, extra=extra)
        self.directory = Path(self.session.checkpoint_dir) / "dcp"
        self.resumed: Path | None = None
        self.checkpoints = 0
        self.log_every = int(env_number(ENV_LOG_EVERY, 0))
        self.pacer = Pacer()
        self.run_id = run_id()
        self.inprocess: byo_inplace.LoopElastic | None = None
        if byo_inplace.active():  # malletrain-run --inplace: state from a member or disk
            self.inprocess = byo_inplace.attach(self, model)
            return
        if resume:
            self.resume()
        self._log(f"start step={self.app.step} epoch={self.session.epoch} "
                  f"world={self.session.world_size} rank={self.session.rank} "
                  f"resumed={'yes' if self.resumed is not None else 'no'} "
                  f"cursor={self._cursor()} params={params_digest(self.app.model)} "
                  f"run={self.run_id}")

    def _cursor(self) -> int:
        return self.sampler.saved_cursor if self.sampler is not None else -1

    def _log(self, text: str) -> None:
        if self.log_every > 0:
            print(f"malletrain: {text}", file=sys.stdout, flush=True)

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
        return agree(self.session.should_checkpoint())

    def step(self, loss: float | None = None, samples: float | None = None) -> bool:
        """One optimiser step is done: count it, report progress, checkpoint when due.
        ``samples`` (global, this step) defaults to the sampler's batch; ``loss`` is only
        logged. Returns True when it checkpointed."""
        if self.inprocess is not None:
            return self.inprocess.after_step(loss, samples)
        self.app.step += 1
        trained = self.sampler.mark_trained() if self.sampler is not None else 0
        self.session.report(samples=float(trained if samples is None else samples))
        if self.log_every > 0 and self.app.step % self.log_every == 0:
            first = self.sampler.trained_batch if self.sampler is not None else (0, 0)
            self._log(f"step={self.app.step} epoch={self.session.epoch} "
                      f"world={self.session.world_size} rank={self.session.rank} "
                      f"batch={first[0]}-{first[1]} samples={int(self.session.samples)} "
                      f"loss={'nan' if loss is None else f'{float(loss):.5f}'} "
                      f"params={params_digest(self.app.model)} run={self.run_id} "
                      f"t={time.time():.3f}")
        self.pacer.wait()
        if self._due():
            self.checkpoint()
            self._log(f"checkpoint step={self.app.step} epoch={self.session.epoch} "
                      f"world={self.session.world_size} cursor={self._cursor()}")
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
