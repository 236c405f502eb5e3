"""The Slurm backend: Slurm's state in, the engine's actions out (verified on Slurm 22.05,
24.11 and 25.11; what differs between releases is in :mod:`.release`).

An elastic job is a held array of one-node tasks in the preemptable partition (job_submit.lua
makes it and tags it in admin_comment). The engine's id of a job is the array's job id.

* **poll** makes three read-only calls — the MalleTrain tasks (``squeue -r -t all -p
  PARTITION -O ...``), the nodes (``sinfo -N -p PARTITION``) and the backfill plan (``squeue
  -t PD --start``) — and reconciles them with what the previous poll saw. It then re-holds
  what must not run unordered (tasks that started without an admin hold, tasks that came back
  from preemption without one) and requeue-holds tasks that hit their time limit.
* **execute** turns Grow into one ``scontrol update JobId=A_i ReqNodeList=<node>
  StartTime=now TimeLimit=<min>`` per task (StartTime=now lifts the requeue blackout) and one
  batched ``scontrol release``; Shrink into one batched ``scontrol requeuehold Incomplete``
  (Incomplete: Slurm requeues only a task still running, atomically under its job lock, so a
  task the user cancelled since the last poll stays cancelled); Finish into
  one ``scancel`` of all the arrays. Checkpoint is the epoch coordinator's business, not
  Slurm's: it is ignored here.

The reads and actions go through a :class:`~.client.SlurmClient`, chosen once when the backend
is built: the commands, or RPCs made through pyslurm (``slurm.pyslurm``, chosen in
:func:`.pyslurm_reader.choose`) that give the same texts and errors.

Events, in this order within one poll: JobSubmitted (a new tagged array), NodesReclaimed
(a node the engine could use was taken back: a worker preempted or requeued by Slurm, or an
idle node given to another job, drained or gone), WorkerStopped (a worker ended for any other
reason: our own shrink, its time limit, exit, scancel of the task), JobEnded, NodesIdle
(nodes new to the pool, or whose hole end changed), WorkerStarted. A task we stopped that
leaves a node the engine has granted to the same job again since sends no WorkerStopped: the
engine would read it as the loss of the task granted there.

A grow that cannot be carried out (no held task left, a hole shorter than a minute, a
refused scontrol call, a task that has not started within ``grant_timeout_s``) comes back as
WorkerStopped for that job and node: the engine then sees the node idle and the job without
it. A Finish needs no confirmation: no event is sent for a job after its Finish.

The backend keeps no state on disk. After a restart its first poll reports every live job
again (JobSubmitted), every usable node and every node running a worker (NodesIdle), and
every running worker (WorkerStarted); the engine treats a repeated JobSubmitted as known.
The task table and the poll's reconciliation are in :mod:`.reconcile`, the pure rules in
:mod:`.rules`; here the poll's order and the actions.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Collection

from ...errors import CommandError, CommandNotFound, CommandTimeout, ValidationError
from ...events import Event, Finish, Grow, NodesReclaimed, Shrink, WorkerStarted, WorkerStopped
from ...runner import CommandRunner
from ..base import REUSE_SETTLE_S, Launch
from ..states import TaskState
from . import parse as sp
from . import rules
from .client import PyslurmCalls, client_for
from .options import SlurmOptions
from .reconcile import SlurmPollEvents, SlurmTasks
from .rules import (
    DEFAULT_TIME_LIMIT_S,
    HOLE_MARGIN_S,
    TASK_FAILURE_WINDOW_S,
    TASK_FAILURES_MAX,
    UNPLANNED_WAIT_S,
    epilog_margin_for,
    grant_timeout_for,
    hole_margin_for,
)

__all__ = ["DEFAULT_TIME_LIMIT_S", "HOLE_MARGIN_S", "TASK_FAILURES_MAX", "TASK_FAILURE_WINDOW_S",
           "UNPLANNED_WAIT_S", "SlurmBackend", "epilog_margin_for", "grant_timeout_for",
           "hole_margin_for"]

log = logging.getLogger(__name__)


class SlurmBackend(SlurmTasks):
    """Slurm behind the :class:`~malletrain_core.backends.base.Backend` protocol.

    Clock-free: every method takes ``now`` (Unix seconds, as in Slurm's timestamps).
    """

    def __init__(self, runner: CommandRunner, partition: str = SlurmOptions.partition,
                 default_time_limit_s: float = DEFAULT_TIME_LIMIT_S,
                 grant_timeout_s: float = SlurmOptions.grant_timeout_s,
                 hole_margin_s: float = HOLE_MARGIN_S, source: PyslurmCalls | None = None,
                 epilog_margin_s: float = SlurmOptions.epilog_margin_s,
                 unplanned_wait_s: float = UNPLANNED_WAIT_S,
                 task_failures_max: int = TASK_FAILURES_MAX,
                 task_failure_window_s: float = TASK_FAILURE_WINDOW_S) -> None:
        """``source``: None for the commands, else a pyslurm source (see
        :func:`~.client.client_for`). The settings are checked as ``[slurm]``'s are."""
        options = SlurmOptions(
            partition=partition, default_time_limit_s=default_time_limit_s,
            grant_timeout_s=grant_timeout_s, hole_margin_s=hole_margin_s,
            epilog_margin_s=epilog_margin_s, unplanned_wait_s=unplanned_wait_s,
            task_failures_max=task_failures_max, task_failure_window_s=task_failure_window_s)
        wrong = next(options.problems(), None)
        if wrong is not None:
            raise ValidationError("SlurmBackend", *wrong)
        super().__init__(client_for(runner, source), options)

    @property
    def runner(self) -> CommandRunner:
        """The runner of the Slurm commands the client starts."""
        return self.client.runner

    @runner.setter
    def runner(self, runner: CommandRunner) -> None:
        self.client.runner = runner

    def busy(self) -> bool:
        """Also while grants are held back (the poll that lifts the hold must come soon) and
        while finished arrays wait for their ``scancel``."""
        return super().busy() or self._hold_grants or bool(self._to_cancel)

    def watch_submits(self, count: Callable[[], int]) -> None:
        self.submits_seen = count

    # ------------------------------------------------------------------ poll
    def poll(self, now: float) -> list[Event]:
        """Reconcile with Slurm and return what changed since the last poll."""
        self._submits_at_poll = self.submits_seen() if self.submits_seen is not None else 0
        nodes, rows, plan = self.client.read(self.partition)
        self._cancel()
        tagged: dict[str, list[sp.TaskRow]] = {}
        for row in rows:
            if row.index is not None and row.admin_comment.startswith(sp.TAG_PREFIX):
                tagged.setdefault(row.array_id, []).append(row)
        current = {row.key: row for group in tagged.values() for row in group}
        out = SlurmPollEvents()
        self._admit_arrays(tagged, now, out)
        self._hold_grants = self._waiting_unplanned(plan, now)
        self._reconcile_workers(current, now, out)
        self._reconcile_tasks(current, now, out)
        self._reconcile_jobs(tagged, now, out)
        dropped = set()
        for aid, node in self._dropped:
            if aid in self._jobs and node in self._offered:
                # The engine keeps that node as idle: offer it again now if usable, else
                # say it is gone (below), so the engine does not plan with a busy node.
                del self._offered[node]
                dropped.add(node)
        self._dropped.clear()
        self._reheld &= set(self._launching)
        leaving = {row.node for key, row in current.items() if key in self._stopping
                   and key not in self._workers and row.node and row.state in rules.ACTIVE}
        idle = self._reconcile_nodes(nodes, plan, out.reclaimed, leaving, now)
        out.reclaimed += [n for n in sorted(dropped) if n not in self._offered]
        self._rows = current
        self._gone &= set(tagged)  # a purged job id never comes back
        self._run_quietly("hold", out.to_hold)
        recycled = sorted(set(out.to_requeuehold) - self._run_quietly("requeuehold",
                                                                        out.to_requeuehold))
        self._stopping.update(out.to_requeuehold)
        if recycled:
            self._cancel_revived(recycled)
        return out.ordered(now, idle)

    def other_submitted(self, only_nodes: Collection[str] = ()) -> int:
        """A job of another partition was just submitted (job_submit.lua's datagram, on the
        daemon's cycle thread): hold again, at once, every task released for a grow that has
        not started yet, instead of at the next poll. Slurm's scheduling pass for the new job
        would otherwise start such a task on an idle node the job could have taken, and the
        job would wait for a preemption round. A task that started before the hold reached it
        is a worker as usual (the poll holds running tasks anyway). ``only_nodes``: the job can
        run only there (``-w``), so only the tasks released onto them are held; empty: every
        one. Returns the tasks held."""
        if self.unplanned_wait_s <= 0:
            return 0
        only = set(only_nodes)
        keys = sorted(k for k, launch in self._launching.items()
                      if k not in self._reheld and (not only or launch.node in only))
        if not keys:
            return 0
        failed = self._run_quietly("hold", keys)
        held = [k for k in keys if k not in failed]
        self._reheld.update(held)
        if held:
            log.info("tasks %s released and not seen running yet: held again, a job of "
                     "another partition was submitted (one that has started stays a worker)",
                     sp.fold_tasks(held))
        return len(held)

    def _grants_held(self) -> bool:
        if self.unplanned_wait_s <= 0:
            return False
        if not self._hold_grants and self.submits_seen is not None \
                and self.submits_seen() != self._submits_at_poll:
            self._hold_grants = True  # announced after the poll: wait for the next one
        return self._hold_grants

    def _cancel_revived(self, recycled: list[str]) -> None:
        """Time-limit recycling requeues a *finished* task, which the conditional requeue of a
        shrink cannot do and a user's ``scancel`` does not touch. So after the requeue, read
        the arrays again: a task that turned CANCELLED since the poll means the user cancelled
        the job in between, and the recycled tasks are cancelled too (a cancel that comes
        after the requeue cancels them itself)."""
        arrays = sorted({self._job_of(k) for k in recycled}, key=lambda s: (len(s), s))
        try:
            rows = self.client.tasks(arrays)
        except CommandError as exc:
            log.warning("reading back recycled tasks: %s (the next poll looks again)", exc)
            return
        before = {key: rules.code(row) for key, row in self._rows.items()}  # this cycle's poll
        cancelled_now = {row.array_id for row in rows if rules.code(row) == "CANCELLED"
                         and before.get(row.key) != "CANCELLED"}
        revived = [k for k in recycled if self._job_of(k) in cancelled_now]
        if revived:
            log.warning("job(s) %s cancelled while tasks %s were recycled: cancelled those "
                        "too", ",".join(sorted(cancelled_now)), sp.fold_tasks(revived))
            try:
                self.client.cancel(revived)
            except CommandError as exc:
                log.warning("scancel %s: %s", " ".join(revived), exc)

    # ------------------------------------------------------------------ execute
    def _shrink(self, shrinks: list[Shrink], now: float, events: list[Event]) -> None:
        requeue: list[str] = []
        unlaunch: list[str] = []
        for action in shrinks:
            for node in action.nodes:
                key = self._task_on(action.job_id, node)
                row = self._rows.get(key) if key is not None else None
                if key is None:
                    log.warning("shrink of job %s on %s: no worker there", action.job_id, node)
                elif key in self._workers and row is not None and row.state is TaskState.ENDING:
                    # Already ending (scancel, its own exit): Slurm requeues even a cancelled
                    # task, which would bring a job the user ended back to life.
                    self._stopping.add(key)
                elif key in self._workers:
                    requeue.append(key)
                else:
                    unlaunch.append(key)  # held; requeue-held by the next poll if it started
                    del self._launching[key]
                    self._left[key] = (node, now)
                    self._stopping.add(key)
                    events.append(WorkerStopped(now, action.job_id, node))
        failed = self._run_quietly("requeuehold Incomplete", requeue)
        self._stopping.update(k for k in requeue if k not in failed)
        for key in sorted(failed):  # still running there: say so
            aid, node = self._workers[key]
            events.append(WorkerStarted(now, aid, node))
        self._run_quietly("hold", unlaunch)

    def _end(self, job_id: str) -> None:
        super()._end(job_id)
        self._failures.pop(job_id, None)
        self._no_task_logged.pop(job_id, None)
        self._failures_seen = {f for f in self._failures_seen if self._job_of(f[0]) != job_id}

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
                    self._no_task(job, node, free, minutes, now, events)
                elif hung:
                    free.insert(0, key)
                    self._give_back(job, node, now, events, "an earlier update of this cycle "
                                    "timed out: offered again by the next poll",
                                    level=logging.DEBUG, withdraw=[node])
                else:
                    done = self._grown(key, job, node, minutes, now, events)
                    if done:
                        self._launching[key] = Launch(job, node, now + self.grant_timeout_s)
                        released.append(key)
                    hung = done is None
        try:
            failed = self._scontrol_batch("release", released)
        except CommandTimeout as exc:
            log.warning("%s: the next poll shows which tasks started", exc)
            failed = set()
        for key in sorted(failed):
            launch = self._launching.pop(key)
            self._give_back(launch.job_id, launch.node, now, events, "release refused",
                            level=logging.DEBUG)

    def _grown(self, key: str, job: str, node: str, minutes: int, now: float,
               events: list[Event]) -> bool | None:
        """Pin ``key`` to ``node`` with a limit of ``minutes``: True; else the node is given
        back: False when Slurm refused, None when it did not answer."""
        try:
            self.client.grow(key, node, minutes)
            return True
        except CommandNotFound:
            raise
        except CommandError as exc:  # a timed-out update leaves the task held; its node is
            # withdrawn with every idle one, so the engine does not try each and wait again
            hung = isinstance(exc, CommandTimeout)
            self._give_back(job, node, now, events, "%s", exc,
                            withdraw=self._every_idle([node]) if hung else ())
            return None if hung else False

    def _no_task(self, job: str, node: str, free: list[str], minutes: int, now: float,
                 events: list[Event]) -> None:
        """No task of ``job`` can go to ``node``: say why and give the node back."""
        if free and minutes >= 1:  # every free task just left this node
            self._give_back(job, node, now, events, "its free tasks %s left that node under "
                            "%g s ago (slurmd may still be ending them there): node given "
                            "back, offered again by a later poll", sp.fold_tasks(free),
                            REUSE_SETTLE_S, level=logging.INFO, withdraw=[node])
            return
        if minutes < 1:
            self._give_back(job, node, now, events, "hole under one minute")
            return
        coming = sum(1 for k in self._stopping if self._job_of(k) == job)
        if not coming:
            self._give_back(job, node, now, events, "no held task left")
            return
        # A task is on its way back (a failed one requeued by this very poll): the node is
        # withdrawn, so the engine plans again at the next poll, not at some other event.
        loud = now - self._no_task_logged.get(job, -math.inf) >= 60
        if loud:
            self._no_task_logged[job] = now
        self._give_back(job, node, now, events, "its %d task(s) being requeued are not held "
                        "yet: node offered again by the next poll", coming,
                        level=logging.INFO if loud else logging.DEBUG, withdraw=[node])

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
            launch.node for launch in self._launching.values()}
        return sorted(set(nodes) | {n for n in self._offered if n not in busy})

    def _withdrawn(self, nodes: Collection[str], now: float) -> NodesReclaimed:
        """Take ``nodes`` from the engine (offered again by a later poll)."""
        for node in nodes:
            self._offered.pop(node, None)
        return NodesReclaimed(now, tuple(sorted(nodes)))

    def _finish(self, finishes: list[Finish]) -> None:
        for action in finishes:
            self._end(action.job_id)
            self._to_cancel.add(action.job_id)
        self._cancel()

    def _cancel(self) -> None:
        """``scancel`` every finished array; what fails is tried again at the next poll."""
        ids = sorted(self._to_cancel, key=lambda s: (len(s), s))
        if not ids:
            return
        try:
            self.client.cancel(ids)
        except CommandNotFound:
            raise
        except CommandError as exc:
            if isinstance(exc, CommandTimeout) or "completed" not in exc.stderr.lower():
                log.warning("scancel %s: %s (tried again at the next poll)", " ".join(ids), exc)
                return
        self._to_cancel.clear()
