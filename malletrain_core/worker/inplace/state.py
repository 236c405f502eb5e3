"""The training state of one process: what is handed over to a new group and checkpointed."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from typing import Any

from .. import training
from .handover import digest


class TrainingState:
    """The model, optimizer, scheduler and extras of one training process, with its step:
    what :class:`~.elastic.Elastic` hands over (:meth:`state`, :meth:`_load`) and saves at
    step boundaries (:meth:`save`, :meth:`_resume`). A subclass that owns its checkpoints
    (the bring-your-own loops' DCP) overrides ``_checkpoint``, ``_load`` and ``_resume``."""

    def __init__(self, session: training.Session, model: Any, optimizer: Any,
                 scheduler: Any = None, extra: Mapping[str, Any] | None = None, step: int = 0,
                 on_save: Callable[[int], None] | None = None) -> None:
        self.session = session
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.extra = dict(extra or {})
        self.on_save = on_save
        self.step = int(step)
        self.has_state = step > 0
        self.checkpoints: list[int] = []       # steps saved to disk by this process
        self.resumed_from: int | None = None   # the step loaded from disk, if one was

    def state(self) -> dict[str, Any]:
        """Everything that is handed over: model, optimizer, scheduler, extras, step, samples."""
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
                "extra": {k: v.state_dict() for k, v in self.extra.items()},
                "step": self.step}

    def digest(self) -> str:
        return digest(self.state())

    def _load(self, payload: dict[str, Any]) -> None:
        """Take the state of ``payload`` (a hand-over's, or a checkpoint's)."""
        import torch

        state = payload["state"]
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scheduler is not None and state.get("scheduler") is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        for k, v in self.extra.items():
            if k in state.get("extra", {}):
                v.load_state_dict(state["extra"][k])
        self.step = int(state.get("step", payload.get("step", 0)))
        self.session.samples = float(payload.get("samples", 0.0))
        if "rng" in payload:
            torch.set_rng_state(payload["rng"])
            random.setstate(payload["py_rng"])
        self.has_state = True

    def _resume(self) -> None:
        """Load the last disk checkpoint (what :meth:`steps` saves), if there is one: the
        state when no process kept it in memory (the job's first epoch, every node lost)."""
        payload = self.session.resume()
        if payload is not None and isinstance(payload.get("state"), dict) \
                and "model" in payload["state"]:
            self._load(payload)
            self.resumed_from = self.step  # the learning-rate rule is applied after this

    def _checkpoint(self) -> None:
        """At a step boundary: save the state when the period is due or the daemon asked."""
        if self.session.should_checkpoint():
            self.save()

    def save(self) -> bool:
        """Save the state to the job's checkpoint folder now (rank 0; other ranks do nothing
        and get False); ``on_save(step)`` is called after a save that completed."""
        if self.session.checkpoint(self.state(), self.step) is None:
            return False
        self.checkpoints.append(self.step)
        if self.on_save is not None:
            self.on_save(self.step)
        return True
