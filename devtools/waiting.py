"""The one polling wait of the tests, the benches and the local clusters, and the wait on a
backend's events built on it.

A batch system, a daemon and the workers it starts change state on their own time, so every
check of them is a poll. A wait that times out says what it waited for, for how long, the
last error a check raised (when it was told to ride over errors) and whatever ``detail``
returns (a cluster's dump, the workers' logs): a failed run explains itself.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol, TypeVar

from malletrain_core.events import Event

T = TypeVar("T")


class Polled(Protocol):
    """What :func:`poll_until` needs of a backend."""

    def poll(self, now: float) -> list[Event]: ...


class NotReached(TimeoutError):
    """A polled condition did not hold within its time; the message says which and why."""


def wait_until(what: str, check: Callable[[], T | None], timeout_s: float, interval_s: float = 0.2,
               *, ignore: tuple[type[Exception], ...] = (),
               detail: Callable[[], str] | None = None) -> T:
    """Call ``check`` every ``interval_s`` until it returns something true, and return that.

    An exception of a type in ``ignore`` counts as "not yet" (a command that fails while the
    cluster restarts). After ``timeout_s`` (at least one check, and one more at the end),
    :class:`NotReached` naming ``what``."""
    deadline = time.monotonic() + timeout_s
    error: Exception | None = None
    while True:
        try:
            value = check()
        except ignore as exc:
            error = exc
        else:
            if value:
                return value
            error = None
        if time.monotonic() >= deadline:
            break
        time.sleep(interval_s)
    why = f" (the last check raised {error!r})" if error is not None else ""
    more = f"\n{detail()}" if detail is not None else ""
    raise NotReached(f"{what}: not reached within {timeout_s:g} s{why}{more}")


def poll_until(backend: Polled, done: Callable[[list[Event]], bool], timeout_s: float = 30.0,
               interval_s: float = 0.3) -> list[Event]:
    """Poll ``backend`` (at the wall-clock time) until the events seen so far satisfy
    ``done``; returns all of them. :class:`NotReached` lists them after ``timeout_s``."""
    seen: list[Event] = []

    def satisfied() -> bool:
        seen.extend(backend.poll(time.time()))
        return done(seen)
    wait_until("the backend's events the test waits for", satisfied, timeout_s, interval_s,
               detail=lambda: f"events seen: {seen}")
    return seen
