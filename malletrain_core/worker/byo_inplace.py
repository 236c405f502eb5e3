"""In-process rescaling for bring-your-own loops: torchrun + DCP, and the frameworks' base.

Under ``malletrain-run --inplace`` the script's process, its imports, data and model live
across membership changes, exactly as with :class:`~.inplace.Elastic`, whose machinery this
module drives rather than copies: the control thread, the group re-form, the in-memory
hand-over (digest-checked), the abandon path and the in-step re-form of
:meth:`~.inplace.Elastic.average_gradients` that keeps a step whose peer was lost.

The script keeps its own loop and its own ``DDP(model)``. What changes under it:

* ``elastic.init_process_group`` makes a private one-process group, so that the script's
  ``dist.get_rank()`` and ``DDP(model)`` work before any membership is known; its DDP keeps
  that group (an all-reduce over one process is the identity), and the real group is the
  default group that :class:`LoopElastic` forms and re-forms.
* ``optimizer.step`` first averages the gradients over the real group
  (:meth:`~.inplace.Elastic.average_gradients`); a step that the new group cannot finish is
  dropped there (no update, the sampler rewound to the last step boundary).
* :meth:`~.elastic.Run.step` ends the step at a boundary: the members agree on the newest
  epoch and on a DCP checkpoint (one all-reduce), and re-form when told.

Disk checkpoints stay DCP's (``$MALLETRAIN_CHECKPOINT_DIR/dcp``): periodic, on the daemon's
request, and loaded when no process holds the state (the job's first epoch, every node lost).

The Hugging Face Trainer (:mod:`.hf_inplace`) and Lightning (:mod:`.lightning_inplace`) use
:class:`LoopElastic` too, through :class:`LoopHost`. Where there is no in-process path (a torch
or framework release this was not tested with, several processes per node for those two, or
``MALLETRAIN_INPROCESS=0``), :func:`restart_in_place` takes the
restart path under the same launcher, with one line saying why: the process waits for its
membership, sets what torchrun would (``MASTER_ADDR``, ``RANK``, ``WORLD_SIZE``, ...), and
exits with ``training.RESTART_EXIT_CODE`` at every change; ``malletrain-run --inplace`` starts
it again at once, and it resumes from the last disk checkpoint like a restarted worker.

The machinery :class:`LoopElastic` drives is :mod:`.inplace`, the restart path
:mod:`.inplace.restart`, the frameworks' hosts :mod:`.hf_inplace` and :mod:`.lightning_inplace`.
"""

from __future__ import annotations

import copy
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from . import inplace, training
from .digest import params_digest
from .inplace.restart import RESTART_WAIT_S, restart_in_place  # noqa: F401 - importable here


class Run(Protocol):
    """What the in-process path reads and calls of the script's
    :class:`~malletrain_core.worker.elastic.Run` (which drives this module, so it is named
    here by what it offers rather than imported)."""

    session: Any
    sampler: Any
    app: Any
    resumed: Path | None
    run_id: str
    log_every: int
    pacer: Any

    def checkpoint(self) -> Any: ...

    def resume(self) -> int: ...

    def _log(self, text: str) -> None: ...


TESTED_TORCH = ((2, 13),)
"""The torch releases (major, minor) whose private process-group bookkeeping the in-process
path relies on (:func:`.inplace._forget_default_group`); any other takes the restart path."""


def requested(env: Mapping[str, str] | None = None) -> bool:
    """Whether this process runs under ``malletrain-run --inplace`` (a control folder and the
    in-place flag in its environment)."""
    env = os.environ if env is None else env
    return bool(env.get(training.ENV_CONTROL_DIR)) and env.get(training.ENV_INPLACE) == "1"


ENV_INPROCESS = "MALLETRAIN_INPROCESS"


def unsupported(version: str, env: Mapping[str, str] | None = None) -> str:
    """Why torch ``version`` cannot rescale in process ("" when it can)."""
    env = os.environ if env is None else env
    if env.get(ENV_INPROCESS, "1").strip().lower() in ("0", "no", "off", "false"):
        return f"{ENV_INPROCESS}={env[ENV_INPROCESS]} turns in-process rescaling off"
    try:
        major, minor = (int(p) for p in version.split("+")[0].split(".")[:2])
    except ValueError:
        return f"torch {version!r} is not a version this MalleTrain can read"
    if (major, minor) in TESTED_TORCH:
        return ""
    tested = ", ".join(f"{a}.{b}" for a, b in TESTED_TORCH)
    return f"torch {major}.{minor} is not one this MalleTrain was tested with ({tested})"


_backend: list[str] = []  # the backend the script asked for, with the private group


