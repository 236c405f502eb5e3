"""FSDP across the job: re-shard parameters and optimizer state in memory to a new shard count.

Before a planned change the model is ``fully_shard``-ed over a 1-D mesh of N ranks; after it,
over M. The exchange runs on one group holding every old and every new holder (survivors,
joiners, and leavers, which take part before they go), named by their ranks in that group:
``old_ranks[i]`` held shard ``i`` of N, ``new_ranks[j]`` will hold shard ``j`` of M. Each
rank sends only the rows the new layout moves away from it and receives only the rows it
lacks (:func:`~.plan.reshard_plan`); the optimizer's ``step`` and the buffers reach each
joiner from an old holder, spread over them. No rank holds more than its old and new shards
plus the buffers of one bucket: half an average shard by default, or one tensor's pieces
when a tensor moves more. Since a rank's buffers hold only what it sends (part of its old
shard) and receives (part of its new one), they never exceed twice the larger shard.

The new model is built by the script's own code (``build(mesh)``: the module on the meta
device, ``fully_shard`` on ``mesh``), then ``to_empty`` and the received shards copied into
its parameters' local tensors, which alias FSDP's own sharded storage.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .exchange import Collective, Move, Traffic, broadcast_bytes, exchange, run_collective
from .plan import reshard_plan, shard_rows
from .state import SHARD, Manifest, empty_shards, inventory, local_bytes, rebuild


@dataclass
class Resharded:
    """What a rank holds after the re-shard (``model`` and ``optimizer`` are None on a rank
    that left the layout), what it moved, and the bytes of its old and new local state."""

    model: Any
    optimizer: Any
    traffic: Traffic
    old_bytes: int
    new_bytes: int
    shards: dict[str, Any] = field(default_factory=dict)
    """Received without a mesh: this rank's new local tensors by key, for :func:`adopt`."""
    manifest: Manifest | None = None
    place: tuple[int, int] = (0, 0)
    """(this rank's new shard index, the new shard count)."""

    @property
    def peak_extra_ratio(self) -> float:
        """The exchange's buffers alive at once over this rank's shard (the larger of its old
        and new local state)."""
        shard = max(self.old_bytes, self.new_bytes)
        return self.traffic.peak_buffer_bytes / shard if shard else 0.0


def fsdp_moves(manifest: Manifest, old_ranks: Sequence[int],
               new_ranks: Sequence[int]) -> list[Move]:
    """Every rank's moves: the rows of each sharded entry (:func:`~.plan.reshard_plan`), and
    each whole entry from an old holder to every new holder that lacks it (joiner ``k``
    from ``old_ranks[k mod N]``; a holder that stays copies its own)."""
    n, m = len(old_ranks), len(new_ranks)
    joiners = [r for r in new_ranks if r not in old_ranks]
    moves: list[Move] = []
    for e in manifest.entries:
        size = e.itemsize
        if e.kind == SHARD:
            for p in reshard_plan(e.rows, old_ranks, new_ranks):
                old_start = shard_rows(e.rows, n, list(old_ranks).index(p.src))[0]
                new_start = shard_rows(e.rows, m, list(new_ranks).index(p.dst))[0]
                moves.append(Move(e.key, p.src, p.dst, (p.start - old_start) * e.row_numel,
                                  (p.start - new_start) * e.row_numel,
                                  p.rows * e.row_numel, size))
            continue
        numel = e.rows * e.row_numel
        moves += [Move(e.key, r, r, 0, 0, numel, size) for r in new_ranks if r in old_ranks]
        moves += [Move(e.key, old_ranks[k % n], r, 0, 0, numel, size)
                  for k, r in enumerate(joiners)]
    return moves


