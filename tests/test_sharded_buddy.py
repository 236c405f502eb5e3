"""The buddy copies' plans (pure): who keeps whose copy, which step a lost member's group can
roll back to, and the moves that re-shard the copies to the new world, checked element by
element against the rows each old shard holds."""

from __future__ import annotations

import pytest

from malletrain_core.worker.sharded.buddy import (
    NO_SNAPSHOT,
    OWN,
    WARD,
    BuddyCopies,
    Holders,
    Snapshot,
    buddy_of,
    choose,
    has_buddies,
    refresh_moves,
    restore_moves,
    ward_of,
)
from malletrain_core.worker.sharded.plan import shard_rows
from malletrain_core.worker.sharded.state import SHARD, WHOLE, Entry, Manifest

MANIFEST = Manifest([Entry("p/w", SHARD, "float32", (7, 3)),      # uneven rows
                     Entry("p/b", SHARD, "float32", (2,)),        # empty shards past 2
                     Entry("o/w/step", WHOLE, "float32", ()),
                     Entry("b/mean", WHOLE, "float32", (4,))])


def test_the_buddy_is_on_the_next_node_and_every_rank_is_a_ward_once() -> None:
    for world, width in [(2, 1), (3, 1), (4, 2), (6, 2)]:
        buddies = [buddy_of(r, world, width) for r in range(world)]
        assert sorted(buddies) == list(range(world))
        assert all(b // width != r // width for r, b in enumerate(buddies))
        assert all(ward_of(b, world, width) == r for r, b in enumerate(buddies))
    assert not has_buddies(2, 2) and not has_buddies(1, 1) and has_buddies(4, 2)


def test_refresh_sends_each_rank_its_whole_local_state_once() -> None:
    moves = refresh_moves(MANIFEST, 3, 1)
    for r in range(3):
        sent = {m.key: m.numel for m in moves if m.src == r}
        start, stop = shard_rows(7, 3, r)
        assert sent["p/w"] == (stop - start) * 3
        assert {m.dst for m in moves if m.src == r} == {(r + 1) % 3}


def rows_of(step: int, index: int, count: int, ward: int) -> list[int]:
    return [step, index, count, ward]


def test_choose_prefers_own_copies_and_takes_a_lost_shard_from_its_buddy() -> None:
    # three members at step 9 of a 3-shard layout: rank 1 (shard 1) was lost; the survivors,
    # renumbered 0 and 1, held shards 0 and 2 and the copies of shards 2 and 1
    got = choose([rows_of(9, 0, 3, 2), rows_of(9, 2, 3, 1)])
    assert got == Holders(9, 3, ((0, OWN), (1, WARD), (1, OWN)))


def test_no_step_when_a_shard_lost_both_holders() -> None:
    # 4 shards; shards 1 and 2 lost together (adjacent nodes): shard 1's copy was on 2
    assert choose([rows_of(5, 0, 4, 3), rows_of(5, 3, 4, 2)]) is None
    assert choose([NO_SNAPSHOT, NO_SNAPSHOT]) is None


def test_a_refresh_cut_short_falls_back_to_the_older_whole_step() -> None:
    # a refresh that reached some ranks only: the newer step is taken where it is whole...
    assert choose([rows_of(12, 0, 2, 1), rows_of(8, 1, 2, 0)]) == \
        Holders(12, 2, ((0, OWN), (0, WARD)))
    # ...the older one where only it is; neither: none
    assert choose([rows_of(12, 0, 3, 2), rows_of(8, 1, 3, 0), rows_of(8, 2, 3, 1)]) == \
        Holders(8, 3, ((1, WARD), (1, OWN), (2, OWN)))
    assert choose([rows_of(12, 0, 3, 2), NO_SNAPSHOT]) is None
    got = choose([rows_of(12, 0, 2, 1), NO_SNAPSHOT])   # a 2-shard layout, rank 0 holds both
    assert got == Holders(12, 2, ((0, OWN), (0, WARD)))


@pytest.mark.parametrize("holders,new", [
    (Holders(9, 3, ((0, OWN), (1, WARD), (1, OWN))), [0, 1]),
    (Holders(9, 2, ((0, OWN), (0, WARD))), [0]),
    (Holders(9, 4, ((0, OWN), (0, WARD), (1, OWN), (2, OWN))), [0, 1, 2]),
    (Holders(9, 3, ((0, OWN), (1, WARD), (1, OWN))), [0, 1, 2, 3]),  # and a joiner
])
def test_restore_fills_every_new_shard_once_from_the_old_shards_rows(holders, new) -> None:
    world = len(new)
    moves = restore_moves(MANIFEST, holders, new, world)
    for e in MANIFEST.entries:
        for j, r in enumerate(new):
            into = sorted((m.dst_at, m.numel, m) for m in moves if m.key == e.key and m.dst == r)
            if e.kind == SHARD:
                start, stop = shard_rows(e.rows, world, j)
                want = (stop - start) * e.row_numel
            else:
                want = e.rows * e.row_numel
            at = 0
            for dst_at, numel, m in into:
                assert dst_at == at, (e.key, r, into)
                at += numel
                kind = m.src_key[:len(OWN)] if m.src_key.startswith(OWN) else WARD
                assert m.src_key == kind + e.key
                assert (m.src, kind) in holders.by_shard or (kind == OWN and m.src == r)
                if e.kind == SHARD:   # the source range lies inside the holder's old shard
                    i = holders.by_shard.index((m.src, kind))
                    lo, hi = shard_rows(e.rows, holders.count, i)
                    assert m.src_at + m.numel <= (hi - lo) * e.row_numel
                    # and is the rows the new shard needs: global row of the first element
                    assert lo + m.src_at // e.row_numel == start + m.dst_at // e.row_numel
            assert at == want, (e.key, r, at, want)


def test_copies_are_due_every_n_steps_and_after_a_change() -> None:
    copies = BuddyCopies(5)
    assert copies.due(0, 2, 1) and not copies.due(0, 1, 1) and not copies.due(0, 2, 2)
    assert not BuddyCopies(0).due(0, 4, 1)
    with pytest.raises(ValueError, match="buddy_every=-1"):
        BuddyCopies(-1)


def test_a_refresh_cut_short_keeps_the_older_copies_until_every_member_holds_the_new() -> None:
    # two snapshots a rank: the new step where its refresh returned, the older one kept
    # until the all-reduce after it; a 2-rank layout, rank 1 lost during the refresh of 218
    done, cut = [218, 0, 2, 1, 213, 0, 2, 1], [*NO_SNAPSHOT, 213, 0, 2, 1]
    assert choose([done]) == Holders(218, 2, ((0, OWN), (0, WARD)))
    assert choose([cut]) == Holders(213, 2, ((0, OWN), (0, WARD)))
    # 3 ranks, rank 1 lost: rank 0's refresh returned, rank 2's did not; 218 lacks shard 2
    assert choose([[218, 0, 3, 2, 213, 0, 3, 2], [*NO_SNAPSHOT, 213, 2, 3, 1]]) == \
        Holders(213, 3, ((0, OWN), (1, WARD), (1, OWN)))
    with pytest.raises(ValueError, match="4 per snapshot"):
        choose([[218, 0, 2]])


class _Lost(RuntimeError):
    pass


def _snapshot(step: int) -> Snapshot:
    return Snapshot(step, 0, 2, {}, 1, {}, MANIFEST, b"")


def test_take_keeps_the_previous_copies_when_the_refresh_or_its_all_reduce_fails(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from malletrain_core.worker.sharded import buddy

    copies = BuddyCopies(5)
    copies.snapshot = _snapshot(213)
    kw = {"rank": 0, "world": 2, "width": 1, "rest": b"", "device": "cpu", "bucket_bytes": None}

    def lost(*_: object, **__: object) -> None:
        raise _Lost("peer lost")

    monkeypatch.setattr(buddy, "refresh", lost)     # the exchange fails: 213 only
    with pytest.raises(_Lost):
        copies.take(None, None, step=218, collective=lost, **kw)
    assert copies.row() == [*NO_SNAPSHOT, 213, 0, 2, 1] and copies.at(213) is not None
    monkeypatch.setattr(buddy, "refresh", lambda *_, step, **__: _snapshot(step))
    copies.snapshot, copies.previous = copies.previous, None
    with pytest.raises(_Lost):                      # the exchange returned, the all-reduce not
        copies.take(None, None, step=218, collective=lost, **kw)
    assert copies.row() == [218, 0, 2, 1, 213, 0, 2, 1]
    assert copies.at(218) is copies.snapshot and copies.at(213) is copies.previous
    copies.snapshot, copies.previous = copies.previous, None
    copies.take(None, None, step=218, collective=lambda *_: None, **kw)   # every member's did
    assert copies.row() == [218, 0, 2, 1, *NO_SNAPSHOT] and copies.at(213) is None
    copies.drop()
    assert copies.row() == [*NO_SNAPSHOT, *NO_SNAPSHOT]
