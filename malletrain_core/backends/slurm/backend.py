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

With a pyslurm source (``slurm.pyslurm``, chosen in :func:`.pyslurm_reader.choose`) the same
reads and actions are RPCs made through pyslurm instead of command processes.

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

Kept in one module (over 400 lines) on purpose: the poll's reconciliation and the actions are one
state machine over the task table; what a shrink or a grow may do depends on what the last poll
saw, and splitting them would split that invariant.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...errors import CommandError, CommandNotFound, CommandTimeout, ValidationError
from ...events import (
    EndReason,
    Event,
    Finish,
    Grow,
    IdleNode,
    JobRequest,
    NodesReclaimed,
    Shrink,
    WorkerStarted,
    WorkerStopped,
)
from ...runner import CommandRunner
from ..base import REUSE_SETTLE_S, Launch, PollEvents, TaskBackend
from ..states import NodeState, TaskState
from . import parse as sp
from .options import SlurmOptions

log = logging.getLogger(__name__)

DEFAULT_TIME_LIMIT_S = SlurmOptions.default_time_limit_s

TASK_FAILURES_MAX = SlurmOptions.task_failures_max
"""A job whose tasks fail this many times within :data:`TASK_FAILURE_WINDOW_S` is stopped
(``slurm.task_failures_max``); each failure before that is requeued held, so the job keeps its
whole node range. A failure of the node (NODE_FAIL, BOOT_FAIL) is not the job's and never
counts."""

TASK_FAILURE_WINDOW_S = SlurmOptions.task_failure_window_s
"""The window over which :data:`TASK_FAILURES_MAX` counts a job's task failures."""

_NODE_FAULTS = frozenset({"NODE_FAIL", "NF", "BOOT_FAIL", "BF"})
_FAILED = frozenset({"FAILED", "F", "OUT_OF_MEMORY", "OOM"}) | _NODE_FAULTS


def grant_timeout_for(bf_interval_s: int, batch_sched_delay_s: int, kill_wait_s: int) -> int:
    """The ``slurm.grant_timeout_s`` a cluster's settings call for: a released task starts at
    the main scheduler's next pass (``batch_sched_delay``) or, in a planned hole, at the next
    backfill cycle (``bf_interval``), after a preempted predecessor on the node is gone (up to
    KillWait); ten seconds more for a busy slurmctld and the daemon's poll."""
    return bf_interval_s + batch_sched_delay_s + kill_wait_s + 10

_ACTIVE = (TaskState.RUNNING, TaskState.ENDING)
_REQUEUED_BY_SLURM = frozenset({"PREEMPTED", "NODE_FAIL", "BOOT_FAIL"})


def _code(row: sp.TaskRow) -> str:
    return row.state_code.split()[0].rstrip("+") if row.state_code else ""


def _requeued_now(before: sp.TaskRow | None, row: sp.TaskRow | None) -> bool:
    """Whether a worker's task, seen ``before`` at the last poll and ``row`` now, was requeued
    by Slurm (a preemption) since: COMPLETING with one more restart. Slurm sends the
    EpilogSlurmctld's wake-up at that requeue, while the task's processes still exit; waiting
    for it to show PENDING would keep the job's other members idle one more poll."""
    return (before is not None and row is not None and row.state is TaskState.ENDING
            and row.restarts > before.restarts)


def _recoverable(row: sp.TaskRow) -> bool:
    """A task that hit its time limit ends TIMEOUT, not requeued: requeue-hold it for reuse."""
    return _code(row) in ("TIMEOUT", "TO")


def _failed(row: sp.TaskRow) -> bool:
    """A task that ended in a failure (its own code, its node, or a slurmd that refused it)."""
    return row.state is TaskState.DONE and _code(row) in _FAILED


def _runnable(group: Sequence[sp.TaskRow]) -> bool:
    """Whether a job still has a task to run: one not ended, one that hit its time limit, or a
    failed one (requeued held until the job's failure budget is spent), unless the user
    cancelled some of them (a job whose tasks all ended, some cancelled, is over)."""
    cancelled = any(_code(r) in ("CANCELLED", "CA") for r in group)
    return any(r.state is not TaskState.DONE or _recoverable(r)
               or (_failed(r) and not cancelled) for r in group)


