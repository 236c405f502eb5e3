"""Checkpoints through ``torch.distributed.checkpoint`` (DCP), loadable at any world size.

One checkpoint is a folder ``step-<step>-<tag>`` written by every rank together (DCP shards
what is sharded and writes replicated tensors once); once DCP has written its metadata, rank 0
points the file ``latest`` at it (temporary file, fsync, rename), so a job killed during a save
resumes from the previous checkpoint, never from a half-written one. Each folder name is used
once (the tag comes from rank 0), so a step trained again after a restart never overwrites the
checkpoint that ``latest`` names. Loading reshards for the current world size.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.stateful import Stateful

from ..errors import MalleTrainError

LATEST = "latest"
METADATA = ".metadata"
KEEP = 2


class AppState(Stateful):
    """What a checkpoint holds: model, optimizer, LR scheduler, sampler, step and extras.

    The model may be wrapped (DDP); its state is saved with un-wrapped names. ``extra`` holds
    plain values (counters) by name; after a load, :attr:`extra` has the saved ones.
    """

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None,
                 scheduler: Any = None, sampler: Any = None, step: int = 0,
                 extra: Mapping[str, Any] | None = None) -> None:
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.sampler = sampler
        self.step = int(step)
        self.extra: dict[str, Any] = dict(extra or {})

    def state_dict(self) -> dict[str, Any]:
        optims = [self.optimizer] if self.optimizer is not None else []
        model_sd, optim_sd = get_state_dict(self.model, optims)
        state: dict[str, Any] = {"model": model_sd, "step": self.step, "extra": dict(self.extra)}
        if self.optimizer is not None:
            state["optimizer"] = optim_sd
        if self.scheduler is not None:
            state["scheduler"] = self.scheduler.state_dict()
        if self.sampler is not None:
            state["sampler"] = self.sampler.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        optims = [self.optimizer] if self.optimizer is not None else []
        set_state_dict(self.model, optims, model_state_dict=state["model"],
                       optim_state_dict=state.get("optimizer", {}))
        if self.scheduler is not None and "scheduler" in state:
            self.scheduler.load_state_dict(state["scheduler"])
        if self.sampler is not None and "sampler" in state:
            self.sampler.load_state_dict(state["sampler"])
        self.step = int(state["step"])
        self.extra = dict(state.get("extra", {}))


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def _rank() -> int:
    return dist.get_rank() if _distributed() else 0


def _agree(value: str) -> str:
    """Rank 0's ``value`` on every rank."""
    if not _distributed():
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return str(box[0])


def _complete(path: Path) -> bool:
    return (path / METADATA).is_file()


def latest(directory: str | Path) -> Path | None:
    """The checkpoint folder to resume from, or None: the one ``latest`` names, else (a
    folder from before ``latest`` existed) the newest complete one."""
    root = Path(directory)
    try:
        name = (root / LATEST).read_text().strip()
    except OSError:
        name = ""
    if name and "/" not in name and _complete(root / name):
        return root / name
    found = [p for p in root.glob("step-*") if p.is_dir() and _complete(p)]
    return max(found, key=lambda p: (p / METADATA).stat().st_mtime) if found else None


def point_latest(root: Path, name: str) -> None:
    """Make ``root/latest`` name ``name`` atomically (temporary file, fsync, rename)."""
    tmp = root / f".{LATEST}.{os.getpid()}.tmp"
    with open(tmp, "w") as fh:
        fh.write(name + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, root / LATEST)
    fd = os.open(root, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def prune(root: Path, keep_name: str) -> None:
    """Remove all but the newest ``KEEP`` checkpoints (folders or files) in ``root``."""
    found = sorted(root.glob("step-*"), key=lambda p: p.stat().st_mtime)
    old = [p for p in found if p.name != keep_name]
    for path in old[:max(0, len(old) - (KEEP - 1))]:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def save(app: AppState, directory: str | Path, tag: str = "") -> Path:
    """Save ``app`` with every rank (a collective); returns the checkpoint's folder."""
    root = Path(directory)
    if _rank() == 0:
        root.mkdir(parents=True, exist_ok=True)
    name = _agree(f"step-{app.step:09d}-{tag or 'x'}-{time.time_ns() % 10**12:012d}")
    path = root / name
    dcp.save({"app": app}, checkpoint_id=path, no_dist=not _distributed())
    if _distributed():
        dist.barrier()
    if _rank() == 0:
        point_latest(root, name)
        prune(root, name)
    return path


def load(app: AppState, directory: str | Path) -> Path | None:
    """Load the newest complete checkpoint into ``app`` at this world size; None if there is
    none. Every rank calls it."""
    path = latest(directory)
    name = _agree(path.name if path is not None else "")
    if not name:
        return None
    path = Path(directory) / name
    if not _complete(path):
        raise MalleTrainError(f"checkpoint {path} is not readable from this rank: the "
                              "checkpoint folder must be shared by every node")
    dcp.load({"app": app}, checkpoint_id=path, no_dist=not _distributed())
    return path
