""":class:`Elastic` for a sharded model: the script gives how to build it, not the model.

A sharded model exists only on a mesh, and the mesh only on a group, so the model cannot be
built before the first group forms, and is built again on every new group's mesh. The script
therefore hands over its ``build(mesh)`` (the module and its usual ``fully_shard`` calls) and
``make_optimizer(model)``, and uses :attr:`Elastic.model` and :attr:`Elastic.optimizer`, which
each change replaces. Disk checkpoints are DCP's (every rank writes its shards), decided at
the step agreement so that every rank saves at the same step.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import gc
import os
import shutil
import threading
from collections.abc import Callable
from typing import Any

from .. import training
from ..control import local_layout
from ..inplace.elastic import Elastic as _Elastic
from .handover import FSDP, ShardedHandover
from .state import let_go_of_groups, local_digest

BUDDY_EVERY = 20
"""FSDP: the steps between two refreshes of the buddy copies (:mod:`.buddy`): what a member
lost without warning costs, at most (``buddy_every=0``: no copies, the checkpoint is read)."""
SHARDS_PREFIX = "sharded-step"
"""The DCP folder of a checkpoint, beside the checkpoint file that names it."""


class Elastic(_Elastic):
    """:class:`~malletrain_core.worker.inplace.Elastic` with the state sharded (FSDP2 over
    the whole job, or HSDP with a node's processes sharding among themselves: ``mode``), handed
    over in memory by :class:`~.handover.ShardedHandover`. Every other argument is
    ``inplace.Elastic``'s (``lr_for``, ``extra``, ``backend``, ...); no DDP wrapper (FSDP
    reduces the gradients). The model and optimizer are built at the first group: until
    :meth:`steps` has yielded, :attr:`model` is None."""

    def __init__(self, session: training.Session, build: Callable[[Any], Any],
                 make_optimizer: Callable[[Any], Any], *, mode: str = FSDP,
                 make_scheduler: Callable[[Any], Any] | None = None, seed: int = 0,
                 bucket_bytes: int | None = None, buddy_every: int = BUDDY_EVERY,
                 **kwargs: Any) -> None:
        taken = {"ddp", "handover", "model", "optimizer", "scheduler"} & set(kwargs)
        if taken:
            raise TypeError(f"sharded.Elastic sets {sorted(taken)} itself: give build, "
                            "make_optimizer and make_scheduler instead")
        self.sharding = ShardedHandover(mode, build, make_optimizer, make_scheduler, seed,
                                        bucket_bytes, buddy_every)
        # imported now, before this process says it is ready, not in a change's pause
        # (torch._dynamo: FSDP2's first fully_shard imports it, 0.6 s measured here)
        import torch._dynamo  # noqa: F401
        import torch.distributed.checkpoint.state_dict  # noqa: F401
        import torch.distributed.device_mesh  # noqa: F401
        import torch.distributed.fsdp  # noqa: F401

        super().__init__(session, None, None, ddp=False, handover=self.sharding, **kwargs)

    def _start(self) -> None:
        if not self.inplace and self.model is None:
            import torch.distributed as dist

            # the restart path (torchrun's group) or a plain run (a group of one): the mesh
            # needs a group before the model can exist
            if not dist.is_initialized():
                one: dict[str, Any] = {} if self.world > 1 else {
                    "store": dist.HashStore(), "rank": 0, "world_size": 1}
                dist.init_process_group(self.backend,
                                        timeout=dt.timedelta(seconds=self.timeout_s), **one)
            self.local_rank, self.local_world = local_layout(os.environ)
            self.sharding.hand_over(self, dist.group.WORLD)
        super()._start()

    def _teardown(self) -> None:
        """The old model's groups are freed once forgotten, so that a sibling stuck in a
        collective with this process fails at once (:func:`~.state.let_go_of_groups`); after
        a failed step in a thread of their own (a group's destructor can wait for an
        operation FSDP left pending on it; the process then leaves with ``os._exit``)."""
        taken = let_go_of_groups(self.model) if self.model is not None and self.inplace else []
        failed = self._step_failed or self._pending.reason is not None
        if taken and failed:
            gc.collect()   # a failed collective's traceback frames can hold a group in a cycle
        super()._teardown()
        if taken and failed:
            threading.Thread(target=taken.clear, name="malletrain-free-groups",
                             daemon=True).start()
        taken = []

    # ----- the state --------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """This rank's part: its local shards (no collective), the scheduler, the extras."""
        from .state import inventory

        return {"shards": inventory(self.model, self.optimizer)[1],
                "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
                "extra": {k: v.state_dict() for k, v in self.extra.items()},
                "step": self.step}

    def shard_digest(self) -> str:
        """The digest of this rank's shards and step (equal on replicas of one shard)."""
        return local_digest(self.model, self.optimizer, self.step)

    # ----- disk checkpoints (DCP) ---------------------------------------------------------
    def _checkpoint(self) -> None:
        """Every rank saves at the same step: in place decided at the agreement
        (:meth:`_agree`); on the restart path by one all-reduce here."""
        if self.inplace:
            return
        if self._want_checkpoint(self.session.should_checkpoint()):
            self.save()

    def _want_checkpoint(self, want: bool) -> bool:
        import torch
        import torch.distributed as dist

        if self.world <= 1:
            return want
        t = torch.tensor([int(want)], dtype=torch.int64, device=self._device)
        dist.all_reduce(t, dist.ReduceOp.MAX)
        return bool(t[0])

    def _agree(self) -> int:
        seen = self._agree_and_save(self.save)
        if self.epoch is None or seen <= self.epoch:  # no change coming: the copies, if due
            self.sharding.refresh(self)
        return seen

    def save(self) -> bool:
        """Every rank writes its shards with DCP; then the chief writes the checkpoint file
        (step, samples, scheduler, extras) naming their folder, and removes older folders.
        Called by every rank at once; True on the chief once complete (every rank records
        the step in :attr:`checkpoints`)."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        folder = self.session.checkpoint_dir / f"{SHARDS_PREFIX}-{self.step}"
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(folder))
        self.checkpoints.append(self.step)   # this rank's shards are written
        rest = self.state()
        rest["shards"] = folder.name
        if self.session.checkpoint(rest, self.step) is None:
            return False
        for old in self.session.checkpoint_dir.glob(f"{SHARDS_PREFIX}-*"):
            if old != folder:
                with contextlib.suppress(OSError):
                    shutil.rmtree(old)
        if self.on_save is not None:
            self.on_save(self.step)
        return True

    def _resume(self) -> None:
        """Load the last checkpoint's shards (DCP re-shards them to this mesh) and the rest."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        payload = self.session.resume()
        state = payload.get("state") if payload is not None else None
        if not isinstance(state, dict) or not isinstance(state.get("shards"), str):
            return
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        both: dict[str, Any] = {"model": model_sd, "optim": optim_sd}
        dcp.load(both, checkpoint_id=str(self.session.checkpoint_dir / state["shards"]))
        set_state_dict(self.model, self.optimizer, model_state_dict=both["model"],
                       optim_state_dict=both["optim"])
        if self.scheduler is not None and state.get("scheduler") is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        for k, v in self.extra.items():
            if k in state.get("extra", {}):
                v.load_state_dict(state["extra"][k])
        self.step = int(state["step"])
        self.has_state = True
        self.resumed_from = self.step
