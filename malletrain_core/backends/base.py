"""The interface every backend implements (Slurm, PBS, the simulator), and the bookkeeping
shared by the batch-system backends that realise an elastic job as one-node tasks.

A batch-system backend subclasses :class:`TaskBackend` and writes only what its batch system
does differently: how it reads the jobs and nodes (``poll``), how it starts, stops and ends
tasks (``_shrink``, ``_grow``, ``_finish``), and how a task id names its job (``_job_of``).
Which jobs are live, which task runs where, which grows are pending, which tasks it is stopping
and which nodes the engine was offered are kept here, once."""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..events import (
    Action,
    Checkpoint,
    EndReason,
    Event,
    Finish,
    Grow,
    IdleNode,
    JobEnded,
    JobRequest,
    JobSubmitted,
    NodesIdle,
    NodesReclaimed,
    Shrink,
)
from ..interfaces import WAKE_LEAD_S, Backend, TaskView

log = logging.getLogger(__name__)

__all__ = ["WAKE_LEAD_S", "Backend", "Launch", "PollEvents", "TaskBackend"]


@dataclass
class PollEvents:
    """What one poll found, gathered by kind and emitted in the order the engine relies on."""

    submitted: list[Event] = field(default_factory=list)
    reclaimed: list[str] = field(default_factory=list)
    stopped: list[Event] = field(default_factory=list)
    ended: list[Event] = field(default_factory=list)
    started: list[Event] = field(default_factory=list)

    def ordered(self, now: float, idle: Sequence[IdleNode]) -> list[Event]:
        """New jobs, then nodes taken back, workers stopped and jobs ended (so freed nodes are
        known before they are offered), then newly idle nodes, then confirmed starts."""
        events: list[Event] = list(self.submitted)
        if self.reclaimed:
            events.append(NodesReclaimed(now, tuple(sorted(set(self.reclaimed)))))
        events += self.stopped + self.ended
        if idle:
            events.append(NodesIdle(now, tuple(idle)))
        return events + self.started


@dataclass
class Launch:
    """A task told to start on a node that has not been seen running yet."""

    job_id: str
    node: str
    deadline: float


REUSE_SETTLE_S = 2.0
"""A task that left a node (shrunk, failed) is not started on that same node again for this
long. A batch system keeps a task's id across a requeue; Slurm's slurmd revokes the job's
credential when it kills it and refuses a launch whose credential was made in the same second
("Job 10 already killed, do not launch batch job", seen in bench/e2e.py: two tasks grown back
0.5 s after their shrink ended FAILED, although another job had run on the node in between).
The next whole second is enough; another free task of the job is taken meanwhile
(:meth:`TaskBackend._pick`). A task a prod job preempted needs none: the node comes back only
once that job has ended."""


