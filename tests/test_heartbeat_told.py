"""The heartbeat's bound for an epoch just told: a peer that never beat there (or a store that
never answered) is waited for TOLD_WAIT_S while every epoch watched is sound, since the daemon
may have died between telling two launchers; once a loss is found anywhere, the normal bound."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from malletrain_core.worker import heartbeat
from malletrain_core.worker.control import Membership
from malletrain_core.worker.heartbeat import Heartbeat, Lost


class Scripted(Heartbeat):
    """A heartbeat whose store calls answer from ``counters`` (epoch -> the watched rank's
    counter; an epoch missing from it: the store does not answer), on a clock set by hand."""

    made: list[Heartbeat] = []

    def __init__(self, memberships: list[Membership | None], counters: dict[int, int],
                 beating: tuple[int, ...] = ()) -> None:
        self.now = 0.0
        self.counters = counters
        self.beating = beating  # epochs whose watched peer beats on
        self.found: list[Lost] = []
        super().__init__(lambda: memberships, self.found.append, timeout_s=1.25,
                         clock=lambda: self.now)
        Scripted.made.append(self)

    def _calls(self, w, io) -> None:  # type: ignore[no-untyped-def, override]
        if w.m.epoch in self.beating:
            self.counters[w.m.epoch] += 1
        if w.m.epoch in self.counters:
            io.result, io.done_at = (self.counters[w.m.epoch], 0), self.now

    def run_until(self, t: float) -> None:
        while self.now < t and not self.found:
            self.now += heartbeat.PERIOD_S
            self.beat()


@pytest.fixture(autouse=True)
def _close_callers() -> Iterator[None]:
    """End the store-call threads each test's heartbeats started (test_heartbeat_thread.py
    counts the threads by name)."""
    yield
    while Scripted.made:
        Scripted.made.pop().close()


def _m(epoch: int) -> Membership:
    return Membership(epoch=epoch, rank=0, world=3, master="127.0.0.1", port=29500 + epoch)


def test_a_peer_not_yet_told_is_waited_for_while_the_old_epoch_is_sound() -> None:
    beat = Scripted([_m(1), _m(2)], {1: 0, 2: 0}, beating=(1,))  # the new one's never beat
    beat.run_until(heartbeat.TOLD_WAIT_S - 1.0)
    assert beat.found == []
    beat.run_until(heartbeat.TOLD_WAIT_S + 1.0)
    assert [(lost.epoch, lost.ranks) for lost in beat.found] == [(2, [1])]


def test_a_store_not_yet_listening_is_waited_for_likewise() -> None:
    beat = Scripted([None, _m(2)], {})  # nothing formed yet; epoch 2 told
    beat.run_until(heartbeat.TOLD_WAIT_S - 1.0)
    assert beat.found == []
    beat.run_until(heartbeat.TOLD_WAIT_S + 1.0)
    assert [(lost.epoch, lost.ranks) for lost in beat.found] == [(2, [0])]


def test_once_the_old_epoch_finds_the_peer_silent_the_new_one_names_it_at_once() -> None:
    beat = Scripted([_m(1), _m(2)], {1: 5, 2: 0})  # the old epoch's counter stops: stopped
    beat.run_until(3.0)  # found in the old epoch, then named in the new one in that beat
    assert [(lost.epoch, lost.ranks) for lost in beat.found] == [(1, [1]), (2, [1])]
    assert beat.now <= 1.25 + 2 * heartbeat.PERIOD_S + 1e-9


def test_no_connection_to_the_store_of_an_epoch_let_go_since_the_beat_began() -> None:
    """Between a beat's reading of the epochs and its connecting, the epoch can stop being
    watched (the process formed the next one; rank 0 shuts its store down): the connection is
    not made, as one made to a store being shut down held that shut-down 5 s."""
    listed = [_m(1), _m(2)]
    hosted: list[int] = []
    beat = Heartbeat(lambda: list(listed), lambda lost: None, timeout_s=1.25,
                     host=lambda m: hosted.append(m.epoch))
    watch = heartbeat._Watch(_m(1), moved_at=0.0, answered_at=0.0)
    listed[0] = None  # epoch 1 let go: the process now watches epoch 2 only
    with pytest.raises(OSError, match="epoch 1 is no longer watched"):
        beat._store(watch)
    assert hosted == [] and watch.client is None


def test_the_epoch_formed_is_judged_by_the_normal_bound_even_if_never_heard() -> None:
    """A process that trained a few steps in its epoch before its first beat was answered (a
    busy machine), whose rank 0 then stopped as the next epoch was told: the store of the
    epoch it formed is silent after the normal bound, not TOLD_WAIT_S (every member met at
    that store to form the group). Before: both epochs waited TOLD_WAIT_S (10.0 s in CI)."""
    beat = Scripted([_m(1), _m(2)], {})  # neither store ever answers this watcher
    beat.run_until(3.0)  # found in the epoch formed, then in the new one in that beat
    assert [(lost.epoch, lost.ranks) for lost in beat.found] == [(1, [0]), (2, [0])]
    assert beat.now <= 1.25 + 2 * heartbeat.PERIOD_S + 1e-9


def test_a_peer_of_the_epoch_formed_that_never_beat_is_found_in_the_normal_bound() -> None:
    beat = Scripted([_m(1)], {1: 0})  # the watched peer's counter never moves from 0
    beat.run_until(3.0)
    assert [(lost.epoch, lost.ranks) for lost in beat.found] == [(1, [1])]
    assert beat.now <= 1.25 + 2 * heartbeat.PERIOD_S + 1e-9


def test_a_joiner_that_had_not_beaten_when_the_group_formed_gets_the_normal_bound_from_then() -> None:
    """A survivor told epoch 2 seconds before its joiner started forms the group with it; the
    joiner's first beat comes 0.6 s after. Before: the silence was counted from the moment the
    survivor first read the joiner's counter (0), so the joiner was lost the moment the group
    formed and the bound fell from TOLD_WAIT_S to the normal one."""
    listed: list[Membership | None] = [None, _m(2)]
    found: list[Lost] = []
    clock = [0.0]
    counter = [0]
    beat = Heartbeat(lambda: list(listed), found.append, timeout_s=1.25, clock=lambda: clock[0])

    def calls(w, io) -> None:  # type: ignore[no-untyped-def]
        io.result, io.done_at = (counter[0], 0), clock[0]

    beat._calls = calls  # type: ignore[method-assign]

    def run(until: float) -> None:
        while clock[0] < until - 1e-9 and not found:
            clock[0] += heartbeat.PERIOD_S
            beat.beat()

    run(4.0)                    # told, waiting for the joiner (never beaten): TOLD_WAIT_S
    assert found == []
    listed[:] = [_m(2), None]   # the group of epoch 2 is formed
    run(4.6)
    assert found == []          # lost at once here before
    counter[0] = 1              # the joiner's first beat
    run(7.0)                    # ... and then it stops: found within the normal bound
    assert [(lost.epoch, lost.ranks) for lost in found] == [(2, [1])]
    assert clock[0] <= 4.6 + 1.25 + 2 * heartbeat.PERIOD_S + 1e-9
    beat.close()


def test_a_store_that_listens_but_never_answers_gets_the_normal_bound_from_then() -> None:
    """Its host was told (nothing listens before) and is hung (SIGSTOP after listening: the
    kernel still accepts): lost 1.25 s after the first accepted connection, not TOLD_WAIT_S."""
    beat = Scripted([None, _m(2)], {})  # the store never answers

    def calls(w, io) -> None:  # type: ignore[no-untyped-def]
        if beat.now >= 3.0 and w.listening_at is None:
            w.listening_at = beat.now  # it starts listening at t = 3 s

    beat._calls = calls  # type: ignore[method-assign]
    beat.run_until(heartbeat.TOLD_WAIT_S)
    assert [(lost.epoch, lost.ranks) for lost in beat.found] == [(2, [0])]
    assert 3.0 + 1.25 < beat.now <= 3.0 + 1.25 + 2 * heartbeat.PERIOD_S + 1e-9
