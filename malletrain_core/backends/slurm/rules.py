"""What the Slurm backend reads into a task's state code, and the time figures a cluster's
settings call for: pure functions and constants, shared by the poll, the actions and the admin
checks (:mod:`.checks`)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from ..states import TaskState
from . import parse as sp
from .options import SlurmOptions

DEFAULT_TIME_LIMIT_S = SlurmOptions.default_time_limit_s

TASK_FAILURES_MAX = SlurmOptions.task_failures_max
"""A job whose tasks fail this many times within :data:`TASK_FAILURE_WINDOW_S` is stopped
(``slurm.task_failures_max``); each failure before that is requeued held, so the job keeps its
whole node range. A failure of the node (NODE_FAIL, BOOT_FAIL) is not the job's and never
counts."""

TASK_FAILURE_WINDOW_S = SlurmOptions.task_failure_window_s
"""The window over which :data:`TASK_FAILURES_MAX` counts a job's task failures."""

UNPLANNED_WAIT_S = SlurmOptions.unplanned_wait_s
"""How long a waiting job of another partition that Slurm has not planned yet (no start time
and no SchedNodes in ``squeue --start``) holds back new grants, counted from its submission
(see :meth:`~.backend.SlurmBackend._waiting_unplanned`); 0 turns the rule off."""

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

TIME_LIMIT_CHECK_S = 30
"""How often slurmctld enforces time limits (its PERIODIC_TIMEOUT, not a setting): a task runs
up to this long past its TimeLimit before Slurm ends it."""


def grant_timeout_for(bf_interval_s: int, batch_sched_delay_s: int, kill_wait_s: int) -> int:
    """The ``slurm.grant_timeout_s`` a cluster's settings call for: a released task starts at
    the main scheduler's next pass (``batch_sched_delay``) or, in a planned hole, at the next
    backfill cycle (``bf_interval``), after a preempted predecessor on the node is gone (up to
    KillWait); ten seconds more for a busy slurmctld and the daemon's poll."""
    return bf_interval_s + batch_sched_delay_s + kill_wait_s + 10


def hole_margin_for(bf_resolution_s: int, bf_interval_s: int) -> int:
    """The ``slurm.hole_margin_s`` a cluster's backfill settings call for: a task that fits a
    hole starts at a backfill cycle (up to ``bf_interval`` after its release), and the plan's
    times are rounded to ``bf_resolution``; one second more for the clock ticking between the
    daemon's read of the plan and its order."""
    return bf_resolution_s + bf_interval_s + 1


def epilog_margin_for(epilog_s: float) -> int:
    """The ``slurm.epilog_margin_s`` a node Epilog of ``epilog_s`` seconds (its longest run)
    calls for: a task fitted to a hole ends at its time limit, up to one time-limit check
    late, and its node stays COMPLETING until the Epilog is done; the waiting job's planned
    start must find it done. 0 without an Epilog."""
    if not epilog_s > 0:
        return 0
    return math.ceil(epilog_s) + TIME_LIMIT_CHECK_S


NODE_FAULTS = frozenset({"NODE_FAIL", "NF", "BOOT_FAIL", "BF"})
FAILED = frozenset({"FAILED", "F", "OUT_OF_MEMORY", "OOM"}) | NODE_FAULTS
ACTIVE = (TaskState.RUNNING, TaskState.ENDING)
REQUEUED_BY_SLURM = frozenset({"PREEMPTED", "NODE_FAIL", "BOOT_FAIL"})


def code(row: sp.TaskRow) -> str:
    """The task's state code without its flags (``CANCELLED by 0`` → ``CANCELLED``)."""
    return row.state_code.split()[0].rstrip("+") if row.state_code else ""


def requeued_now(before: sp.TaskRow | None, row: sp.TaskRow | None) -> bool:
    """Whether a worker's task, seen ``before`` at the last poll and ``row`` now, was requeued
    by Slurm (a preemption) since: COMPLETING with one more restart. Slurm sends the
    EpilogSlurmctld's wake-up at that requeue, while the task's processes still exit; waiting
    for it to show PENDING would keep the job's other members idle one more poll."""
    return (before is not None and row is not None and row.state is TaskState.ENDING
            and row.restarts > before.restarts)


def recoverable(row: sp.TaskRow) -> bool:
    """A task that hit its time limit ends TIMEOUT, not requeued: requeue-hold it for reuse."""
    return code(row) in ("TIMEOUT", "TO")


def failed(row: sp.TaskRow) -> bool:
    """A task that ended in a failure (its own code, its node, or a slurmd that refused it)."""
    return row.state is TaskState.DONE and code(row) in FAILED


def runnable(group: Sequence[sp.TaskRow]) -> bool:
    """Whether a job still has a task to run: one not ended, one that hit its time limit, or a
    failed one (requeued held until the job's failure budget is spent), unless the user
    cancelled some of them (a job whose tasks all ended, some cancelled, is over)."""
    cancelled = any(code(r) in ("CANCELLED", "CA") for r in group)
    return any(r.state is not TaskState.DONE or recoverable(r)
               or (failed(r) and not cancelled) for r in group)
