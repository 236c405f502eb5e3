"""The sharded layout plans, pure: FSDP2's dim-0 chunking, re-shard pieces, HSDP heal sources."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from malletrain_core.worker.sharded.plan import (
    chunk_rows,
    heal_plan,
    moved,
    reshard_plan,
    shard_rows,
)


@st.composite
def layouts(draw: st.DrawFn) -> tuple[int, list[int], list[int]]:
    """rows, old holders and new holders (ranks of one exchange group, any order)."""
    rows = draw(st.integers(0, 200))
    world = draw(st.integers(1, 9))
    ranks = list(range(world))
    old = draw(st.permutations(ranks).map(lambda p: p[:draw(st.integers(1, world))]))
    new = draw(st.permutations(ranks).map(lambda p: p[:draw(st.integers(1, world))]))
    return rows, list(old), list(new)


@given(st.integers(0, 500), st.integers(1, 40))
def test_shards_cover_the_rows_in_order_as_torch_chunk_does(rows: int, count: int) -> None:
    spans = [shard_rows(rows, count, i) for i in range(count)]
    assert spans[0][0] == 0 and spans[-1][1] == rows
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:], strict=False))
    size = chunk_rows(rows, count)
    sizes = [b - a for a, b in spans]
    # every non-empty shard but the last is full; the shards past the rows are empty
    filled = [s for s in sizes if s]
    assert all(s == size for s in filled[:-1]) and all(0 < s <= size for s in filled[-1:])
    assert sizes == filled + [0] * (count - len(filled))


@settings(deadline=None)  # the first example imports torch
@given(st.integers(0, 300), st.integers(1, 12))
def test_sizes_match_torch_chunk(rows: int, count: int) -> None:
    torch = pytest.importorskip("torch")
    chunks = list(torch.chunk(torch.arange(rows), count))
    expected = [len(c) for c in chunks] + [0] * (count - len(chunks))
    assert [b - a for a, b in (shard_rows(rows, count, i) for i in range(count))] == expected
    starts = [int(c[0]) for c in chunks if len(c)]
    assert starts == [shard_rows(rows, count, i)[0] for i in range(len(starts))]


@given(layouts())
def test_every_row_lands_exactly_once_from_a_rank_that_held_it(
        layout: tuple[int, list[int], list[int]]) -> None:
    rows, old, new = layout
    plan = reshard_plan(rows, old, new)
    landed = sorted((r, p.dst) for p in plan for r in range(p.start, p.stop))
    expected = sorted((r, dst) for j, dst in enumerate(new)
                      for r in range(*shard_rows(rows, len(new), j)))
    assert landed == expected
    for p in plan:
        assert p.rows > 0
        a, b = shard_rows(rows, len(old), old.index(p.src))
        assert a <= p.start < p.stop <= b


@given(layouts())
def test_nothing_kept_is_sent(layout: tuple[int, list[int], list[int]]) -> None:
    rows, old, new = layout
    plan = reshard_plan(rows, old, new)
    sent = {(p.src, r) for p in moved(plan) for r in range(p.start, p.stop)}
    for rank in set(old) & set(new):
        before = set(range(*shard_rows(rows, len(old), old.index(rank))))
        after = set(range(*shard_rows(rows, len(new), new.index(rank))))
        assert not {(rank, r) for r in before & after} & sent
    assert all(p.src != p.dst for p in moved(plan))


def test_a_two_to_three_grow_moves_only_what_the_new_layout_moves() -> None:
    # 7 rows: old shards [0,4) [4,7); new [0,3) [3,6) [6,7) on ranks 0, 1 and the joiner 2
    plan = reshard_plan(7, [0, 1], [0, 1, 2])
    assert [(p.src, p.dst, p.start, p.stop) for p in moved(plan)] == [
        (0, 1, 3, 4), (1, 2, 6, 7)]
    assert [(p.src, p.start, p.stop) for p in plan if p.kept] == [(0, 0, 3), (1, 4, 6)]


def test_plans_refuse_an_empty_or_repeated_layout() -> None:
    with pytest.raises(ValueError, match="empty"):
        reshard_plan(4, [], [0])
    with pytest.raises(ValueError, match="twice"):
        reshard_plan(4, [0, 0], [1])
    with pytest.raises(ValueError, match="not one of"):
        shard_rows(4, 2, 2)


@st.composite
def replicas(draw: st.DrawFn) -> tuple[list[list[int]], list[int], list[int]]:
    count = draw(st.integers(2, 8))
    width = draw(st.integers(1, 4))
    order = draw(st.permutations(range(count)))
    split = draw(st.integers(1, count - 1))
    layout = [[r * width + i for i in range(width)] for r in range(count)]
    return layout, list(order[:split]), list(order[split:])


@given(replicas())
def test_each_joining_rank_heals_from_the_same_shard_of_a_survivor(
        case: tuple[list[list[int]], list[int], list[int]]) -> None:
    layout, survivors, joiners = case
    plan = heal_plan(layout, survivors, joiners)
    joining = {rank for r in joiners for rank in layout[r]}
    assert sorted(s.dst for s in plan) == sorted(joining)
    where = {rank: (r, i) for r, row in enumerate(layout) for i, rank in enumerate(row)}
    served: dict[int, set[int]] = {r: set() for r in survivors}
    for s in plan:
        (src_r, src_i), (dst_r, dst_i) = where[s.src], where[s.dst]
        assert src_r in survivors and dst_r in joiners
        assert src_i == dst_i == s.shard
        served[src_r].add(dst_r)
    # the joiners are spread: no survivor serves two more than another
    counts = [len(v) for v in served.values()]
    assert max(counts) - min(counts) <= 1
    # a joining replica takes all of its shards from one survivor
    assert len({where[s.src][0] for s in plan if where[s.dst][0] == joiners[0]}) == 1


def test_two_joiners_heal_from_two_survivors_at_once() -> None:
    layout = [[0, 1], [2, 3], [4, 5], [6, 7]]
    plan = heal_plan(layout, survivors=[0, 2], joiners=[1, 3])
    assert [(s.src, s.dst) for s in plan] == [(0, 2), (1, 3), (4, 6), (5, 7)]


def test_heal_refuses_what_it_cannot_do() -> None:
    with pytest.raises(ValueError, match="no surviving replica"):
        heal_plan([[0], [1]], [], [0, 1])
    with pytest.raises(ValueError, match="both survives and joins"):
        heal_plan([[0], [1]], [0], [0])
    with pytest.raises(ValueError, match="different shard counts"):
        heal_plan([[0, 1], [2]], [0], [1])


def test_buckets_keep_the_order_and_the_budget_counting_only_what_travels() -> None:
    from malletrain_core.worker.sharded.exchange import Move, buckets

    moves = [Move("a", 0, 1, 0, 0, 10, 4), Move("b", 1, 1, 0, 0, 500, 4),
             Move("c", 1, 0, 0, 0, 30, 4), Move("d", 0, 2, 0, 0, 5, 4),
             Move("e", 2, 0, 0, 0, 3, 4)]
    # a: 40 bytes, b: kept (0), c: 120 (over the budget: alone), d: 20, e: 12
    assert buckets(moves, "abcde", 64) == [["a", "b"], ["c"], ["d", "e"]]
    assert buckets(moves, "abcde", 10_000) == [list("abcde")]
