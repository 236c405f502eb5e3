"""FSDP across the job: a second holder for every shard, so that a member lost without
warning costs a few steps, not a read of the last checkpoint.

Every ``every`` steps (and at the first step agreement after each change), at the step
agreement, each rank copies its local shards (parameters, optimizer state, buffers) into host
memory and sends them to its *buddy*, the rank of the same local index on the next node
(``(rank + width) % world``, ``width`` the processes of a node), which keeps them in host
memory too: :func:`refresh`. Each rank so holds, beside its live shard, two copies of one
step: its own and its *ward*'s (``(rank - width) % world``). On the GPU both are host memory;
the refresh's only device memory is its exchange buckets.

When a member is lost without warning, its live shard is gone, but the copies of every shard
at the last refresh still exist as long as no shard lost both holders at once (two adjacent
nodes). The new group then rolls back to that step: :func:`choose` finds a step at which every
shard of the layout is held (own copy first, else the buddy's), :func:`restore_moves` plans
its re-shard from those holders to the new world, the non-sharded part (step, samples,
scheduler, extras, RNG) comes from a holder's copy of that step, and the steps since are
trained again, on the same data. A preemption costs the steps since the last refresh: at most
``every - 1``, ``(every - 1) / 2`` on average.

A refresh that a loss interrupts can leave some ranks with the new step and others without
it, so each rank keeps its copies of the step before until every member has finished the
refresh (one small all-reduce after it, :meth:`BuddyCopies.take`): a rank that let the older
copies go knows that every member holds the newer ones. :func:`choose` takes the newest step
at which every shard is held; none is only when a shard lost both its holders (two adjacent
nodes lost), and the checkpoint is read then. Seen on real Slurm before the older copies
were kept (a CI run of the real-Slurm test): a preemption that landed during the refresh of
step 218 (every fifth step refreshes) sent the job back to its checkpoint, here step 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .exchange import Collective, Move, Traffic, exchange, run_collective
from .plan import reshard_plan, shard_rows
from .state import SHARD, Entry, Manifest, empty_shards, inventory

OWN = "own/"
"""The prefix of this rank's own copy in the sources of a restore."""
WARD = "ward/"
"""The prefix of the ward's copy."""


@dataclass
class Snapshot:
    """One rank's copies of step ``step``: its own shard ``index`` of ``count`` and its
    ward's (shard ``ward``, -1 for none), both on the host; the manifest of the state and
    the non-sharded part (``rest``: ``torch.save`` bytes) at that step."""

    step: int
    index: int
    count: int
    own: dict[str, Any]
    ward: int
    copy: dict[str, Any]
    manifest: Manifest
    rest: bytes
    traffic: Traffic = field(default_factory=Traffic)

    def row(self) -> list[int]:
        """What this rank tells the others: (step, own index, count, ward index)."""
        return [self.step, self.index, self.count, self.ward]

    def sources(self) -> dict[str, Any]:
        out = {OWN + k: t for k, t in self.own.items()}
        out.update({WARD + k: t for k, t in self.copy.items()})
        return out

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size()
                   for d in (self.own, self.copy) for t in d.values())


NO_SNAPSHOT = [-1, -1, 0, -1]
"""The row of a rank that holds no copy."""


def buddy_of(rank: int, world: int, width: int) -> int:
    """The rank that keeps ``rank``'s copy: the same local index on the next node."""
    return (rank + width) % world


def ward_of(rank: int, world: int, width: int) -> int:
    """The rank whose copy ``rank`` keeps."""
    return (rank - width) % world


def has_buddies(world: int, width: int) -> bool:
    """Whether a buddy is on another node: at least two whole nodes."""
    return width >= 1 and world >= 2 * width and world % width == 0


def _numel(e: Entry, count: int, index: int) -> int:
    if e.kind != SHARD:
        return e.rows * e.row_numel
    start, stop = shard_rows(e.rows, count, index)
    return (stop - start) * e.row_numel


