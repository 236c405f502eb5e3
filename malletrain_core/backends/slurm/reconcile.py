"""What one poll of the Slurm backend makes of Slurm's state: the task table it keeps between
polls, and its reconciliation with the rows the poll read (workers started and gone, grants
that did not start, failed tasks, ended jobs, the nodes offered to the engine).

:class:`SlurmTasks` holds the state that the poll and the actions share;
:class:`~.backend.SlurmBackend` adds the poll's order and the actions on top of it, so that
what a shrink or a grow may do still depends on one table, the one the last poll saw.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ...errors import CommandError, CommandNotFound, CommandTimeout, ValidationError
from ...events import EndReason, IdleNode, JobRequest, WorkerStarted, WorkerStopped
from ..base import Launch, PollEvents, TaskBackend
from ..states import NodeState, TaskState
from . import parse as sp
from . import rules
from .client import SlurmClient
from .options import SlurmOptions

log = logging.getLogger(__name__.rpartition(".")[0] + ".backend")  # the backend's one logger


@dataclass
class SlurmPollEvents(PollEvents):
    """What one poll found, and the tasks it must hold or requeue-hold at its end."""

    to_hold: list[str] = field(default_factory=list)
    to_requeuehold: list[str] = field(default_factory=list)


class SlurmTasks(TaskBackend):
    """The Slurm backend's task table and the poll's reconciliation of it (see the module
    doc); the backend's settings, read from a validated :class:`SlurmOptions`."""

    name = "slurm"

    def __init__(self, client: SlurmClient, options: SlurmOptions) -> None:
        super().__init__()
        self.client = client
        self.partition = options.partition
        self.default_time_limit_s = float(options.default_time_limit_s)
        self.grant_timeout_s = float(options.grant_timeout_s)
        self.hole_margin_s = float(options.hole_margin_s)
        self.epilog_margin_s = float(options.epilog_margin_s)
        self.unplanned_wait_s = float(options.unplanned_wait_s)
        self.task_failures_max = int(options.task_failures_max)
        self.task_failure_window_s = float(options.task_failure_window_s)
        self._rows: dict[str, sp.TaskRow] = {}           # task key (A_i) -> last seen row
        self._dropped: list[tuple[str, str]] = []         # workers lost, not stopped by us
        self._to_cancel: set[str] = set()                 # finished, scancel not yet done
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
        """Released tasks held again by :meth:`~.backend.SlurmBackend.other_submitted` before
        they started: the next poll ends their grows (failed) if they are still waiting."""
        self._failures: dict[str, list[float]] = {}   # job -> times its tasks failed
        self._failures_seen: set[tuple[str, int]] = set()  # (task, restarts) counted
        self._no_task_logged: dict[str, float] = {}  # job -> last "no held task left" warning
        self._waiting: dict[str, tuple[Launch, float | None]] = {}
        """Grants waiting for a task of their job (node → the grant, its hole end): see
        :mod:`.grants`."""
        self._requeued: set[str] = set()
        """Workers taken as preempted while their task still shows COMPLETING (see
        :func:`.rules.requeued_now`): not seen as started again until it shows something
        else."""

    def _job_of(self, task: str) -> str:
        return task.split("_", 1)[0]

    def _scontrol_batch(self, verb: str, keys: Sequence[str]) -> set[str]:
        """``scontrol VERB <list>`` in one call; returns the keys that failed."""
        if not keys:
            return set()
        try:
            self.client.scontrol(verb, keys)
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

    def _run_quietly(self, verb: str, keys: Sequence[str]) -> set[str]:
        """A batched scontrol call whose failure is retried by the next poll."""
        try:
            return self._scontrol_batch(verb, sorted(set(keys)))
        except CommandTimeout as exc:
            log.warning("%s: retried at the next poll", exc)
            return set()

    def _granted_again(self, job_id: str, node: str) -> bool:
        """Also when the grant there still waits for a task (:mod:`.grants`)."""
        waiting = self._waiting.get(node)
        return (waiting is not None and waiting[0].job_id == job_id) \
            or super()._granted_again(job_id, node)

    def _admit_arrays(self, tagged: dict[str, list[sp.TaskRow]], now: float,
                      out: SlurmPollEvents) -> None:
        for aid, group in sorted(tagged.items(), key=lambda kv: int(kv[0])):
            if not self._is_new(aid):
                continue
            req: JobRequest | None = None
            if any(r.state is not TaskState.DONE or rules.recoverable(r) for r in group):
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
                           out: SlurmPollEvents) -> None:
        """Workers that started, and workers that are gone (preempted or stopped)."""
        self._requeued = {k for k in self._requeued
                          if k in current and current[k].state is TaskState.ENDING}
        for key, row in current.items():
            if row.array_id not in self._jobs or not row.node or row.state not in rules.ACTIVE \
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
            requeued = key not in self._stopping and rules.requeued_now(self._rows.get(key), seen)
            if seen is not None and seen.state in rules.ACTIVE and not requeued \
                    and seen.node in ("", self._workers[key][1]):
                continue  # (on another node: gone from this one, seen there next poll)
            aid, node = self._workers.pop(key)
            if key in self._stopping:
                self._left[key] = (node, now)
                if not self._granted_again(aid, node):
                    out.stopped.append(WorkerStopped(now, aid, node))
            elif seen is not None and (requeued or seen.state in (TaskState.PENDING,
                                                                  TaskState.HELD)
                                       or rules.code(seen) in rules.REQUEUED_BY_SLURM):
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
                         out: SlurmPollEvents) -> None:
        """Grows that did not happen, tasks that must not run unordered, time-outs, failed
        tasks of live jobs (see :func:`.rules.runnable`)."""
        groups: dict[str, list[sp.TaskRow]] = {}
        for r in current.values():
            groups.setdefault(r.array_id, []).append(r)
        alive = {aid for aid, group in groups.items() if rules.runnable(group)}
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
            if rules.recoverable(row) and key not in self._stopping:
                out.to_requeuehold.append(key)
            elif rules.failed(row) and key not in self._stopping and row.array_id in alive:
                self._task_failed(key, row, now, out)
                if row.array_id not in self._jobs:
                    continue
            elif row.state is TaskState.HELD or (row.state is TaskState.PENDING and row.held) \
                    or (row.state is TaskState.DONE and not rules.recoverable(row)):
                self._stopping.discard(key)
        for key in [k for k in self._launching if k not in current]:
            launch = self._launching.pop(key)
            out.stopped.append(WorkerStopped(now, launch.job_id, launch.node))
            self._dropped.append((launch.job_id, launch.node))

    def _task_failed(self, key: str, row: sp.TaskRow, now: float, out: SlurmPollEvents) -> None:
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
        code = rules.code(row)
        times = [t for t in self._failures.get(aid, []) if now - t < self.task_failure_window_s]
        if code not in rules.NODE_FAULTS:
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
                        out: SlurmPollEvents) -> None:
        """A job ends when a task completed (training done) or no task is left to run."""
        for aid in list(self._jobs):
            group = tagged.get(aid, [])
            codes = {rules.code(r) for r in group if r.state is TaskState.DONE}
            if "COMPLETED" in codes:
                reason = EndReason.COMPLETED
            elif rules.runnable(group):
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
        launching = {launch.node for launch in self._launching.values()} | set(self._waiting)
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
            self._waiting.pop(name, None)
            for key in [k for k, la in self._launching.items() if la.node == name]:
                del self._launching[key]  # the engine drops it with NodesReclaimed
                self._run_quietly("hold", [key])
        for name in [n for n in self._offered if n not in nodes]:
            del self._offered[name]
            self._waiting.pop(name, None)
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