def init_process_group(backend: str | None, **kwargs: Any) -> None:
    """Under ``malletrain-run --inplace``: a one-process default group on an in-memory store
    (see the module doc), or the restart path's group where there is no in-process path."""
    import torch
    import torch.distributed as dist

    why = unsupported(torch.__version__)
    if why:
        restart_in_place(why)
        dist.init_process_group(backend, **kwargs)
        return
    _backend[:] = [backend or "gloo"]
    dist.init_process_group(_backend[0], store=dist.HashStore(), rank=0, world_size=1)


def active() -> bool:
    """Whether :func:`init_process_group` took the in-process path in this process."""
    return bool(_backend)


class _Cursor:
    """The sampler's position at the last step boundary, which is what is handed over: a step
    in flight has moved the sampler past its batch, and a dropped step must train that batch
    again."""

    def __init__(self, sampler: Any) -> None:
        self.sampler = sampler
        self.boundary = int(sampler.saved_cursor)

    def state_dict(self) -> dict[str, Any]:
        return {**self.sampler.state_dict(), "cursor": self.boundary}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sampler.load_state_dict(state)
        self.boundary = int(state["cursor"])

    def rewind(self) -> None:
        self.sampler.load_state_dict(self.state_dict())


class LoopElastic(inplace.Elastic):
    """:class:`~.inplace.Elastic` for a loop it does not own: gradients averaged in the
    optimizer's step, DCP checkpoints decided with the epoch agreement, the sampler kept in
    step with the membership, and one ``start`` line per epoch for the step log."""

    def __init__(self, run: Run, model: Any, backend: str, patch_optimizer: bool = True) -> None:
        sampler = run.sampler
        self.run = run
        self.cursor = _Cursor(sampler) if sampler is not None else None
        extra = {"sampler": self.cursor} if self.cursor is not None else {}
        super().__init__(run.session, model, run.app.optimizer, run.app.scheduler,
                         extra=extra, backend=backend, ddp=False)
        self.resumed = "no"
        self._averaged = False
        self._held_schedule: tuple[list[Any], Any] | None = None
        if patch_optimizer:
            self._patch_optimizer()

    def _patch_optimizer(self) -> None:
        optimizer = self.optimizer
        if optimizer is None:
            return
        step = optimizer.step

        def averaged_step(*args: Any, **kwargs: Any) -> Any:
            self.average_once()
            self._averaged = False
            if self._step_failed:  # dropped: no update (see steps())
                optimizer.zero_grad(set_to_none=True)
                return None
            return step(*args, **kwargs)

        optimizer.step = averaged_step

    def average_once(self) -> None:
        """Average the gradients over the job's group, once per step (a framework may need
        them averaged before its own step, to clip them); a step whose peer was lost and that
        the new group cannot finish is marked dropped."""
        if self._averaged:
            return
        self._averaged = True
        try:
            self.average_gradients()
        except Exception as exc:
            if not (self.world > 1 and self._is_peer_failure(exc)):
                raise
            self._step_failed = True
            self._note_abandoned()
            self._hold_schedule()

    def _hold_schedule(self) -> None:
        """Note the learning-rate schedule as it is when a step is dropped, for
        :meth:`after_boundary` to put back: the loop still steps its scheduler after the
        optimizer's (dropped) step, and a dropped step must not advance it. Otherwise a member
        that took the state from a peer which finished the step (that peer's scheduler already
        advanced for it) would advance it once more than that peer, and their learning rates,
        then their parameters, would differ from there on."""
        optimizer, scheduler = self.optimizer, self.scheduler
        self._held_schedule = (
            [group.get("lr") for group in optimizer.param_groups] if optimizer is not None
            else [],
            copy.deepcopy(scheduler.state_dict()) if scheduler is not None else None)

    def _restore_schedule(self) -> None:
        held, self._held_schedule = self._held_schedule, None
        if held is None:
            return
        lrs, state = held
        if state is not None and self.scheduler is not None:
            self.scheduler.load_state_dict(state)
        if self.optimizer is not None:
            for group, lr in zip(self.optimizer.param_groups, lrs):
                group["lr"] = lr

    # ----- Elastic's hooks ------------------------------------------------------------
    def _checkpoint(self) -> None:
        """Decided with the epoch agreement instead (:meth:`_agree`): DCP needs every rank."""

    def _agree(self) -> int:
        return self._agree_and_save(self._save)

    def _save(self) -> None:
        """Checkpoint now: DCP on every rank (torchrun), or the framework's own save by rank 0
        after this step (:class:`LoopHost`)."""
        self.run.app.step = self.step
        self.run.checkpoint()
        self.checkpoints.append(self.step)
        self.run._log(f"checkpoint step={self.step} epoch={self.epoch} world={self.world} "
                      f"cursor={self.cursor.boundary if self.cursor else -1}")

    def _load(self, payload: dict[str, Any]) -> None:
        super()._load(payload)
        self.resumed = "memory"  # from a member, over the new group

    def _resume(self) -> None:
        self.run.resume()
        if self.run.resumed is not None:
            self.step = self.run.app.step
            self.resumed_from, self.has_state, self.resumed = self.step, True, "yes"
            if self.cursor is not None:
                self.cursor.boundary = int(self.cursor.sampler.saved_cursor)

    def _apply(self, m: inplace.Membership, kind: str) -> inplace.Handed:
        if not (kind == "start" and self.resumed == "yes"):  # "yes": loaded from disk
            self.resumed = "memory" if self.has_state else "no"
        out = super()._apply(m, kind)
        sampler = self.run.sampler
        if sampler is not None:
            per_rank = getattr(sampler, "per_rank_batch", None)
            sampler.rank, sampler.world_size = self.rank, self.world
            if per_rank:
                sampler.global_batch = per_rank * self.world
        self.run.app.step = self.step
        handed = self.changes[-1] if self.changes else {}
        self.run._log(f"start step={self.step} epoch={self.epoch} world={self.world} "
                      f"rank={self.rank} resumed={self.resumed} "
                      f"cursor={self.cursor.boundary if self.cursor else -1} "
                      f"params={_params(self.model)} run={self.run.run_id} "
                      f"reform_s={handed.get('reform_s', 0)} kind={kind} pid={os.getpid()} "
                      f"source={handed.get('source', 0)} sent={handed.get('sent_bytes', 0)}")
        return out

    # ----- the script's side ----------------------------------------------------------
    def start(self) -> None:
        """Join the job: ready file, first membership, state from a member or from disk."""
        self._steps = self.steps()
        next(self._steps)

    def after_step(self, loss: float | None, samples: float | None) -> bool:
        """One step of the script's loop is over: count it (unless it was dropped: its batch
        is trained again), then the step boundary (agreement, checkpoint, re-form). Returns
        True when it checkpointed."""
        dropped = self._step_failed
        self._averaged = False
        if dropped and self.cursor is not None:
            self.cursor.rewind()
        elif not dropped:
            first = self.cursor.boundary if self.cursor is not None else 0
            stop = first
            if self.cursor is not None:
                self.cursor.sampler.mark_trained()
                stop = self.cursor.boundary = int(self.cursor.sampler.saved_cursor)
            self.run.session.report(samples=float(stop - first if samples is None else samples))
            if self.run.log_every > 0 and (self.step + 1) % self.run.log_every == 0:
                self.run._log(
                    f"step={self.step + 1} epoch={self.epoch} world={self.world} "
                    f"rank={self.rank} batch={first}-{stop} samples={int(self.session.samples)} "
                    f"loss={'nan' if loss is None else f'{float(loss):.5f}'} "
                    f"params={_params(self.model)} run={self.run.run_id} t={time.time():.3f}")
        self.run.pacer.wait()
        saved = len(self.checkpoints)
        self.after_boundary()
        return len(self.checkpoints) > saved

    def after_boundary(self) -> None:
        """The step boundary: count the step (unless dropped), agree on the newest epoch and
        a checkpoint, re-form when the membership changed."""
        self._restore_schedule()
        next(self._steps)
        self.run.app.step = self.step