def refresh_moves(manifest: Manifest, world: int, width: int) -> list[Move]:
    """Every rank's whole local state to its buddy."""
    return [Move(e.key, r, buddy_of(r, world, width), 0, 0, _numel(e, world, r), e.itemsize)
            for e in manifest.entries for r in range(world)]


def refresh(model: Any, optimizer: Any, *, rank: int, world: int, width: int, step: int,
            rest: bytes, device: Any = "cpu", bucket_bytes: int = 1 << 24,
            collective: Collective = run_collective) -> Snapshot:
    """This rank's new :class:`Snapshot` of step ``step`` (every rank of the group calls it
    at the same step, with the model sharded as shard ``rank`` of ``world``): its ward's
    shards received over the group, its own copied to the host."""
    manifest, local = inventory(model, optimizer)
    ward = ward_of(rank, world, width)
    copy = empty_shards(manifest, world, ward, "cpu")
    traffic = exchange(refresh_moves(manifest, world, width), [e.key for e in manifest.entries],
                       rank, world, local, copy, bucket_bytes=bucket_bytes, device=device,
                       collective=collective)
    own = {k: t.detach().to("cpu", copy=True) for k, t in local.items()}
    return Snapshot(step, rank, world, own, ward, copy, manifest, rest, traffic)


@dataclass(frozen=True)
class Holders:
    """A step every shard of a ``count``-shard layout is held at: ``by_shard[i]`` is (the
    rank holding shard ``i``, :data:`OWN` or :data:`WARD`)."""

    step: int
    count: int
    by_shard: tuple[tuple[int, str], ...]


def _snapshots(row: Sequence[int]) -> list[Sequence[int]]:
    """The :meth:`Snapshot.row` s one member sent (:meth:`BuddyCopies.row`: any number)."""
    if len(row) % len(NO_SNAPSHOT):
        raise ValueError(f"a copies row of {len(row)} values: give {len(NO_SNAPSHOT)} per "
                         "snapshot (step, own index, count, ward index)")
    n = len(NO_SNAPSHOT)
    return [row[i:i + n] for i in range(0, len(row), n)]


def choose(rows: Sequence[Sequence[int]]) -> Holders | None:
    """The newest step at which every shard of one layout is held, from every member's
    :meth:`BuddyCopies.row` (its snapshots' :meth:`Snapshot.row` one after the other,
    :data:`NO_SNAPSHOT` for none); None when there is none."""
    held_by = [_snapshots(r) for r in rows]
    steps = sorted({s[0] for snaps in held_by for s in snaps if s[0] >= 0}, reverse=True)
    for step in steps:
        at = [next((s for s in snaps if s[0] == step), None) for snaps in held_by]
        counts = {s[2] for s in at if s is not None}
        if len(counts) != 1 or min(counts) < 1:
            continue
        count = counts.pop()
        held: dict[int, tuple[int, str]] = {}
        for rank, s in enumerate(at):
            if s is not None and 0 <= s[1] < count:
                held[s[1]] = (rank, OWN)
        for rank, s in enumerate(at):
            if s is not None and 0 <= s[3] < count:
                held.setdefault(s[3], (rank, WARD))
        if len(held) == count:
            return Holders(step, count, tuple(held[i] for i in range(count)))
    return None


def restore_moves(manifest: Manifest, holders: Holders, new_ranks: Sequence[int],
                  world: int) -> list[Move]:
    """The moves that re-shard the copies of ``holders.step`` to ``new_ranks``: the rows of
    each sharded entry from the holder of their old shard (:func:`~.plan.reshard_plan` over
    stand-in ranks, one per old shard, then named by their holders), each whole entry to
    every new holder from its own copy if it has one, else from the holders in turn."""
    n = holders.count
    stand_in = list(range(world, world + n))   # never a rank of the group
    moves: list[Move] = []
    own_at = {rank: i for i, (rank, kind) in enumerate(holders.by_shard) if kind == OWN}
    for e in manifest.entries:
        size = e.itemsize
        if e.kind == SHARD:
            for p in reshard_plan(e.rows, stand_in, new_ranks):
                i = p.src - world
                src, kind = holders.by_shard[i]
                old_start = shard_rows(e.rows, n, i)[0]
                new_start = shard_rows(e.rows, len(new_ranks), list(new_ranks).index(p.dst))[0]
                moves.append(Move(e.key, src, p.dst, (p.start - old_start) * e.row_numel,
                                  (p.start - new_start) * e.row_numel, p.rows * e.row_numel,
                                  size, kind + e.key))
            continue
        numel = e.rows * e.row_numel
        for k, r in enumerate(new_ranks):
            src, kind = (r, OWN) if r in own_at else holders.by_shard[k % n]
            moves.append(Move(e.key, src, r, 0, 0, numel, size, kind + e.key))
    return moves


