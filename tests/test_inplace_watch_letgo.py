"""The heartbeat's view of a re-forming process (``ControlWatch.watched``): once the process has
torn its group down to re-form, that epoch is no longer watched, so the silence of the store
its rank 0 shut down as it left is never taken for a lost peer."""

from __future__ import annotations

from malletrain_core.worker.control import Membership
from malletrain_core.worker.heartbeat import TOLD_WAIT_S, Heartbeat, Lost
from malletrain_core.worker.inplace.pending import _Pending
from malletrain_core.worker.inplace.watch import ControlWatch


def _m(epoch: int, world: int) -> Membership:
    return Membership(epoch=epoch, rank=1, world=world, master="127.0.0.1", port=29500 + epoch)


def _watch(group: list[tuple[int | None, int, int]]) -> ControlWatch:
    return ControlWatch(None, 0, 1, 0.1, 5.0, _Pending(), lambda: group[0],
                        host=lambda m: None, leave=lambda code, why: None)


def test_the_epoch_let_go_is_no_longer_watched() -> None:
    group: list[tuple[int | None, int, int]] = [(0, 1, 2)]
    w = _watch(group)
    for m in (_m(0, 2), _m(1, 3)):
        w._remember(m)
        w._latest = m
    assert [m.epoch if m else None for m in w.watched()] == [0, 1]
    w.let_go = 0                      # the group of epoch 0 torn down: re-forming into 1
    assert [m.epoch if m else None for m in w.watched()] == [None, 1]
    group[0] = (1, 1, 3)              # epoch 1 formed
    assert [m.epoch if m else None for m in w.watched()] == [1, None]


def test_a_reform_waiting_for_a_joiner_not_told_keeps_the_told_wait() -> None:
    """The survivors of epoch 0 were told epoch 1 and let their group go; the daemon died
    before telling the joiner. Epoch 0's store no longer answers (its rank 0 shut it down) and
    the joiner never beats in epoch 1: nothing is lost before TOLD_WAIT_S. Before, epoch 0's
    silent store was a loss after 1.25 s, and the joiner was lost 1.4 s after that."""
    group: list[tuple[int | None, int, int]] = [(0, 1, 2)]
    w = _watch(group)
    for m in (_m(0, 2), _m(1, 3)):
        w._remember(m)
        w._latest = m
    w.let_go = 0
    found: list[Lost] = []
    now = [0.0]
    beat = Heartbeat(w.watched, found.append, timeout_s=1.25, clock=lambda: now[0])

    def calls(watch, io) -> None:  # type: ignore[no-untyped-def]
        if watch.m.epoch == 1:        # epoch 1's store answers; the joiner's counter stays 0
            io.result, io.done_at = (0, 0), now[0]

    beat._calls = calls  # type: ignore[method-assign]
    try:
        while now[0] < TOLD_WAIT_S - 1.0 and not found:
            now[0] += 0.2
            beat.beat()
        assert found == []
        while now[0] < TOLD_WAIT_S + 1.0 and not found:
            now[0] += 0.2
            beat.beat()
        assert [(lost.epoch, lost.ranks) for lost in found] == [(1, [2])]
    finally:
        beat.close()
