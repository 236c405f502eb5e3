"""_Pending's hold on the works it issued (quick: stand-in works, no torch)."""

from __future__ import annotations

import threading

from malletrain_core.worker import inplace


class Work:
    def __init__(self, done: bool) -> None:
        self.done = done

    def is_completed(self) -> bool:
        return self.done


def test_finished_works_are_let_go_after_a_minute_and_unfinished_ones_never(monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr(inplace.time, "monotonic", lambda: clock[0])
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
    monkeypatch.setattr(inplace.time, "monotonic", lambda: 5.0)
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