def restore(snapshot: Snapshot | None, holders: Holders, manifest: Manifest, *,
            targets: dict[str, Any], rank: int, world: int, new_ranks: Sequence[int],
            device: Any = "cpu", bucket_bytes: int = 1 << 24,
            collective: Collective = run_collective) -> Traffic:
    """Fill ``targets`` (this rank's new local tensors, of shard ``new_ranks.index(rank)``)
    from the copies of ``holders.step``; every rank of the group calls it."""
    sources = snapshot.sources() if snapshot is not None and \
        snapshot.step == holders.step else {}
    return exchange(restore_moves(manifest, holders, new_ranks, world),
                    [e.key for e in manifest.entries], rank, world, sources, targets,
                    bucket_bytes=bucket_bytes, device=device, collective=collective)


class BuddyCopies:
    """One rank's copies (:class:`Snapshot`), refreshed every ``every`` steps (0: never) and
    at the first step agreement after a change; :attr:`last` says what the last refresh
    cost. The copies of the step before (:attr:`previous`) are kept until every member has
    finished the refresh, so a loss during it rolls back one refresh further, not to the
    checkpoint: the host holds two shards' worth between refreshes, four during one."""

    def __init__(self, every: int) -> None:
        if every < 0:
            raise ValueError(f"buddy_every={every}: give the steps between two refreshes of "
                             "the buddy copies (0: none, a lost member reads the checkpoint)")
        self.every = every
        self.snapshot: Snapshot | None = None
        self.previous: Snapshot | None = None
        self.last: dict[str, Any] = {}

    def row(self) -> list[int]:
        """What this rank tells the others: its newest snapshot's row, then the previous's."""
        return [*(self.snapshot.row() if self.snapshot is not None else NO_SNAPSHOT),
                *(self.previous.row() if self.previous is not None else NO_SNAPSHOT)]

    def at(self, step: int) -> Snapshot | None:
        """This rank's snapshot of ``step``, if it holds one."""
        return next((s for s in (self.snapshot, self.previous)
                     if s is not None and s.step == step), None)

    def due(self, step: int, world: int, width: int) -> bool:
        """Whether the group refreshes at ``step`` (the same answer on every member)."""
        return self.every > 0 and has_buddies(world, width) and (
            self.snapshot is None or step - self.snapshot.step >= self.every)

    def take(self, model: Any, optimizer: Any, *, rank: int, world: int, width: int,
             step: int, rest: bytes, device: Any, bucket_bytes: int | None,
             collective: Collective) -> None:
        import time

        import torch
        import torch.distributed as dist

        # kept until every member holds the new copies: a loss meanwhile rolls back to it
        self.previous, self.snapshot = self.snapshot, None
        t0 = time.monotonic()
        size = bucket_bytes or 1 << 24
        snap = refresh(model, optimizer, rank=rank, world=world, width=width, step=step,
                       rest=rest, device=device, bucket_bytes=size, collective=collective)
        self.snapshot = snap
        # every member's refresh returned (it holds its own and its ward's new copies) once
        # this all-reduce does on any member: the older copies are not needed then
        collective(dist.all_reduce, torch.zeros(1, dtype=torch.int64, device=device))
        self.previous = None
        self.last = {"step": step, "s": round(time.monotonic() - t0, 4),
                     "sent_bytes": snap.traffic.sent_bytes, "host_bytes": snap.nbytes}

    def drop(self) -> None:
        self.snapshot = self.previous = None
