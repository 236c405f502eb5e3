"""The one polling wait (devtools/waiting.py): what it returns, and what a timeout says."""

from __future__ import annotations

import pytest

from devtools.waiting import NotReached, poll_until, wait_until
from malletrain_core.events import Event, Tick


def test_the_first_true_value_is_returned() -> None:
    values = iter([None, 0, "", 7])
    assert wait_until("a value", lambda: next(values), 5, 0.001) == 7


def test_a_timeout_names_the_wait_the_last_error_and_the_detail() -> None:
    def check() -> bool:
        raise OSError("socket gone")
    with pytest.raises(NotReached) as err:
        wait_until("the daemon answering", check, 0.05, 0.01, ignore=(OSError,),
                   detail=lambda: "its log: nothing")
    assert str(err.value).splitlines() == [
        "the daemon answering: not reached within 0.05 s (the last check raised "
        "OSError('socket gone'))", "its log: nothing"]
    assert isinstance(err.value, TimeoutError)


def test_an_error_not_ignored_goes_through() -> None:
    with pytest.raises(ZeroDivisionError):
        wait_until("never", lambda: 1 / 0, 1)


class Backend:
    def __init__(self) -> None:
        self.polls = 0

    def poll(self, now: float) -> list[Event]:
        self.polls += 1
        return [Tick(now)] if self.polls % 2 == 0 else []


def test_poll_until_returns_every_event_seen_and_lists_them_on_a_timeout() -> None:
    backend = Backend()
    assert len(poll_until(backend, lambda ev: len(ev) == 2, 5, 0.001)) == 2
    with pytest.raises(NotReached, match=r"events seen: \[Tick"):
        poll_until(backend, lambda ev: len(ev) > 100, 0.05, 0.01)