def default_bucket_bytes(manifest: Manifest, holders: int) -> int:
    """Half the bytes of an average shard (at least 1 MiB)."""
    total = sum(e.rows * e.row_numel * e.itemsize for e in manifest.entries)
    return max(1 << 20, total // max(1, holders) // 2)


def reshard_fsdp(model: Any, optimizer: Any, *, build: Callable[[Any], Any],
                 make_optimizer: Callable[[Any], Any], group: Any,
                 old_ranks: Sequence[int], new_ranks: Sequence[int], new_mesh: Any,
                 device: Any = "cpu", bucket_bytes: int | None = None,
                 collective: Collective = run_collective) -> Resharded:
    """Re-shard ``model`` and ``optimizer`` (None on a joiner) from ``old_ranks`` to
    ``new_ranks`` of ``group``; every rank of ``group`` calls it with the same ranks.

    ``new_mesh`` is the 1-D mesh over the new holders, and the shards are received straight
    into the model built on it: ``build(mesh)`` returns the model sharded on ``mesh`` with its
    parameters on the meta device, ``make_optimizer(model)`` its optimizer. A new holder
    whose mesh does not exist yet (a planned shrink exchanges on the old group, leavers
    included, before the new one forms) passes None, receives into plain tensors
    (``shards``) and calls :func:`adopt` once it has the mesh. None on a leaver too. The
    old model is not changed: the caller lets it go."""
    import torch.distributed as dist

    rank, world = dist.get_rank(group), dist.get_world_size(group)
    outside = (set(old_ranks) | set(new_ranks)) - set(range(world))
    if outside:
        raise ValueError(f"ranks {sorted(outside)} are not in the exchange group of {world}")
    if (rank in old_ranks) != (model is not None):
        raise ValueError(f"rank {rank}: a model is given exactly on the old holders {old_ranks}")
    if new_mesh is not None and rank not in new_ranks:
        raise ValueError(f"rank {rank} leaves the layout {list(new_ranks)}: it takes no mesh")
    sources: dict[str, Any] = {}
    mine = None
    if model is not None:
        _check_place("old_ranks", old_ranks, rank, mesh_of(model))
        mine, sources = inventory(model, optimizer)
        check_rows(mine, sources, len(old_ranks), list(old_ranks).index(rank))
    manifest = Manifest.from_bytes(broadcast_bytes(
        mine.to_bytes() if mine is not None else None, old_ranks[0], group=group,
        device=device, collective=collective))
    new_model = new_opt = None
    targets: dict[str, Any] = {}
    if new_mesh is not None:
        _check_place("new_ranks", new_ranks, rank, new_mesh)
        new_model, new_opt, targets = rebuild(build, make_optimizer, new_mesh, manifest, device)
        check_rows(manifest, targets, len(new_ranks), list(new_ranks).index(rank))
    elif rank in new_ranks:
        targets = empty_shards(manifest, len(new_ranks), list(new_ranks).index(rank), device)
    size = bucket_bytes or default_bucket_bytes(manifest, max(len(old_ranks), len(new_ranks)))
    traffic = exchange(fsdp_moves(manifest, old_ranks, new_ranks),
                       [e.key for e in manifest.entries], rank, world, sources, targets,
                       bucket_bytes=size, group=group, device=device,
                       collective=collective)
    place = (list(new_ranks).index(rank) if rank in new_ranks else -1, len(new_ranks))
    return Resharded(new_model, new_opt, traffic, local_bytes(sources), local_bytes(targets),
                     {} if new_mesh is not None else targets, manifest, place)


def adopt(done: Resharded, *, build: Callable[[Any], Any], make_optimizer: Callable[[Any], Any],
          mesh: Any, device: Any = "cpu") -> Resharded:
    """Build the model and optimizer on ``mesh`` (the new holders' group, formed since) from
    the shards :func:`reshard_fsdp` received without a mesh. Each received tensor is let go
    once copied in, so this rank holds at most twice its new shard meanwhile."""
    import torch

    if done.manifest is None or not done.shards:
        raise ValueError("nothing to adopt: the re-shard was given a mesh, or this rank left")
    index, count = done.place
    if mesh.ndim != 1 or mesh.size() != count or mesh.get_coordinate()[0] != index:
        raise ValueError(f"the shards are shard {index} of {count}; the mesh {mesh} places "
                         "this rank elsewhere")
    model, optimizer, targets = rebuild(build, make_optimizer, mesh, done.manifest, device)
    with torch.no_grad():
        for key in list(done.shards):
            targets[key].copy_(done.shards.pop(key))
    done.model, done.optimizer = model, optimizer
    return done


def mesh_of(model: Any) -> Any:
    from torch.distributed.tensor import DTensor

    for p in model.parameters():
        if isinstance(p, DTensor):
            return p.device_mesh
    raise ValueError("the model has no sharded parameter: shard it with fully_shard first")


def _check_place(name: str, ranks: Sequence[int], rank: int, mesh: Any) -> None:
    """Shard ``i`` of a 1-D mesh is its process group's rank ``i``, whatever order the mesh's
    ranks were given in (torch 2.13): ``ranks`` must list the holders in that order. Read from
    the mesh's stored coordinate, which outlives a group already let go."""
    if mesh.ndim != 1:
        raise ValueError(f"FSDP across the job needs a 1-D mesh, not {mesh.ndim}-D "
                         "(an HSDP mesh changes its replica count: heal_hsdp)")
    index = mesh.get_coordinate()[0]
    if list(ranks).index(rank) != index:
        raise ValueError(f"{name} {list(ranks)} puts rank {rank} at shard "
                         f"{list(ranks).index(rank)}, but its mesh gives it shard {index}: "
                         "list the holders in the order of the mesh's group")


def check_rows(manifest: Manifest, local: dict[str, Any], count: int, index: int) -> None:
    """The local shards hold the rows :func:`~.plan.shard_rows` says (FSDP2's layout)."""
    for e in manifest.entries:
        if e.kind != SHARD:
            continue
        start, stop = shard_rows(e.rows, count, index)
        got = local[e.key].shape[0]
        if got != stop - start:
            raise ValueError(f"{e.key}: shard {index} of {count} holds {got} rows, "
                             f"not the {stop - start} of FSDP2's layout")