UNPLANNED_WAIT_S = SlurmOptions.unplanned_wait_s
"""How long a waiting job of another partition that Slurm has not planned yet (no start time
and no SchedNodes in ``squeue --start``) holds back new grants, counted from its submission
(see :meth:`SlurmBackend._waiting_unplanned`); 0 turns the rule off."""

STARTABLE_REASONS = frozenset({"", "None", "Resources"})
"""Pending reasons of a job that may start on an idle node at Slurm's next pass: ``None``
(Slurm has not looked at it yet: a job just submitted), ``Resources`` (waiting for nodes, as
one is while the preemption it asked for runs), and "" (not read: the plan's older five
columns). A hold, a dependency, a begin time, a limit, a reservation or ``Priority`` (others
come first: beyond the backfill's depth it is never planned) cannot start now, and a site has
many such jobs: they must not hold grants back."""

HOLE_MARGIN_S = SlurmOptions.hole_margin_s
"""Taken off a hole's remaining time (``slurm.hole_margin_s``): Slurm's backfill plans in
bf_resolution steps (60 s by default) and starts the task at one of its cycles, so a limit that
ends just before the planned start would keep the task pending on the planned node."""


def hole_margin_for(bf_resolution_s: int, bf_interval_s: int) -> int:
    """The ``slurm.hole_margin_s`` a cluster's backfill settings call for: a task that fits a
    hole starts at a backfill cycle (up to ``bf_interval`` after its release), and the plan's
    times are rounded to ``bf_resolution``; one second more for the clock ticking between the
    daemon's read of the plan and its order."""
    return bf_resolution_s + bf_interval_s + 1


TIME_LIMIT_CHECK_S = 30
"""How often slurmctld enforces time limits (its PERIODIC_TIMEOUT, not a setting): a task runs
up to this long past its TimeLimit before Slurm ends it."""


def epilog_margin_for(epilog_s: float) -> int:
    """The ``slurm.epilog_margin_s`` a node Epilog of ``epilog_s`` seconds (its longest run)
    calls for: a task fitted to a hole ends at its time limit, up to one time-limit check
    late, and its node stays COMPLETING until the Epilog is done; the waiting job's planned
    start must find it done. 0 without an Epilog."""
    if not epilog_s > 0:
        return 0
    return math.ceil(epilog_s) + TIME_LIMIT_CHECK_S


@dataclass
class _PollEvents(PollEvents):
    to_hold: list[str] = field(default_factory=list)
    to_requeuehold: list[str] = field(default_factory=list)