class TaskBackend(Backend):
    """What every array-task backend keeps: live jobs, workers, pending grows, tasks being
    stopped and the nodes offered to the engine (node → hole end, None when unknown)."""

    name = "tasks"

    def __init__(self) -> None:
        self._jobs: dict[str, JobRequest] = {}            # job id -> request (live jobs)
        self._gone: set[str] = set()                      # ended, finished or refused
        self._workers: dict[str, tuple[str, str]] = {}    # task id -> (job id, node)
        self._launching: dict[str, Launch] = {}           # told to start, not yet running
        self._stopping: set[str] = set()                  # being stopped by us
        self._offered: dict[str, float | None] = {}       # node -> hole end, as told
        self._left: dict[str, tuple[str, float]] = {}     # task -> (node it left, when)
        self._grant_start_s: deque[float] = deque(maxlen=1000)

    def _started(self, launch: Launch | None, timeout_s: float, now: float) -> None:
        """A granted task seen running: count how long its grant took (to this poll)."""
        if launch is not None:
            self._grant_start_s.append(max(0.0, now - (launch.deadline - timeout_s)))

    def grant_starts(self) -> dict[str, float | int]:
        """Count, median, p95 and max of the seconds from a grant to the poll that saw its
        task running (the last 1,000 grants; ``malletrain status`` shows it)."""
        xs = sorted(self._grant_start_s)
        if not xs:
            return {"count": 0}
        return {"count": len(xs), "median": round(xs[len(xs) // 2], 3),
                "p95": round(xs[min(len(xs) - 1, int(0.95 * len(xs)))], 3),
                "max": round(xs[-1], 3)}

    # ------------------------------------------------------------------ read-only views
    @property
    def jobs(self) -> dict[str, JobRequest]:
        """The live elastic jobs, by job id."""
        return dict(self._jobs)

    @property
    def workers(self) -> dict[str, tuple[str, str]]:
        """Running workers: task id → (job id, node)."""
        return dict(self._workers)

    @property
    def launching(self) -> dict[str, str]:
        """Tasks told to start and not seen running yet: task id → node."""
        return {key: launch.node for key, launch in self._launching.items()}

    @property
    def offered(self) -> dict[str, float | None]:
        """Nodes the engine has been told it may use (idle or running a worker) → hole end."""
        return dict(self._offered)

    def busy(self) -> bool:
        """Work in flight that only a poll confirms: grows not yet running, tasks being
        stopped (the daemon's quiet polling waits for none)."""
        return bool(self._launching or self._stopping)

    def view(self) -> TaskView:
        """The task table as the daemon compares it with the engine (:class:`TaskView`): a
        worker or a grant in flight runs the engine's work unless we are stopping it."""
        running: set[tuple[str, str]] = set()
        stopping: set[tuple[str, str]] = set()
        tasks = [(task, job, node) for task, (job, node) in self._workers.items()]
        tasks += [(task, launch.job_id, launch.node) for task, launch in self._launching.items()]
        for task, job, node in tasks:
            (stopping if task in self._stopping else running).add((job, node))
        return TaskView(frozenset(running), frozenset(stopping - running),
                        frozenset(self._offered))

    # ------------------------------------------------------------------ for subclasses
    def _job_of(self, task: str) -> str:
        """The job id a task id belongs to."""
        raise NotImplementedError

    def _admit(self, job_id: str, request: JobRequest | None, now: float,
               out: PollEvents) -> None:
        """A job seen for the first time: known to the engine from now on, or refused for good
        (``request`` None)."""
        if request is None:
            self._gone.add(job_id)
            return
        self._jobs[job_id] = request
        out.submitted.append(JobSubmitted(now, request))

    def _is_new(self, job_id: str) -> bool:
        return job_id not in self._jobs and job_id not in self._gone

    def _close(self, job_id: str, reason: EndReason, now: float, out: PollEvents) -> None:
        """The job ended: forget it and send JobEnded instead of its workers' events."""
        self._end(job_id)
        out.stopped = [e for e in out.stopped if getattr(e, "job_id", None) != job_id]
        out.started = [e for e in out.started if getattr(e, "job_id", None) != job_id]
        out.ended.append(JobEnded(now, job_id, reason))

    def _end(self, job_id: str) -> None:
        self._jobs.pop(job_id, None)
        self._gone.add(job_id)
        for table in (self._workers, self._launching):
            for task in [t for t in table if self._job_of(t) == job_id]:
                del table[task]
        self._stopping = {t for t in self._stopping if self._job_of(t) != job_id}

    def _task_on(self, job_id: str, node: str) -> str | None:
        """The task of ``job_id`` running or starting on ``node``.

        One we are stopping comes last: it may still be leaving a node that the engine has
        granted to the same job again since (a shrink whose requeue Slurm has not finished, as
        after a restart without state, which shrinks every worker), and the engine's next
        order for that node is about the task granted there, not the one leaving."""
        found = [task for task, (jid, where) in sorted(self._workers.items())
                 if jid == job_id and where == node]
        found += [task for task, launch in sorted(self._launching.items())
                  if launch.job_id == job_id and launch.node == node]
        live = [task for task in found if task not in self._stopping]
        return next(iter(live or found), None)

    def _granted_again(self, job_id: str, node: str) -> bool:
        """Has the engine granted ``node`` to ``job_id`` again while a task we stopped was
        leaving it? Then that task's stop sends no WorkerStopped: the engine would read it as
        the loss of the task granted there since. (Call it once the leaving task is off the
        books.)"""
        since = self._task_on(job_id, node)
        return since is not None and since not in self._stopping

    def _pick(self, free: list[str], node: str, now: float) -> str | None:
        """The first of ``free`` that did not leave ``node`` within :data:`REUSE_SETTLE_S`
        (taken out of ``free``); None when every one did."""
        self._left = {k: v for k, v in self._left.items() if now - v[1] < REUSE_SETTLE_S}
        for key in free:
            left = self._left.get(key)
            if left is None or left[0] != node:
                free.remove(key)
                return key
        return None

    def _withdraw(self, node: str, reclaimed: list[str]) -> None:
        """The engine may no longer use ``node``."""
        if node in self._offered:
            del self._offered[node]
            reclaimed.append(node)

    # ------------------------------------------------------------------ execute
    def execute(self, actions: Sequence[Action], now: float) -> list[Event]:
        """Carry out the engine's actions: shrinks first (they free nodes), then grows, then
        finishes; returns the events they caused at once (grows that failed)."""
        events: list[Event] = []
        self._shrink([a for a in actions if isinstance(a, Shrink)], now, events)
        self._grow([a for a in actions if isinstance(a, Grow)], now, events)
        self._finish([a for a in actions if isinstance(a, Finish)])
        for action in actions:
            if not isinstance(action, (Shrink, Grow, Finish, Checkpoint)):
                log.warning("action %r is not for the %s backend: ignored", action, self.name)
        return events

    def _shrink(self, shrinks: list[Shrink], now: float, events: list[Event]) -> None:
        raise NotImplementedError

    def _grow(self, grows: list[Grow], now: float, events: list[Event]) -> None:
        raise NotImplementedError

    def _finish(self, finishes: list[Finish]) -> None:
        raise NotImplementedError
