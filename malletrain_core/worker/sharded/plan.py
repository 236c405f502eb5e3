"""Where each piece of a sharded state goes when the layout changes: pure, no torch.

FSDP2 (``fully_shard``) splits a parameter's dim 0 as ``torch.chunk`` does: every shard holds
``ceil(rows / count)`` rows except that the last non-empty one holds what is left, and the
shards past the end of the rows are empty (FSDP pads each shard to the first one's size
inside its own storage; the padding is not data and never moves). :func:`reshard_plan` turns
a change of the shard count into the row ranges that go from an old holder to a new one;
:func:`heal_plan` picks, for each rank of a joining HSDP replica, the rank of a surviving
replica with the same shard index, spreading the joiners over the survivors.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


def chunk_rows(rows: int, count: int) -> int:
    """The rows of a full shard (the first one's: what FSDP pads every shard to)."""
    if count < 1 or rows < 0:
        raise ValueError(f"cannot split {rows} rows into {count} shards")
    return -(-rows // count)


def shard_rows(rows: int, count: int, index: int) -> tuple[int, int]:
    """The rows ``[start, stop)`` that shard ``index`` of ``count`` holds (may be empty)."""
    if not 0 <= index < count:
        raise ValueError(f"shard {index} is not one of {count}")
    size = chunk_rows(rows, count)
    return min(index * size, rows), min((index + 1) * size, rows)


@dataclass(frozen=True)
class Piece:
    """Rows ``[start, stop)`` of the whole tensor, held by rank ``src`` in the old layout and
    by rank ``dst`` in the new one (ranks of the group the exchange runs on). A piece whose
    ``src`` is its ``dst`` stays where it is: it is copied locally, never sent."""

    src: int
    dst: int
    start: int
    stop: int

    @property
    def rows(self) -> int:
        return self.stop - self.start

    @property
    def kept(self) -> bool:
        return self.src == self.dst


def _check_ranks(name: str, ranks: Sequence[int]) -> None:
    if not ranks:
        raise ValueError(f"{name} is empty: a layout needs at least one holder")
    if len(set(ranks)) != len(ranks):
        raise ValueError(f"{name} names a rank twice: {list(ranks)}")


def reshard_plan(rows: int, old_ranks: Sequence[int], new_ranks: Sequence[int]) -> list[Piece]:
    """The pieces of a tensor of ``rows`` rows sharded on dim 0 over ``old_ranks`` (shard
    ``i`` on ``old_ranks[i]``) that make it sharded over ``new_ranks``: every row of the
    tensor is in exactly one piece, ordered by new shard, then by old shard."""
    _check_ranks("old_ranks", old_ranks)
    _check_ranks("new_ranks", new_ranks)
    old = [shard_rows(rows, len(old_ranks), i) for i in range(len(old_ranks))]
    pieces: list[Piece] = []
    for j, dst in enumerate(new_ranks):
        lo, hi = shard_rows(rows, len(new_ranks), j)
        for i, (a, b) in enumerate(old):
            start, stop = max(lo, a), min(hi, b)
            if start < stop:
                pieces.append(Piece(old_ranks[i], dst, start, stop))
    return pieces


def moved(plan: Sequence[Piece]) -> list[Piece]:
    """The pieces that travel from one rank to another."""
    return [p for p in plan if not p.kept]


@dataclass(frozen=True)
class Source:
    """Rank ``dst`` of a joining replica takes its shards from rank ``src`` of a surviving
    replica; both hold shard ``shard`` of the replica's layout."""

    src: int
    dst: int
    shard: int


def heal_plan(layout: Sequence[Sequence[int]], survivors: Sequence[int],
              joiners: Sequence[int]) -> list[Source]:
    """For every rank of the ``joiners`` replicas, the rank that sends it its shards.

    ``layout[r][i]`` is the rank holding shard ``i`` in replica ``r`` (the rows of an HSDP
    mesh ``(replicate, shard)``). Joiner ``k`` (in the order given) is served by survivor
    ``k mod len(survivors)``, so each survivor serves at most one joiner more than another
    and several joiners are healed from different survivors at once."""
    replicas = len(layout)
    width = {len(row) for row in layout}
    if len(width) != 1:
        raise ValueError(f"the replicas hold different shard counts: {sorted(width)}")
    for name, group in (("survivors", survivors), ("joiners", joiners)):
        if len(set(group)) != len(group) or any(not 0 <= r < replicas for r in group):
            raise ValueError(f"{name} {list(group)} are not distinct replicas of 0..{replicas - 1}")
    if set(survivors) & set(joiners):
        raise ValueError(f"a replica both survives and joins: {sorted(set(survivors) & set(joiners))}")
    if joiners and not survivors:
        raise ValueError("no surviving replica to heal the joiners from (read the checkpoint)")
    return [Source(layout[survivors[k % len(survivors)]][i], layout[r][i], i)
            for k, r in enumerate(joiners) for i in range(len(layout[r]))]