class SlurmBackend(TaskBackend):
    """Slurm behind the :class:`~malletrain_core.backends.base.Backend` protocol.

    Clock-free: every method takes ``now`` (Unix seconds, as in Slurm's timestamps).
    """

    name = "slurm"

    def __init__(self, runner: CommandRunner, partition: str = SlurmOptions.partition,
                 default_time_limit_s: float = DEFAULT_TIME_LIMIT_S,
                 grant_timeout_s: float = SlurmOptions.grant_timeout_s,
                 hole_margin_s: float = HOLE_MARGIN_S, source: Any = None,
                 epilog_margin_s: float = SlurmOptions.epilog_margin_s,
                 unplanned_wait_s: float = UNPLANNED_WAIT_S,
                 task_failures_max: int = TASK_FAILURES_MAX,
                 task_failure_window_s: float = TASK_FAILURE_WINDOW_S) -> None:
        if default_time_limit_s < 60:
            raise ValidationError("SlurmBackend", "default_time_limit_s",
                                  f"{default_time_limit_s:g} s is under Slurm's one-minute unit")
        if not grant_timeout_s > 0:
            raise ValidationError("SlurmBackend", "grant_timeout_s",
                                  f"{grant_timeout_s!r} must be a positive number of seconds")
        if not epilog_margin_s >= 0:
            raise ValidationError("SlurmBackend", "epilog_margin_s",
                                  f"{epilog_margin_s!r} must be ≥ 0 seconds")
        if task_failures_max < 1:
            raise ValidationError("SlurmBackend", "task_failures_max",
                                  f"{task_failures_max!r} must be at least 1")
        super().__init__()
        self.runner = runner
        self.source = source
        """None: the commands; else a :class:`~.pyslurm_reader.PyslurmSource`: the poll's
        reads through pyslurm and, where ``source.acts``, the actions too (the same texts,
        RPCs and errors as the commands')."""
        self._acts = source if getattr(source, "acts", False) else None
        self.partition = partition
        self.default_time_limit_s = float(default_time_limit_s)
        self.grant_timeout_s = float(grant_timeout_s)
        self.hole_margin_s = float(hole_margin_s)
        self.epilog_margin_s = float(epilog_margin_s)
        self._rows: dict[str, sp.TaskRow] = {}           # task key (A_i) -> last seen row
        self._dropped: list[tuple[str, str]] = []         # workers lost, not stopped by us
        self._to_cancel: set[str] = set()                 # finished, scancel not yet done
        self.unplanned_wait_s = float(unplanned_wait_s)
        self._unplanned: dict[str, float] = {}            # other job -> first seen unplanned
        self._hold_grants = False
        self._unnamed: dict[str, float] = {}  # node planned, no other job's plan names it -> since
        self._short: dict[str, float] = {}  # node whose hole no task fits -> since
        self.submits_seen: Callable[[], int] | None = None
        """The count of hook datagrams announcing a job of another partition (job_submit.lua
        sends one per submission): one that arrives after the poll holds back that cycle's
        grows too. None: only the poll's view counts."""
        self._submits_at_poll = 0
        self._reheld: set[str] = set()
        """Released tasks held again by :meth:`other_submitted` before they started: the next
        poll ends their grows (failed) if they are still waiting."""
        self.task_failures_max = int(task_failures_max)
        self.task_failure_window_s = float(task_failure_window_s)
        self._failures: dict[str, list[float]] = {}   # job -> times its tasks failed
        self._failures_seen: set[tuple[str, int]] = set()  # (task, restarts) counted
        self._no_task_logged: dict[str, float] = {}  # job -> last "no held task left" warning
        self._requeued: set[str] = set()
        """Workers taken as preempted while their task still shows COMPLETING (see
        :func:`_requeued_now`): not seen as started again until it shows something else."""

    def _job_of(self, task: str) -> str:
        return task.split("_", 1)[0]

    def busy(self) -> bool:
        """Also while grants are held back (the poll that lifts the hold must come soon) and
        while finished arrays wait for their ``scancel``."""
        return super().busy() or self._hold_grants or bool(self._to_cancel)

    def watch_submits(self, count: Callable[[], int]) -> None:
        self.submits_seen = count

    # ------------------------------------------------------------------ commands
    def _query(self) -> tuple[dict[str, sp.NodeRow], list[sp.TaskRow], list[sp.PlanRow]]:
        if self.source is not None:
            got = self.source.snapshot(self.partition)
            return (sp.parse_sinfo(got["sinfo"]), sp.parse_squeue(got["squeue"]),
                    sp.parse_plan(got["plan"]))
        # The plan first: a job of another partition that starts after it is read shows in
        # sinfo as holding its nodes, instead of vanishing from the plan while sinfo still
        # shows those nodes idle (they would be offered, and a grow would chase the job).
        # Then sinfo before our tasks: a task that starts between the two calls shows as
        # ours, not as a foreign job on a node we offered.
        p = self.runner.run(["squeue", "-h", "-t", "PD", "--start", "-o", sp.PLAN_FORMAT])
        n = self.runner.run(["sinfo", "-h", "-N", "-p", self.partition, "-o", sp.SINFO_FORMAT])
        q = self.runner.run(["squeue", "-h", "-r", "-t", "all", "-p", self.partition,
                             "-O", sp.SQUEUE_FORMAT])
        return sp.parse_sinfo(n.stdout), sp.parse_squeue(q.stdout), sp.parse_plan(p.stdout)

    def _scontrol_batch(self, verb: str, keys: Sequence[str]) -> set[str]:
        """``scontrol VERB <list>`` in one call; returns the keys that failed."""
        if not keys:
            return set()
        try:
            if self._acts is not None:
                self._acts.scontrol(verb, sp.fold_tasks(keys))
            else:
                self.runner.run(["scontrol", *verb.split(), sp.fold_tasks(keys)])
            return set()
        except (CommandNotFound, CommandTimeout):
            raise
        except CommandError as exc:
            errors = sp.parse_scontrol_errors(exc.stderr)
            failed = {k for key in errors if key for k in sp.expand_task_ids(key)} & set(keys)
            if not failed or "" in errors:
                failed = set(keys)
            log.warning("scontrol %s failed for %s: %s", verb, sp.fold_tasks(sorted(failed)),
                        "; ".join(f"{k}: {v}" if k else v for k, v in errors.items()))
            return failed

    # ------------------------------------------------------------------ poll
    def poll(self, now: float) -> list[Event]:
        """Reconcile with Slurm and return what changed since the last poll."""
        self._submits_at_poll = self.submits_seen() if self.submits_seen is not None else 0
        nodes, rows, plan = self._query()
        self._cancel()
        tagged: dict[str, list[sp.TaskRow]] = {}
        for row in rows:
            if row.index is not None and row.admin_comment.startswith(sp.TAG_PREFIX):
                tagged.setdefault(row.array_id, []).append(row)
        current = {row.key: row for group in tagged.values() for row in group}
        out = _PollEvents()
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
                   and key not in self._workers and row.node and row.state in _ACTIVE}
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

    def _admit_arrays(self, tagged: dict[str, list[sp.TaskRow]], now: float,
                      out: _PollEvents) -> None:
        for aid, group in sorted(tagged.items(), key=lambda kv: int(kv[0])):
            if not self._is_new(aid):
                continue
            req: JobRequest | None = None
            if any(r.state is not TaskState.DONE or _recoverable(r) for r in group):
                try:
                    tag = sp.parse_tag(group[0].admin_comment)
                except ValidationError as exc:
                    log.warning("job %s ignored: %s", aid, exc)
                else:
                    assert tag is not None
                    req = JobRequest(aid, min_nodes=tag.min_nodes, max_nodes=tag.max_nodes,
                                     owner=group[0].user, model=tag.model, profile=tag.profile,
                                     trainer=tag.options.get("trainer", ""))
            self._admit(aid, req, now, out)

    def _reconcile_workers(self, current: dict[str, sp.TaskRow], now: float,
                           out: _PollEvents) -> None:
        """Workers that started, and workers that are gone (preempted or stopped)."""
        self._requeued = {k for k in self._requeued
                          if k in current and current[k].state is TaskState.ENDING}
        for key, row in current.items():
            if row.array_id not in self._jobs or not row.node or row.state not in _ACTIVE \
                    or key in self._requeued:
                continue
            if key not in self._workers and key in self._stopping:
                # Shrunk while launching, but it had started before our hold reached it:
                # no worker of the engine's, stop it (it was told WorkerStopped already).
                if row.state is TaskState.RUNNING:
                    out.to_requeuehold.append(key)
                continue
            if key not in self._workers:
                self._started(self._launching.pop(key, None), self.grant_timeout_s, now)
                self._workers[key] = (row.array_id, row.node)
                out.started.append(WorkerStarted(now, row.array_id, row.node))
            if row.state is TaskState.RUNNING and not row.held and key not in self._stopping:
                out.to_hold.append(key)  # so that a preemption brings it back held
        for key in list(self._workers):
            seen = current.get(key)
            requeued = key not in self._stopping and _requeued_now(self._rows.get(key), seen)
            if seen is not None and seen.state in _ACTIVE and not requeued:
                continue
            aid, node = self._workers.pop(key)
            if key in self._stopping:
                self._left[key] = (node, now)
                if not self._granted_again(aid, node):
                    out.stopped.append(WorkerStopped(now, aid, node))
            elif seen is not None and (requeued or seen.state in (TaskState.PENDING,
                                                                  TaskState.HELD)
                                       or _code(seen) in _REQUEUED_BY_SLURM):
                if requeued:
                    self._requeued.add(key)
                # Preempted: the node is free again only once the job that took it is done
                # with it, long after this task's end there (no settle needed).
                out.reclaimed.append(node)
                self._offered.pop(node, None)
            else:
                self._left[key] = (node, now)
                # A worker we did not stop (it exited, or its task died): the engine drops
                # the node, so it must be offered again once Slurm shows it usable.
                out.stopped.append(WorkerStopped(now, aid, node))
                self._dropped.append((aid, node))

    def _reconcile_tasks(self, current: dict[str, sp.TaskRow], now: float,
                         out: _PollEvents) -> None:
        """Grows that did not happen, tasks that must not run unordered, time-outs, failed
        tasks of live jobs (see :func:`_runnable`)."""
        groups: dict[str, list[sp.TaskRow]] = {}
        for r in current.values():
            groups.setdefault(r.array_id, []).append(r)
        alive = {aid for aid, group in groups.items() if _runnable(group)}
        for key, row in current.items():
            if row.array_id not in self._jobs:
                continue
            launch = self._launching.get(key)
            if launch is not None:
                late = now >= launch.deadline
                reheld = key in self._reheld and row.state in (TaskState.PENDING,
                                                               TaskState.HELD)
                if row.state is TaskState.DONE or late or reheld or (
                        self._hold_grants and row.state is TaskState.PENDING):
                    del self._launching[key]
                    if row.state is TaskState.DONE:  # it ran there (and failed): settle
                        self._left[key] = (launch.node, now)
                    out.stopped.append(WorkerStopped(now, launch.job_id, launch.node))
                    self._dropped.append((launch.job_id, launch.node))
                    if row.state is not TaskState.DONE and not reheld:  # reheld: logged
                        out.to_hold.append(key)
                        if late:
                            log.warning("grant of %s to job %s (task %s) not running after "
                                        "%g s (Slurm: %s): task held again, node offered "
                                        "again", launch.node, launch.job_id, key,
                                        self.grant_timeout_s, row.reason or row.state_code)
                        else:
                            log.info("task %s not started on %s yet: held again while a job "
                                     "of another partition waits unplanned", key, launch.node)
            elif row.state is TaskState.PENDING and not row.held:
                out.to_hold.append(key)  # requeued by Slurm before our hold: Slurm would
                # restart it anywhere once the requeue delay is over
            if _recoverable(row) and key not in self._stopping:
                out.to_requeuehold.append(key)
            elif _failed(row) and key not in self._stopping and row.array_id in alive:
                self._task_failed(key, row, now, out)
                if row.array_id not in self._jobs:
                    continue
            elif row.state is TaskState.HELD or (row.state is TaskState.PENDING and row.held) \
                    or (row.state is TaskState.DONE and not _recoverable(row)):
                self._stopping.discard(key)
        for key in [k for k in self._launching if k not in current]:
            launch = self._launching.pop(key)
            out.stopped.append(WorkerStopped(now, launch.job_id, launch.node))
            self._dropped.append((launch.job_id, launch.node))

    def _task_failed(self, key: str, row: sp.TaskRow, now: float, out: _PollEvents) -> None:
        """A task of a live job failed: requeue it held, so that its job keeps its whole node
        range (a start-up failure, a slurmd still tearing down the task's previous
        incarnation, a crash), unless the job's tasks have failed ``task_failures_max`` times
        within ``task_failure_window_s``: the job is then stopped (scancel), with one line
        saying why. A requeue-hold Slurm refused is tried again at the next poll; each failure
        counts once."""
        aid = row.array_id
        if (key, row.restarts) in self._failures_seen:
            out.to_requeuehold.append(key)
            return
        self._failures_seen.add((key, row.restarts))
        code = _code(row)
        times = [t for t in self._failures.get(aid, []) if now - t < self.task_failure_window_s]
        if code not in _NODE_FAULTS:
            times.append(now)
        self._failures[aid] = times
        where = f"task {key} on {row.node or '?'}: {code}"
        if len(times) >= self.task_failures_max:
            log.error("job %s stopped: its tasks failed %d times within %g s (last: %s); its "
                      "output files say why (slurm.task_failures_max)", aid, len(times),
                      self.task_failure_window_s, where)
            self._to_cancel.add(aid)
            self._close(aid, EndReason.FAILED, now, out)
            out.to_requeuehold = [k for k in out.to_requeuehold if self._job_of(k) != aid]
            return
        log.warning("job %s: %s; requeued held, the job keeps its %d tasks (%d of %d failures "
                    "within %g s before it is stopped)", aid, where, self._jobs[aid].max_nodes,
                    len(times), self.task_failures_max, self.task_failure_window_s)
        out.to_requeuehold.append(key)

    def _reconcile_jobs(self, tagged: dict[str, list[sp.TaskRow]], now: float,
                        out: _PollEvents) -> None:
        """A job ends when a task completed (training done) or no task is left to run."""
        for aid in list(self._jobs):
            group = tagged.get(aid, [])
            codes = {_code(r) for r in group if r.state is TaskState.DONE}
            if "COMPLETED" in codes:
                reason = EndReason.COMPLETED
            elif _runnable(group):
                continue
            elif codes <= {"CANCELLED"}:
                reason = EndReason.CANCELLED
            else:
                reason = EndReason.FAILED
            out.to_requeuehold = [k for k in out.to_requeuehold if self._job_of(k) != aid]
            self._close(aid, reason, now, out)

    def _reconcile_nodes(self, nodes: dict[str, sp.NodeRow], plan: list[sp.PlanRow],
                         reclaimed: list[str], leaving: set[str],
                         now: float) -> list[IdleNode]:
        """Update the offered pool from sinfo and the plan; returns the NodesIdle entries.

        ``reclaimed`` comes in with the nodes whose workers Slurm took back and goes out with
        every node taken from the pool; such a node is not offered again in the same poll.
        ``leaving`` names the nodes where a task we are stopping, no worker, still runs: they
        stay offered.
        """
        ends = sp.hole_ends(plan, exclude=set(self._jobs) | self._gone)
        ours = {node for _, node in self._workers.values()}
        launching = {launch.node for launch in self._launching.values()}
        just_lost = set(reclaimed)
        idle: list[IdleNode] = []
        unnamed: dict[str, float] = {}
        short: dict[str, float] = {}
        for name in sorted(nodes):
            row = nodes[name]
            hole = ends.get(name)
            if hole is not None and name not in ours and not self.fits(hole, now) \
                    and row.usable and name not in just_lost:
                # No task fits before the waiting job's planned start: a grant there would
                # only be refused (and cost its job a checkpoint and a re-plan).
                short[name] = self._short.get(name, now)
                if name not in self._short:
                    log.info("node %s: its hole ends in %.0f s, under the %.0f s a task needs "
                             "(Slurm's one-minute time limits plus slurm.hole_margin_s%s): not "
                             "offered while it stays so", name, hole - now,
                             60 + self.margin_s, " and slurm.epilog_margin_s"
                             if self.epilog_margin_s else "")
                if name not in launching or name not in self._offered:
                    if name in self._offered:
                        del self._offered[name]
                        reclaimed.append(name)
                    continue
                hole = None  # a task released there before: its launch keeps the node
            if name in leaving and name in self._offered:
                continue
            if name in ours or (name in launching and name in self._offered):
                if name not in self._offered:  # a worker we did not start (daemon restart)
                    idle.append(IdleNode(name, hole))
                self._offered[name] = hole if hole is not None else self._offered.get(name)
                if name in ours or row.usable:
                    continue
            elif row.usable and name not in just_lost and (
                    row.state is NodeState.IDLE or hole is not None):
                if name not in self._offered and self._hold_grants:
                    continue  # offered once no other job waits unplanned
                if name not in self._offered or self._offered[name] != hole:
                    idle.append(IdleNode(name, hole))
                    self._offered[name] = hole
                continue
            if row.state is NodeState.PLANNED and hole is None:
                unnamed[name] = self._unnamed.get(name, now)
                if name not in self._unnamed:
                    mine = sorted(r.job_id for r in plan if name in r.nodes)
                    log.warning("node %s is planned but no waiting job of another partition "
                                "plans it%s: not offered while it stays so", name,
                                f" (our tasks {', '.join(mine)} do)" if mine else "")
            if row.completing and name in self._offered:
                continue
            if name in self._offered:
                del self._offered[name]
                reclaimed.append(name)
            for key in [k for k, la in self._launching.items() if la.node == name]:
                del self._launching[key]  # the engine drops it with NodesReclaimed
                self._run_quietly("hold", [key])
        for name in [n for n in self._offered if n not in nodes]:
            del self._offered[name]
            reclaimed.append(name)
        for name, since in self._unnamed.items():
            if name not in unnamed:
                log.info("node %s was planned with no other job's plan for %.1f s; now %s",
                         name, now - since,
                         nodes[name].state.value if name in nodes else "gone")
        self._unnamed = unnamed
        self._short = short
        return idle

    def _minutes(self, limit_s: float | None) -> int:
        """A task's TimeLimit (whole minutes) for a grant of ``limit_s`` seconds (None or
        inf: no hole end known); 0 when no task fits."""
        if limit_s is None or not math.isfinite(limit_s):
            limit_s = self.default_time_limit_s
        elif limit_s < self.default_time_limit_s:
            # A hole's end: the task starts at a later backfill cycle, and backfill plans
            # in bf_resolution steps (60 s by default), so the limit keeps that margin; and
            # the node's Epilog must be done by the waiting job's planned start.
            limit_s -= self.margin_s
        return sp.minutes_within(min(limit_s, self.default_time_limit_s))

    @property
    def margin_s(self) -> float:
        """What a task's time limit leaves of a planned hole: ``slurm.hole_margin_s`` plus
        ``slurm.epilog_margin_s``."""
        return self.hole_margin_s + self.epilog_margin_s

    def fits(self, hole_end: float, now: float) -> bool:
        """Whether a task fits in a hole that ends at ``hole_end`` (see :meth:`_minutes`)."""
        return self._minutes(hole_end - now) >= 1

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
                    or row.reason.split(",")[0].strip() not in STARTABLE_REASONS:
                continue
            seen[row.job_id] = row.submit if row.submit is not None else \
                self._unplanned.get(row.job_id, now)
        self._unplanned = seen
        return any(now - first < self.unplanned_wait_s for first in seen.values())

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
            text = self.source.tasks(arrays) if self.source is not None else self.runner.run(
                ["squeue", "-h", "-r", "-t", "all", "-j", ",".join(arrays), "-O",
                 sp.SQUEUE_FORMAT], check=False).stdout
        except CommandError as exc:
            log.warning("reading back recycled tasks: %s (the next poll looks again)", exc)
            return
        rows = sp.parse_squeue(text)
        cancelled_now = set()
        for row in rows:
            before = self._rows.get(row.key)  # the poll this cycle made
            if _code(row) == "CANCELLED" and (before is None or _code(before) != "CANCELLED"):
                cancelled_now.add(row.array_id)
        revived = [k for k in recycled if self._job_of(k) in cancelled_now]
        if revived:
            log.warning("job(s) %s cancelled while tasks %s were recycled: cancelled those "
                        "too", ",".join(sorted(cancelled_now)), sp.fold_tasks(revived))
            try:
                self._scancel(revived)
            except CommandError as exc:
                log.warning("scancel %s: %s", " ".join(revived), exc)

    def _run_quietly(self, verb: str, keys: Sequence[str]) -> set[str]:
        """A batched scontrol call whose failure is retried by the next poll."""
        try:
            return self._scontrol_batch(verb, sorted(set(keys)))
        except CommandTimeout as exc:
            log.warning("%s: retried at the next poll", exc)
            return set()

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
        released: list[str] = []
        if grows and self._grants_held():
            nodes = sorted({n for action in grows for n in action.nodes})
            log.info("grows onto %s held back: a job of another partition waits unplanned",
                     ",".join(nodes))
            for action in grows:
                events += [WorkerStopped(now, action.job_id, n) for n in action.nodes]
            # Every idle node is withdrawn, not only these: the engine, planning again at
            # once, would otherwise try the next ones, held back in turn. All are offered
            # again by the first poll without such a job.
            busy = {node for _, node in self._workers.values()} | {
                launch.node for launch in self._launching.values()}
            nodes = sorted(set(nodes) | {n for n in self._offered if n not in busy})
            for node in nodes:
                self._offered.pop(node, None)
            events.append(NodesReclaimed(now, tuple(nodes)))
            return
        hung = False
        for action in grows:
            if action.job_id not in self._jobs:
                log.warning("grow of job %s: not a live elastic job", action.job_id)
                events += [WorkerStopped(now, action.job_id, n) for n in action.nodes]
                continue
            minutes = self._minutes(action.time_limit_s)
            free = self._free_tasks(action.job_id)
            for node in action.nodes:
                there = self._task_on(action.job_id, node)
                if there is not None and there not in self._stopping:
                    # The job has a task there already: a second one released onto the node
                    # would wait for it (Resources) for ever. The grant is that task's.
                    log.warning("grow of job %s on %s: its task %s is there already",
                                action.job_id, node, there)
                    if there in self._workers:
                        events.append(WorkerStarted(now, action.job_id, node))
                    continue
                key = self._pick(free, node, now) if minutes >= 1 else None
                if key is None and free and minutes >= 1:
                    # Every free task just left this node: give the node back for now.
                    log.info("grow of job %s on %s: its free tasks %s left that node under "
                             "%g s ago (slurmd may still be ending them there): node given "
                             "back, offered again by a later poll", action.job_id, node,
                             sp.fold_tasks(free), REUSE_SETTLE_S)
                    events.append(WorkerStopped(now, action.job_id, node))
                    self._withdraw(node, [])
                    events.append(NodesReclaimed(now, (node,)))
                    continue
                if key is None and minutes < 1:
                    log.warning("grow of job %s on %s: hole under one minute", action.job_id,
                                node)
                    events.append(WorkerStopped(now, action.job_id, node))
                    continue
                coming = sum(1 for k in self._stopping if self._job_of(k) == action.job_id)
                if key is None and coming:
                    # A task is on its way back (a failed one requeued by this very poll):
                    # the node is withdrawn and offered again by the next poll, so the engine
                    # plans again then, instead of keeping it idle until some other event.
                    last = self._no_task_logged.get(action.job_id, -math.inf)
                    (log.info if now - last >= 60 else log.debug)(
                        "grow of job %s on %s: its %d task(s) being requeued are not held yet: "
                        "node offered again by the next poll", action.job_id, node, coming)
                    if now - last >= 60:
                        self._no_task_logged[action.job_id] = now
                    events.append(WorkerStopped(now, action.job_id, node))
                    self._withdraw(node, [])
                    events.append(NodesReclaimed(now, (node,)))
                    continue
                if key is None:
                    log.warning("grow of job %s on %s: no held task left", action.job_id, node)
                    events.append(WorkerStopped(now, action.job_id, node))
                    continue
                if hung:  # scontrol did not answer: the rest of this batch waits for a poll
                    free.insert(0, key)
                    events.append(WorkerStopped(now, action.job_id, node))
                    self._withdraw(node, [])
                    events.append(NodesReclaimed(now, (node,)))
                    continue
                try:
                    if self._acts is not None:
                        self._acts.grow(key, node, minutes)
                    else:
                        self.runner.run(["scontrol", "update", f"JobId={key}",
                                         f"ReqNodeList={node}", "StartTime=now",
                                         f"TimeLimit={minutes}"])
                except CommandNotFound:
                    raise
                except CommandError as exc:  # a timed-out update leaves the task held
                    log.warning("grow of job %s on %s: %s", action.job_id, node, exc)
                    events.append(WorkerStopped(now, action.job_id, node))
                    if isinstance(exc, CommandTimeout):
                        # Withdrawn now, with every other idle node, and offered again by the
                        # next poll: the engine plans with them again then, instead of trying
                        # the next node at once and waiting for scontrol again each time.
                        hung = True
                        busy = {n for _, n in self._workers.values()} | {
                            la.node for la in self._launching.values()}
                        gone = sorted({node} | {n for n in self._offered if n not in busy})
                        for n in gone:
                            self._offered.pop(n, None)
                        events.append(NodesReclaimed(now, tuple(gone)))
                    continue
                self._launching[key] = Launch(action.job_id, node, now + self.grant_timeout_s)
                released.append(key)
        try:
            failed = self._scontrol_batch("release", released)
        except CommandTimeout as exc:
            log.warning("%s: the next poll shows which tasks started", exc)
            failed = set()
        for key in sorted(failed):
            launch = self._launching.pop(key)
            events.append(WorkerStopped(now, launch.job_id, launch.node))

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
            self._scancel(ids)
        except CommandNotFound:
            raise
        except CommandError as exc:
            if isinstance(exc, CommandTimeout) or "completed" not in exc.stderr.lower():
                log.warning("scancel %s: %s (tried again at the next poll)", " ".join(ids), exc)
                return
        self._to_cancel.clear()

    def _scancel(self, ids: Sequence[str]) -> None:
        if self._acts is not None:
            self._acts.cancel(ids)
        else:
            self.runner.run(["scancel", *ids])
