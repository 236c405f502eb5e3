"""The heartbeat's store calls run on one long-lived thread per epoch watched: many beats
start no new thread, a hung store holds that one thread (and the silence is still found),
and an epoch no longer watched lets its thread end."""

from __future__ import annotations

import threading
import time

from malletrain_core.worker import heartbeat
from malletrain_core.worker.control import Membership
from malletrain_core.worker.heartbeat import Heartbeat, Lost


def _m(epoch: int) -> Membership:
    return Membership(epoch=epoch, rank=0, world=3, master="127.0.0.1", port=29500 + epoch)


class Counting(Heartbeat):
    """Store calls that answer at once (the watched peer beats on), or hang while ``hang`` is
    clear; the threads that made them are recorded."""

    def __init__(self, listed: list[Membership | None]) -> None:
        self.now = 0.0
        self.listed = listed
        self.found: list[Lost] = []
        self.counter = 0
        self.hang = threading.Event()
        self.hang.set()  # set: calls return
        self.callers: set[int] = set()
        super().__init__(lambda: list(self.listed), self.found.append, timeout_s=1.25,
                         clock=lambda: self.now)

    def _calls(self, w, io) -> None:  # type: ignore[no-untyped-def, override]
        self.callers.add(threading.get_ident())
        self.hang.wait()
        self.counter += 1
        io.result, io.done_at = (self.counter, 0), self.now

    def beats(self, n: int) -> None:
        for _ in range(n):
            self.now += heartbeat.PERIOD_S
            self.beat()


def _threads() -> set[str]:
    return {t.name for t in threading.enumerate() if t.name.startswith("malletrain-heartbeat")}


def test_fifty_beats_make_their_calls_on_one_thread() -> None:
    beat = Counting([_m(1)])
    before = threading.active_count()
    beat.beats(50)
    assert len(beat.callers) == 1
    assert threading.active_count() == before + 1
    assert beat.found == [] and beat.counter >= 45
    beat.close()


def test_two_epochs_watched_two_threads_and_a_dropped_one_ends() -> None:
    beat = Counting([_m(1), _m(2)])
    beat.beats(10)
    assert len(beat.callers) == 2
    assert _threads() >= {"malletrain-heartbeat-1", "malletrain-heartbeat-2"}
    beat.listed[:] = [_m(2)]  # formed epoch 2: epoch 1 is no longer watched
    beat.beats(2)
    deadline = time.monotonic() + 5
    while "malletrain-heartbeat-1" in _threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert "malletrain-heartbeat-1" not in _threads()
    beat.close()


def test_a_hung_store_holds_one_thread_and_is_found_silent() -> None:
    beat = Counting([_m(1)])
    beat.beats(3)
    beat.hang.clear()  # the store stops answering: the call in flight never returns
    before = threading.active_count()
    beat.beats(10)
    assert threading.active_count() == before  # no thread per beat piled up
    assert [(lost.epoch, lost.ranks) for lost in beat.found] == [(1, [0])]
    beat.hang.set()
    beat.close()


def test_a_wake_beats_at_once_and_the_epoch_left_lets_its_thread_go(monkeypatch) -> None:
    """After a re-form the process wakes the beat (:meth:`Heartbeat.wake`): the epoch it
    left stops being watched then, not a period later (here the period is 30 s)."""
    monkeypatch.setattr(heartbeat, "PERIOD_S", 30.0)
    beat = Counting([_m(1), _m(2)])
    stop = threading.Event()
    runner = threading.Thread(target=beat.run, args=(stop,), daemon=True)
    runner.start()
    try:
        beat.wake()
        deadline = time.monotonic() + 10
        while len(beat.callers) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(beat.callers) == 2
        beat.listed[:] = [_m(2)]
        beat.wake()
        while "malletrain-heartbeat-1" in _threads() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert "malletrain-heartbeat-1" not in _threads()
    finally:
        stop.set()
        beat.wake()
        runner.join(10)
    assert not runner.is_alive() and "malletrain-heartbeat-2" not in _threads()
