"""The epoch coordinator between the engine and the batch system.

The engine decides counts and nodes; the batch system starts and stops one-node tasks; the
launchers in those tasks train in epochs of fixed membership. :class:`EpochBridge` wraps a
backend so that the three agree:

* a task seen running (``WorkerStarted``) joins its job's membership target; the new epoch
  starts once its launcher checks in (after a checkpoint of the running epoch);
* a planned **shrink** first leaves the target, so rank 0 checkpoints and the survivors move
  to the next epoch; only once no running epoch has the node (``draining``) is the shrink
  handed to the backend, which requeue-holds the task. A grow onto such a node waits for it;
* a node taken away without warning (preemption, a task that died) is ``lost``: the survivors
  restart at once from the last checkpoint;
* a job's end forgets its epochs.

Checkpoint actions of the engine need no command: the coordinator asks for a checkpoint
before every membership change. The bridge never blocks: deferred actions are retried at
every poll, and :attr:`notify` (thread-safe) asks the daemon for an early cycle when a
check-in or a checkpoint acknowledgement may have freed a deferred shrink.
"""

from __future__ import annotations

import logging
import pwd
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, replace

from ..backends.base import Backend
from ..events import (
    Action,
    Checkpoint,
    Event,
    Finish,
    Grow,
    JobEnded,
    JobSubmitted,
    NodesReclaimed,
    Shrink,
    WorkerStarted,
    WorkerStopped,
)
from ..interfaces import TaskView
from .epochs import EpochCoordinator

log = logging.getLogger(__name__)

NOBODY = -1


def uid_of(user: str | None) -> int:
    """The uid of a batch-system user name (or a numeric uid); -1 if unknown."""
    if not user:
        return NOBODY
    if user.isdigit():
        return int(user)
    try:
        return pwd.getpwnam(user).pw_uid
    except KeyError:
        log.warning("user %r is unknown on this host: only admins may act for the job", user)
        return NOBODY


@dataclass
class _Deferred:
    action: Action
    since: float


