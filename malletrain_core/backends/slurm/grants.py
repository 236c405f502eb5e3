"""The Slurm backend's grows: a grant made into a held task pinned to its node and released,
or given back to the engine in one way, and the grants that wait for their task.

A grow needs a held task of its job. Right after a shrink of the same job (a daemon started
without state shrinks every worker, then plans again at once) the job's tasks may still be
being requeued, or may have left the very node they are granted now under
:data:`~..base.REUSE_SETTLE_S` ago: the grant then **waits** here, with no command sent, and
the poll that finds a task for it releases that task (:meth:`SlurmGrants._release_waiting`).
The engine holds the node meanwhile, as for any grant not yet running; one that finds no task
within ``grant_timeout_s`` is given back. Before, such a grow was given back at once, the node
withdrawn and planned again a poll later: a failed grant for nothing, and a shrink and a grow
of one job interleaved in Slurm.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Collection

from ...errors import CommandError, CommandNotFound, CommandTimeout
from ...events import Event, Grow, NodesReclaimed, WorkerStarted, WorkerStopped
from ...interfaces import TaskView
from ..base import REUSE_SETTLE_S, Launch
from ..states import TaskState
from . import parse as sp
from . import rules
from .reconcile import SlurmPollEvents, SlurmTasks

log = logging.getLogger(__name__.rpartition(".")[0] + ".backend")  # the backend's one logger


class SlurmGrants(SlurmTasks):
    """The grows of :class:`~.backend.SlurmBackend` (see the module doc)."""

    def busy(self) -> bool:
        return super().busy() or bool(self._waiting)

    def view(self) -> TaskView:
        """The task table's view, a waiting grant counted as a grant in flight."""
        view = super().view()
        waiting = {(launch.job_id, node) for node, (launch, _) in self._waiting.items()}
        return TaskView(view.running | waiting, view.stopping - waiting, view.offered)

    def _grants_held(self) -> bool:
        if self.unplanned_wait_s <= 0:
            return False
        if not self._hold_grants and self.submits_seen is not None \
                and self.submits_seen() != self._submits_at_poll:
            self._hold_grants = True  # announced after the poll: wait for the next one
        return self._hold_grants

    def _free_tasks(self, job_id: str) -> list[str]:
        busy = set(self._workers) | set(self._launching) | self._stopping
        free = [r for r in self._rows.values() if r.array_id == job_id and r.key not in busy
                and r.state in (TaskState.PENDING, TaskState.HELD) and r.held]
        return [r.key for r in sorted(free, key=lambda r: r.index or 0)]

    def _grow(self, grows: list[Grow], now: float, events: list[Event]) -> None:
        if grows and self._grants_held():
            nodes = sorted({n for action in grows for n in action.nodes})
            log.info("grows onto %s held back: a job of another partition waits unplanned",
                     ",".join(nodes))
            for action in grows:
                events += [WorkerStopped(now, action.job_id, n) for n in action.nodes]
            # Every idle node is withdrawn, not only these: the engine, planning again at
            # once, would otherwise try the next ones, held back in turn. All are offered
            # again by the first poll without such a job.
            events.append(self._withdrawn(self._every_idle(nodes), now))
            return
        released: list[str] = []
        hung = False  # scontrol did not answer: the rest of this batch waits for a poll
        for action in grows:
            job = action.job_id
            if job not in self._jobs:
                for node in action.nodes:
                    self._give_back(job, node, now, events, "not a live elastic job")
                continue
            minutes = self._minutes(action.time_limit_s)
            free = self._free_tasks(job)
            for node in action.nodes:
                if node in self._waiting and self._waiting[node][0].job_id == job:
                    continue  # already waiting for a task of the job
                self._waiting.pop(node, None)
                there = self._task_on(job, node)
                if there is not None and there not in self._stopping:
                    # The job has a task there already: a second one released onto the node
                    # would wait for it (Resources) for ever. The grant is that task's.
                    log.warning("grow of job %s on %s: its task %s is there already", job,
                                node, there)
                    if there in self._workers:
                        events.append(WorkerStarted(now, job, node))
                    continue
                key = self._pick(free, node, now) if minutes >= 1 else None
                if key is None:
                    self._no_task(job, node, free, minutes, action.time_limit_s, now, events)
                elif hung:
                    free.insert(0, key)
                    self._give_back(job, node, now, events, "an earlier update of this cycle "
                                    "timed out: offered again by the next poll",
                                    level=logging.DEBUG, withdraw=[node])
                else:
                    done = self._grown(key, job, node, minutes, now, events)
                    if done:
                        released.append(key)
                    hung = done is None
        self._release(released, now, events)

    def _grown(self, key: str, job: str, node: str, minutes: int, now: float,
               events: list[Event]) -> bool | None:
        """Pin ``key`` to ``node`` with a limit of ``minutes`` and count it a grant in flight
        (:meth:`_release` lets it go): True; else the node is given back: False when Slurm
        refused, None when it did not answer."""
        try:
            self.client.grow(key, node, minutes)
            self._launching[key] = Launch(job, node, now + self.grant_timeout_s)
            return True
        except CommandNotFound:
            raise
        except CommandError as exc:  # a timed-out update leaves the task held; its node is
            # withdrawn with every idle one, so the engine does not try each and wait again
            hung = isinstance(exc, CommandTimeout)
            self._give_back(job, node, now, events, "%s", exc,
                            withdraw=self._every_idle([node]) if hung else ())
            return None if hung else False

    def _release(self, released: list[str], now: float, events: list[Event]) -> None:
        """One ``scontrol release`` of the tasks just pinned; one Slurm refused is given back,
        one it did not answer for is left to the next poll."""
        try:
            failed = self._scontrol_batch("release", released)
        except CommandTimeout as exc:
            log.warning("%s: the next poll shows which tasks started", exc)
            failed = set()
        for key in sorted(failed):
            launch = self._launching.pop(key)
            self._give_back(launch.job_id, launch.node, now, events, "release refused",
                            level=logging.DEBUG)

    def _no_task(self, job: str, node: str, free: list[str], minutes: int,
                 limit_s: float | None, now: float, events: list[Event]) -> None:
        """No task of ``job`` can go to ``node`` now: the grant waits for one where the job's
        free tasks only just left that node or its tasks are being requeued (see the module
        doc); otherwise it is given back, saying why."""
        if minutes < 1:
            self._give_back(job, node, now, events, "hole under one minute")
            return
        coming = sum(1 for k in self._stopping if self._job_of(k) == job)
        if not free and not coming:
            self._give_back(job, node, now, events, "no held task left")
            return
        self._waiting[node] = (Launch(job, node, now + self.grant_timeout_s),
                               None if limit_s is None else now + limit_s)
        loud = now - self._no_task_logged.get(job, -math.inf) >= 60
        if loud:
            self._no_task_logged[job] = now
        why = (f"its free tasks {sp.fold_tasks(free)} left that node under {REUSE_SETTLE_S:g} s "
               "ago (slurmd may still be ending them there)" if free else
               f"its {coming} task(s) being requeued are not held yet")
        log.log(logging.INFO if loud else logging.DEBUG, "grow of job %s on %s: %s: the grant "
                "waits for a task, released by the poll that finds one (given back after "
                "%g s)", job, node, why, self.grant_timeout_s)

    def _release_waiting(self, now: float, out: SlurmPollEvents) -> None:
        """At the end of a poll, each grant waiting for a task (see the module doc) releases
        the task it finds now, waits on, or is given back: its job has no task left to come, or
        ``grant_timeout_s`` is over. One taken back with its node, or whose job ended, is
        dropped (the engine knows already). Not while grants are held back."""
        if not self._waiting or self._grants_held():
            return
        events: list[Event] = []
        released: list[str] = []
        for node, (launch, hole_end) in sorted(self._waiting.items()):
            job = launch.job_id
            if job not in self._jobs or node not in self._offered:
                del self._waiting[node]
                continue
            minutes = self._minutes(None if hole_end is None else hole_end - now)
            if minutes < 1:  # the hole's end came too near while it waited
                del self._waiting[node]
                self._give_back(job, node, now, events, "hole under one minute")
                continue
            free = self._free_tasks(job)
            key = self._pick(free, node, now)
            if key is None:
                if now >= launch.deadline or not (
                        free or any(self._job_of(k) == job for k in self._stopping)):
                    del self._waiting[node]
                    self._give_back(job, node, now, events, "no task of the job came for the "
                                    "grant within %.0f s", now - launch.deadline
                                    + self.grant_timeout_s)
                continue
            del self._waiting[node]
            done = self._grown(key, job, node, minutes, now, events)
            if done:
                released.append(key)
            elif done is None:
                break  # scontrol did not answer: the rest wait for the next poll
        self._release(released, now, events)
        for event in events:
            if isinstance(event, NodesReclaimed):
                out.reclaimed += event.nodes
            else:
                out.stopped.append(event)

    def _give_back(self, job: str, node: str, now: float, events: list[Event], why: str,
                   *args: object, level: int = logging.WARNING,
                   withdraw: Collection[str] = ()) -> None:
        """The one way a grant that is not carried out ends: one line ``grow of job J on N:
        WHY``, WorkerStopped (the engine sees the node idle and the job without it), and the
        nodes ``withdraw`` taken from the engine until a later poll offers them again."""
        log.log(level, "grow of job %s on %s: " + why, job, node, *args)
        events.append(WorkerStopped(now, job, node))
        if withdraw:
            events.append(self._withdrawn(withdraw, now))

    def _every_idle(self, nodes: Collection[str]) -> list[str]:
        """``nodes`` and every offered node that runs no worker and no grant."""
        busy = {node for _, node in self._workers.values()} | {
            launch.node for launch in self._launching.values()} | set(self._waiting)
        return sorted(set(nodes) | {n for n in self._offered if n not in busy})

    def _withdrawn(self, nodes: Collection[str], now: float) -> NodesReclaimed:
        """Take ``nodes`` from the engine (offered again by a later poll)."""
        for node in nodes:
            self._offered.pop(node, None)
        return NodesReclaimed(now, tuple(sorted(nodes)))

    def _waiting_unplanned(self, plan: list[sp.PlanRow], now: float) -> bool:
        """Whether a job of another partition waits that Slurm has not planned yet.

        Such a job (a production job just submitted, or one whose plan Slurm dropped when it
        preempted workers for it) may start on any idle node at Slurm's next scheduling pass,
        and a task we release there first takes the node: the job then waits for a later
        preemption round (seconds to tens of seconds). So while one waits, newly idle nodes
        are not offered, grows are not carried out, and a task released for a grow that has
        not started yet is held again (the grow failed: its node is offered again later). Once Slurm plans it, the nodes it will
        take are holes (:func:`~.parse.hole_ends`) and grants go on elsewhere. A job that stays
        unplanned holds grants back for at most ``unplanned_wait_s`` after its submission
        (after the poll that first saw it where the submit time is not known). Only jobs whose
        pending reason says they could start now count (:data:`STARTABLE_REASONS`): a held job,
        one waiting on a dependency, a limit or the jobs before it never holds grants back.
        """
        if self.unplanned_wait_s <= 0:
            self._unplanned.clear()
            return False
        ours = set(self._jobs) | self._gone
        seen: dict[str, float] = {}
        for row in plan:
            if (row.start is not None and row.nodes) or row.array_id in ours \
                    or self.partition in row.partition.split(",") \
                    or row.reason.split(",")[0].strip() not in rules.STARTABLE_REASONS:
                continue
            seen[row.job_id] = row.submit if row.submit is not None else \
                self._unplanned.get(row.job_id, now)
        self._unplanned = seen
        return any(now - first < self.unplanned_wait_s for first in seen.values())

