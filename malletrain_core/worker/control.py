"""The control folder between ``malletrain-run --inplace`` and its training processes.

The launcher writes each new membership (epoch, the node's rank and the node count, the
daemon's fresh master and port, abandon) atomically into ``membership.json``; each training
process (:class:`~.inplace.Elastic`) reads it, and says it can join by writing its ready file
(``ready``, or ``ready.<LOCAL_RANK>`` with several processes per node). ``lost`` records the
epoch in which one of a node's processes lost a peer; ``peers_lost`` the nodes that a process
found silent in an epoch (their heartbeat stopped), which the launcher tells the daemon. This
module is the whole format: the
launcher imports it alone, without the training side.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

MEMBERSHIP_NAME = "membership.json"
READY_NAME = "ready"
LOST_NAME = "lost"  # several processes per node: the epoch in which one of them lost a peer
PEERS_LOST_NAME = "peers_lost"  # the nodes a process found silent, for the launcher


@dataclass(frozen=True)
class Membership:
    """One process's place in an epoch; ``world == 0`` means: leave the job."""

    epoch: int
    rank: int = 0
    world: int = 0
    master: str = ""
    port: int = 0
    abandon: bool = False

    @property
    def leave(self) -> bool:
        return self.world <= 0

    def for_process(self, local_rank: int, local_world: int) -> Membership:
        """This node's membership as seen by its process ``local_rank`` of ``local_world``:
        global rank ``rank × local_world + local_rank`` in a world of ``world × local_world``
        (every process of a node reads the same file, so they all change epoch together)."""
        if local_world == 1 or self.leave:
            return self
        return replace(self, rank=self.rank * local_world + local_rank,
                       world=self.world * local_world)

    @classmethod
    def from_dict(cls, data: Any) -> Membership:
        if not isinstance(data, dict) or not isinstance(data.get("epoch"), int):
            raise ValueError(f"malformed membership {data!r}; expected an object with an "
                             "integer epoch")
        m = cls(epoch=int(data["epoch"]), rank=int(data.get("rank", 0)),
                world=int(data.get("world", 0)), master=str(data.get("master", "")),
                port=int(data.get("port", 0)), abandon=bool(data.get("abandon", False)))
        if not m.leave and (not 0 <= m.rank < m.world or not m.master or m.port <= 0):
            raise ValueError(f"incomplete membership {data!r}; need rank < world, master, port")
        return m


def write_membership(control_dir: str | Path, m: Membership) -> None:
    """Publish ``m`` atomically (the launcher's side of the control channel)."""
    final = Path(control_dir) / MEMBERSHIP_NAME
    tmp = final.with_name(f".{MEMBERSHIP_NAME}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(asdict(m)))
    os.replace(tmp, final)


def read_membership(control_dir: str | Path) -> Membership | None:
    try:
        text = (Path(control_dir) / MEMBERSHIP_NAME).read_text()
    except OSError:
        return None
    try:
        return Membership.from_dict(json.loads(text))
    except (ValueError, TypeError):
        return None


def ready_name(local_rank: int, local_world: int) -> str:
    """The ready file of process ``local_rank`` of a node's ``local_world``: ``ready`` alone
    when the node runs one process (as before), else ``ready.<local_rank>``."""
    return READY_NAME if local_world == 1 else f"{READY_NAME}.{local_rank}"


def is_ready(control_dir: str | Path, nproc: int = 1) -> bool:
    """True once all ``nproc`` training processes in ``control_dir`` are ready to join (the
    launcher's view): the node is placed only when every one of them can join."""
    return all((Path(control_dir) / ready_name(i, nproc)).exists() for i in range(nproc))


def local_layout(env: Mapping[str, str]) -> tuple[int, int]:
    """This process's ``(LOCAL_RANK, LOCAL_WORLD_SIZE)`` on its node; (0, 1) when unset."""
    try:
        local_rank = int(env.get("LOCAL_RANK", "0") or 0)
        local_world = int(env.get("LOCAL_WORLD_SIZE", "1") or 1)
    except ValueError:
        raise ValueError(f"LOCAL_RANK={env.get('LOCAL_RANK')!r} and LOCAL_WORLD_SIZE="
                         f"{env.get('LOCAL_WORLD_SIZE')!r} must be whole numbers (malletrain-run "
                         "sets both)") from None
    if not 0 <= local_rank < local_world:
        raise ValueError(f"LOCAL_RANK={local_rank} is not in [0, LOCAL_WORLD_SIZE="
                         f"{local_world}): start the processes with malletrain-run "
                         "--nproc-per-node")
    return local_rank, local_world


def write_peers_lost(control_dir: str | Path, epoch: int, nodes: list[int]) -> None:
    """Say that the node ranks ``nodes`` of ``epoch`` went silent (atomically; merged with
    those already written for that epoch by the node's other processes, as far as they do
    not race)."""
    known = read_peers_lost(control_dir)
    if known is not None and known[0] == epoch:
        nodes = sorted(set(nodes) | set(known[1]))
    final = Path(control_dir) / PEERS_LOST_NAME
    tmp = final.with_name(f".{PEERS_LOST_NAME}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"epoch": epoch, "nodes": sorted(set(nodes))}))
    os.replace(tmp, final)


def read_peers_lost(control_dir: str | Path) -> tuple[int, list[int]] | None:
    """``(epoch, node ranks)`` of the last :func:`write_peers_lost`, or None."""
    try:
        data = json.loads((Path(control_dir) / PEERS_LOST_NAME).read_text())
        return int(data["epoch"]), [int(n) for n in data["nodes"]]
    except (OSError, ValueError, TypeError, KeyError):
        return None