class EpochBridge(Backend):
    """A :class:`~malletrain_core.backends.base.Backend` that keeps the epoch coordinator in
    step with the engine's actions and the batch system's events (see the module docstring).

    ``max_defer_s`` bounds how long a shrink waits for its epoch to drain (a coordinator that
    cannot start the next epoch must not keep a node from the batch system for ever).
    """

    def __init__(self, backend: Backend, coordinator: EpochCoordinator, *,
                 uid_of: Callable[[str | None], int] = uid_of,
                 max_defer_s: float | None = None) -> None:
        self.backend = backend
        self.name = backend.name
        self.coordinator = coordinator
        self.uid_of = uid_of
        self.max_defer_s = (max_defer_s if max_defer_s is not None
                            else 2 * coordinator.checkpoint_timeout_s + 10.0)
        self.deferred: list[_Deferred] = []

    # -- the Backend protocol ------------------------------------------------------------
    def poll(self, now: float) -> list[Event]:
        events = list(self.backend.poll(now))
        self.observe(events, now)
        self.coordinator.tick(now)
        return events + self._release(now)

    def execute(self, actions: Sequence[Action], now: float) -> list[Event]:
        ready: list[Action] = []
        for action in actions:
            if isinstance(action, Shrink):
                action = self._ungrant(action)
                if not action.nodes:
                    continue
            if isinstance(action, Shrink) and self._known(action.job_id):
                st = self.coordinator.state(action.job_id)
                gone = set(action.nodes)
                self.coordinator.set_target(action.job_id,
                                            [n for n in st.target if n not in gone], now)
                self.deferred.append(_Deferred(action, now))
            elif isinstance(action, Checkpoint):
                continue  # the coordinator checkpoints before every membership change
            else:
                if isinstance(action, Finish):
                    self.deferred = [d for d in self.deferred
                                     if d.action.job_id != action.job_id]
                ready.append(action)
        events = self._hand_over(ready, now)
        return events + self._release(now)

    def _ungrant(self, shrink: Shrink) -> Shrink:
        """A shrink of nodes whose grow to the same job still waits here (for a node another
        job's epoch is leaving): that grow is taken back for them, never handed over (handed
        over later, it started a task the engine no longer gave the job, on a node it may
        have granted to another job since). Returns the shrink of the job's other nodes."""
        gone, dropped = set(shrink.nodes), set()
        kept: list[_Deferred] = []
        for d in self.deferred:
            grow = d.action
            if isinstance(grow, Grow) and grow.job_id == shrink.job_id and gone & set(grow.nodes):
                dropped |= gone & set(grow.nodes)
                rest = tuple(n for n in grow.nodes if n not in gone)
                if rest:
                    kept.append(_Deferred(replace(grow, nodes=rest), d.since))
            else:
                kept.append(d)
        self.deferred = kept
        return replace(shrink, nodes=tuple(n for n in shrink.nodes if n not in dropped))

    # -- what the batch system tells ---------------------------------------------------------
    def observe(self, events: Sequence[Event], now: float) -> None:
        """Bring the coordinator up to date with the batch system's events."""
        co = self.coordinator
        for event in events:
            if isinstance(event, JobSubmitted):
                co.add_job(event.job.id, self.uid_of(event.job.owner), now)
            elif isinstance(event, WorkerStarted) and self._known(event.job_id):
                target = co.state(event.job_id).target
                if event.node not in target:
                    co.set_target(event.job_id, [*target, event.node], now)
            elif isinstance(event, WorkerStopped) and self._known(event.job_id):
                target = co.state(event.job_id).target
                if event.node in target:
                    co.set_target(event.job_id, [n for n in target if n != event.node], now,
                                  lost=[event.node])
            elif isinstance(event, NodesReclaimed):
                taken = set(event.nodes)
                for job in co.jobs():
                    target = co.state(job).target
                    lost = [n for n in target if n in taken]
                    if lost:
                        co.set_target(job, [n for n in target if n not in taken], now,
                                      lost=lost)
            elif isinstance(event, JobEnded):
                co.remove_job(event.job_id)
                self.deferred = [d for d in self.deferred if d.action.job_id != event.job_id]

    def busy(self) -> bool:
        """Deferred actions, or the backend's own work in flight: the next cycle polls."""
        return bool(self.deferred) or self.backend.busy()

    # -- the rest of the protocol: the wrapped backend's ----------------------------------
    @property
    def wake_lead_s(self) -> float:  # type: ignore[override]
        return self.backend.wake_lead_s

    def grant_starts(self) -> dict[str, float | int]:
        return self.backend.grant_starts()

    def watch_submits(self, count: Callable[[], int]) -> None:
        self.backend.watch_submits(count)

    def other_submitted(self, only_nodes: Collection[str] = ()) -> int:
        return self.backend.other_submitted(only_nodes)

    def view(self) -> TaskView | None:
        """The backend's view with the actions held here: a deferred shrink's task is being
        stopped, a deferred grow's node is the job's."""
        view = self.backend.view()
        if view is None or not self.deferred:
            return view
        shrinking = {(d.action.job_id, node) for d in self.deferred
                     if isinstance(d.action, Shrink) for node in d.action.nodes}
        growing = {(d.action.job_id, node) for d in self.deferred
                   if isinstance(d.action, Grow) for node in d.action.nodes}
        return TaskView((view.running - shrinking) | growing,
                        (view.stopping | shrinking) - growing, view.offered)

    # -- deferred actions --------------------------------------------------------------------
    def pending_nodes(self) -> set[str]:
        """Nodes of shrinks not yet handed to the batch system."""
        return {n for d in self.deferred if isinstance(d.action, Shrink) for n in d.action.nodes}

    def releasable(self) -> bool:
        """True when a deferred shrink's epoch has drained (the daemon's early-cycle test;
        the bounded wait is applied at the next poll)."""
        return any(self._drained(d, None) for d in self.deferred
                   if isinstance(d.action, Shrink))

    def _drained(self, d: _Deferred, now: float | None) -> bool:
        """Whether the deferred shrink ``d`` may go: its nodes left the running epoch, its job
        is gone, or it waited ``max_defer_s``."""
        action = d.action
        assert isinstance(action, Shrink)
        if not self._known(action.job_id):
            return True
        draining = self.coordinator.draining(action.job_id) & set(action.nodes)
        if draining and now is not None and now - d.since >= self.max_defer_s:
            log.warning("job %s: epoch did not leave %s within %g s; shrinking anyway",
                        action.job_id, ",".join(sorted(draining)), self.max_defer_s)
            return True
        return not draining

    def _release(self, now: float) -> list[Event]:
        """Drained shrinks go, then the deferred grows (those still blocked wait again)."""
        if not self.deferred:
            return []
        shrinks = [d for d in self.deferred if isinstance(d.action, Shrink)]
        ready = [d for d in shrinks if self._drained(d, now)]
        grows = [d.action for d in self.deferred if not isinstance(d.action, Shrink)]
        if not ready and not grows:
            return []
        self.deferred = [d for d in shrinks if d not in ready]
        return self._hand_over([d.action for d in ready] + grows, now)

    def _hand_over(self, actions: list[Action], now: float) -> list[Event]:
        """Grows onto nodes still draining wait; the rest goes to the backend."""
        blocked = self.pending_nodes()
        now_actions: list[Action] = []
        for action in actions:
            if isinstance(action, Grow) and set(action.nodes) & blocked:
                self.deferred.append(_Deferred(action, now))
            else:
                now_actions.append(action)
        if not now_actions:
            return []
        events = list(self.backend.execute(now_actions, now))
        self.observe(events, now)
        return events

    def _known(self, job: str) -> bool:
        return self.coordinator.owner(job) is not None
