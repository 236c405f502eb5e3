"""HSDP with elastic replicas: a joining replica heals from a surviving one.

The mesh is ``(replicate, shard)``: the processes of a node shard the model among themselves
and nodes are replicas. A grow, a shrink or a lost node changes only the replica count, so
every rank's local shards keep their shape: rank ``i`` of a joining replica receives all of
its state (parameters, optimizer state, ``step``, buffers) whole from rank ``i`` of a
surviving replica (:func:`~.plan.heal_plan` spreads the joiners over the survivors, so several
heal at once from different sources). The survivors move nothing; like the joiners they rebuild
the model on the new mesh, whose replicate dimension has changed, and copy their shards in.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .exchange import Collective, Move, Traffic, broadcast_bytes, exchange, run_collective
from .plan import Source, heal_plan, shard_rows
from .reshard import check_rows, default_bucket_bytes
from .state import SHARD, Manifest, inventory, local_bytes, rebuild


@dataclass
class Healed:
    """The model and optimizer on the new mesh, the rank this one healed from (itself on a
    survivor), and what moved."""

    model: Any
    optimizer: Any
    source: int
    traffic: Traffic
    new_bytes: int

    @property
    def peak_extra_ratio(self) -> float:
        """The exchange's buffers alive at once over this rank's shard (a survivor that
        serves two joiners in one bucket sends its shard twice)."""
        return self.traffic.peak_buffer_bytes / self.new_bytes if self.new_bytes else 0.0


def heal_moves(manifest: Manifest, width: int, sources: Sequence[Source],
               kept: Sequence[tuple[int, int]]) -> list[Move]:
    """Every rank's moves: each entry's local tensor whole from a source to its joiner, and
    from each surviving rank to itself (``kept``: (rank, shard index) pairs), for replicas of
    ``width`` shards."""
    moves: list[Move] = []
    for e in manifest.entries:
        size = e.itemsize
        numel = []
        for i in range(width):
            start, stop = shard_rows(e.rows, width, i) if e.kind == SHARD else (0, e.rows)
            numel.append((stop - start) * e.row_numel)
        moves += [Move(e.key, r, r, 0, 0, numel[i], size) for r, i in kept]
        moves += [Move(e.key, s.src, s.dst, 0, 0, numel[s.shard], size) for s in sources]
    return moves


def heal_hsdp(model: Any, optimizer: Any, *, build: Callable[[Any], Any],
              make_optimizer: Callable[[Any], Any], mesh: Any, survivors: Sequence[int],
              joiners: Sequence[int], device: Any = "cpu", group: Any = None,
              bucket_bytes: int | None = None,
              collective: Collective = run_collective) -> Healed:
    """Rebuild the model on ``mesh`` (2-D, replicate × shard) on every rank and heal the
    ``joiners`` replicas (indices of the mesh's first dimension) from the ``survivors``.

    ``model`` and ``optimizer`` are the old ones on a survivor (sharded over as many ranks
    as a replica of ``mesh`` holds), None on a joiner; ``group`` holds every rank of ``mesh``
    (None: the default group)."""
    import torch.distributed as dist

    layout = mesh.mesh.tolist()
    if group is not None:
        layout = [[dist.get_group_rank(group, r) for r in row] for row in layout]
    if mesh.ndim != 2:
        raise ValueError(f"HSDP needs a 2-D mesh (replicate, shard), not {mesh.ndim}-D")
    if len(layout) != len(survivors) + len(joiners):
        raise ValueError(f"the mesh has {len(layout)} replicas, not {len(survivors)} surviving "
                         f"and {len(joiners)} joining")
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    column = next(row.index(rank) for row in layout if rank in row)
    if mesh.get_coordinate()[1] != column:
        raise ValueError(f"rank {rank} is shard {mesh.get_coordinate()[1]} of its replica but "
                         f"column {column} of the mesh: build the mesh with increasing ranks "
                         "in each replica")
    sources = heal_plan(layout, survivors, joiners)
    kept = [(layout[r][i], i) for r in survivors for i in range(len(layout[r]))]
    if (model is not None) != (rank in {r for r, _ in kept}):
        raise ValueError(f"rank {rank}: a model is given exactly on the surviving replicas")
    width = len(layout[0])
    mine, held = inventory(model, optimizer) if model is not None else (None, {})
    if mine is not None:
        check_rows(mine, held, width, column)
    manifest = Manifest.from_bytes(broadcast_bytes(
        mine.to_bytes() if mine is not None else None, layout[survivors[0]][0], group=group,
        device=device, collective=collective))
    new_model, new_opt, targets = rebuild(build, make_optimizer, mesh, manifest, device)
    source = next((s.src for s in sources if s.dst == rank), rank)
    traffic = exchange(heal_moves(manifest, width, sources, kept),
                       [e.key for e in manifest.entries], rank, world, held, targets,
                       bucket_bytes=bucket_bytes or default_bucket_bytes(manifest, width),
                       group=group, device=device, collective=collective)
    return Healed(new_model, new_opt, source, traffic, local_bytes(targets))


BARRIER_GRACE_S = 3.0
"""How long a rank whose step barrier was abandoned still waits for the barrier's all-reduce
itself (:func:`step_barrier`): a sibling that entered the barrier too makes it finish at once,
one whose reduction failed never does."""


def step_barrier(member: Any, mesh: Any, grace_s: float = BARRIER_GRACE_S) -> None:
    """HSDP, before each optimizer step (an optimizer pre-hook): the processes of a node meet
    in one small all-reduce over their shard group, so that none of them steps unless all of
    them finished the step's gradient reduction. Without it a node's ranks could end a step
    apart when a peer replica was lost during its cross-replica all-reduce (one rank's
    all-reduce had the lost peer's data, its sibling's had not): the surviving replica was then
    not whole at any step and the job went back to its checkpoint (seen on real Slurm, a
    preemption of one of two nodes, 1 run in 3). A sibling whose reduction failed never joins:
    this one waits until the lost peer's epoch is abandoned, and its step is dropped too. The
    shard group is the node's own, so a lost peer elsewhere cannot break the meeting itself.

    The barrier's outcome is its all-reduce's, not the abandonment's: the epoch can be
    abandoned on one sibling while the barrier is in flight and on the other just after its
    barrier finished (the loss is told to each process by its own control thread), and the
    first would drop the step the second took. So an abandoned barrier still waits up to
    ``grace_s`` for its all-reduce, which finishes at once if every sibling entered it (an
    issued gloo operation runs on when its wait is abandoned), and the step goes on if it did.
    The suspected cause of a CI run of the real-Slurm test (HSDP, 2 processes a node) in which
    both survivors of a preemption read the checkpoint; that case's own output was not kept."""
    import functools

    import torch
    import torch.distributed as dist

    if member.local_world <= 1 or member.world <= member.local_world:
        return  # one process per node (nothing to agree within it), or one replica
    t = torch.ones(1, dtype=torch.int64, device=member._device)
    op = functools.partial(dist.all_reduce, group=mesh.get_group("shard"))
    pending = getattr(member, "_pending", None)
    if pending is None:
        member._collective(op, t)
        return
    with pending.shared(grace_s):   # no sibling's connections shut down meanwhile
        pending.wait(pending.track(op(t, async_op=True)), grace_s)
