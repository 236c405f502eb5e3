"""The seam between the daemon and a batch system: the :class:`Backend` protocol.

Below the backends, the simulator and the daemon alike (it needs only the shared vocabulary of
:mod:`malletrain_core.events`), so that every one of them declares what it is by subclassing
it: the batch-system backends through :class:`~malletrain_core.backends.base.TaskBackend`, the
simulator's and the churn stand-in's directly, the daemon's
:class:`~malletrain_core.daemon.bridge.EpochBridge` as a wrapper that forwards.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Protocol

from .events import Action, Event

WAKE_LEAD_S = 0.01
"""How soon a hook datagram after a quiet spell runs the daemon's cycle, unless the backend
names its own :attr:`Backend.wake_lead_s`."""


@dataclass(frozen=True)
class TaskView:
    """Where the batch system runs the engine's work, as the backend's last poll and the
    actions since left it: the daemon compares it with the engine's nodes after every poll
    (:func:`~malletrain_core.daemon.reconcile.view_fixes`).

    ``running``: (job, node) pairs with a task running or starting there that nobody is
    stopping; ``stopping``: pairs whose task is being stopped (neither side's any more);
    ``offered``: the nodes the engine has been offered and not had taken back.
    """

    running: frozenset[tuple[str, str]]
    stopping: frozenset[tuple[str, str]]
    offered: frozenset[str]


class Backend(Protocol):
    """A batch system as the engine and the daemon need it.

    ``poll`` reconciles with the batch system (the truth) and returns what changed since the
    last poll as events; ``execute`` carries out the engine's actions and returns any events
    they caused at once (for example a grow that failed). The rest is what ``malletraind``
    asks of every backend, each with the default a backend that needs nothing more inherits
    by subclassing this protocol (:class:`TaskBackend` does): nothing in the daemon probes a
    backend for what it has.
    """

    name: str

    wake_lead_s: float = WAKE_LEAD_S
    """How long the daemon waits after a hook datagram that follows a quiet spell."""

    def poll(self, now: float) -> list[Event]:
        ...

    def execute(self, actions: Sequence[Action], now: float) -> list[Event]:
        ...

    def busy(self) -> bool:
        """Work in flight that only a poll confirms (grows not yet running, tasks being
        stopped): the daemon's quiet polling polls at every cycle while it is true."""
        return False

    def grant_starts(self) -> dict[str, float | int]:
        """Count, median, p95 and max of the seconds from a grant to its task running
        (``malletrain status``); ``{"count": 0}`` where the backend does not measure it."""
        return {"count": 0}

    def watch_submits(self, count: Callable[[], int]) -> None:
        """``count()`` is the number of hook datagrams so far that announced another job's
        submission (job_submit.lua sends one per submission); a backend that holds grows
        back after one keeps it. Default: ignored."""
        return None

    def other_submitted(self, only_nodes: Collection[str] = ()) -> int:
        """Another job was submitted (a hook datagram; ``only_nodes``: the nodes it is
        confined to, empty: any): a backend may hold back what it released and has not
        started. Returns how many tasks it held again (default: none)."""
        return 0

    def view(self) -> TaskView | None:
        """Where the batch system runs the engine's work (:class:`TaskView`); None where the
        backend keeps no task table (the daemon then compares nothing)."""
        return None
