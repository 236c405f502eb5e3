"""_Pending's hold on the works it issued (quick: stand-in works, no torch)."""

from __future__ import annotations

import threading
import time

import pytest

from malletrain_core.worker import inplace
from malletrain_core.worker.inplace import pending


class Work:
    def __init__(self, done: bool) -> None:
        self.done = done

    def is_completed(self) -> bool:
        return self.done


def test_finished_works_are_let_go_after_a_minute_and_unfinished_ones_never(monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr(pending.time, "monotonic", lambda: clock[0])
    p = inplace._Pending()
    old_done = [Work(True) for _ in range(200)]
    old_hung = [Work(False) for _ in range(10)]
    for w in old_done + old_hung:
        p._keep(w)
    clock[0] += inplace.KEEP_WORKS_S + 1
    recent = [Work(True) for _ in range(100)]
    for w in recent:
        p._keep(w)
    kept = p.release()
    assert all(w in kept for w in old_hung + recent)
    assert not any(w in kept for w in old_done)
    assert p.release() == []


def test_works_of_the_last_minute_are_all_kept(monkeypatch):
    monkeypatch.setattr(pending.time, "monotonic", lambda: 5.0)
    p = inplace._Pending()
    works = [Work(True) for _ in range(1000)]
    for w in works:
        p._keep(w)
    assert p.release() == works


def test_close_waits_for_the_completing_thread() -> None:
    """close() returns only once the thread that completes the hooks' futures has stopped: a
    daemon thread completing a future while the interpreter finalizes aborts the process."""
    p = inplace._Pending()
    p._thread = threading.Thread(target=p._complete, daemon=True, name="malletrain-allreduce")
    p._thread.start()
    p.close()
    assert not p._thread.is_alive()


def test_a_loss_in_an_epoch_left_does_not_fail_the_next_ones_operations() -> None:
    """The heartbeat can find a peer of the epoch this process has just left (its group
    already let go for the next one): that loss must not fail the next epoch's operations."""
    p = inplace._Pending()
    p.reset(4)
    assert not p.abandon("epoch 3: rank 2 has not beaten for 1.3 s", 3)
    assert p.reason is None
    assert p.abandon("epoch 4: rank 1 has not beaten for 1.3 s", 4)
    assert p.reason is not None and "epoch 4" in p.reason
    p.reset(5)
    assert p.reason is None
    assert p.abandon("epoch 6 replaces epoch 5 (a peer was lost)")  # an order: any epoch's


def test_a_store_call_that_hangs_is_given_up_and_the_next_one_runs() -> None:
    """A call to the store of a stopped process never returns: it is waited for only while
    the epoch is wanted, and the calls after it run on a new thread."""
    calls = inplace._StoreCalls()
    assert calls.call(lambda: 41 + 1, lambda: False) == 42
    hang, wanted = threading.Event(), threading.Event()
    wanted.set()
    threading.Timer(0.1, wanted.clear).start()
    t0 = time.monotonic()
    with pytest.raises(inplace._GaveUp):
        calls.call(hang.wait, lambda: not wanted.is_set())
    assert time.monotonic() - t0 < 2.0
    assert calls.call(lambda: "after", lambda: False) == "after"
    with pytest.raises(KeyError):
        calls.call(lambda: {}["missing"], lambda: False)  # the call's own error, raised here
    hang.set()  # the thread left in the hung call ends
