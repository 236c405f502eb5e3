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
from collections.abc import Callable, Collection

from ...errors import CommandError, CommandNotFound, CommandTimeout, ValidationError
from ...events import Event, Finish, Shrink, WorkerStarted, WorkerStopped
from ...runner import CommandRunner
from ..states import TaskState
from . import parse as sp
from . import rules
from .client import PyslurmCalls, client_for
from .grants import SlurmGrants
from .options import SlurmOptions
from .reconcile import SlurmPollEvents
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


class SlurmBackend(SlurmGrants):
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
        self._release_waiting(now, out)
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
                waiting = self._waiting.get(node)
                if waiting is not None and waiting[0].job_id == action.job_id:
                    del self._waiting[node]  # never released: nothing to stop
                    events.append(WorkerStopped(now, action.job_id, node))
                    continue
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
        self._waiting = {n: w for n, w in self._waiting.items() if w[0].job_id != job_id}
        self._failures_seen = {f for f in self._failures_seen if self._job_of(f[0]) != job_id}

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