class LoopHost:
    """What :class:`LoopElastic` uses of :class:`~.elastic.Run`, for a framework's trainer:
    its session (from the framework's MalleTrain callback), sampler, optimizer and scheduler,
    its log, and a checkpoint that the framework saves itself (rank 0, after this step:
    :attr:`save_due`)."""

    def __init__(self, callback: Any, sampler: Any, optimizer: Any,
                 scheduler: Any, step: int) -> None:
        from types import SimpleNamespace

        self.session = callback.session
        self.sampler = sampler
        self.app = SimpleNamespace(step=step, optimizer=optimizer, scheduler=scheduler)
        self.run_id = callback.run_id
        self.log_every = callback.log_every
        self.pacer = callback.pacer
        self.resumed: Path | None = None
        self.save_due = False

    def _log(self, text: str) -> None:
        if self.log_every > 0:
            print(f"malletrain: {text}", flush=True)

    def checkpoint(self) -> None:
        self.save_due = True

    def resume(self) -> int:
        return self.app.step  # the framework loaded its newest checkpoint before joining


def _params(model: Any) -> str:
    return params_digest(model)


def attach(run: Run, model: Any) -> LoopElastic:
    """Take over ``run`` in process: leave the private group to the script's DDP, form the
    job's group and get the state (called by :class:`~.elastic.Run`)."""
    import torch.distributed as dist

    module = getattr(model, "module", model)  # the script's DDP (on the private group)
    if dist.is_initialized():
        inplace._forget_default_group()  # kept by the script's DDP, never shut down
    el = LoopElastic(run, module, _backend[0])
    el.start()
    return el
