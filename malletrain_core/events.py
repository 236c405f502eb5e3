"""Events into the engine and actions out of it: the engine's whole vocabulary.

Time is carried by the events (``time`` in seconds, any epoch); the engine has no clock.
Backends (Slurm, PBS, the simulator) translate their batch system's state into these events
and execute the actions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from .model import Curve


@dataclass(frozen=True)
class IdleNode:
    """A node that became idle; ``hole_end`` is the time the batch system wants it back, when
    its plan says so (a backfill hole), else ``None``; ``group`` its topology group."""

    name: str
    hole_end: float | None = None
    group: str | None = None


@dataclass(frozen=True)
class JobRequest:
    """What a user submitted: elastic bounds, optional curve, declared model, profiling choice."""

    id: str
    min_nodes: int
    max_nodes: int
    owner: str = ""
    model: str = ""
    curve: Curve | None = None
    profile: bool = True
    """Let the Job Profiling Advisor measure the curve (ignored when ``curve`` is given)."""
    scale_up_s: float | None = None
    scale_down_s: float | None = None
    work: float | None = None
    """Samples to train before the job is done (simulator workloads); ``None``: until it ends."""
    trainer: str = ""
    """The trainer the user asked for (``--comment=trainer=NAME``); "": the default one."""


class EndReason(str, Enum):
    """Why a job left MalleTrain."""

    COMPLETED = "completed"
    CANCELLED = "cancelled"
    FAILED = "failed"


@dataclass(frozen=True)
class Event:
    time: float


@dataclass(frozen=True)
class NodesIdle(Event):
    """Nodes the batch system left idle and offers to MalleTrain."""

    nodes: tuple[IdleNode, ...] = ()


@dataclass(frozen=True)
class NodesReclaimed(Event):
    """The batch system took these nodes back (preemption of whatever ran there)."""

    nodes: tuple[str, ...] = ()


@dataclass(frozen=True)
class JobSubmitted(Event):
    job: JobRequest = field(default_factory=lambda: JobRequest("?", min_nodes=1, max_nodes=1))


@dataclass(frozen=True)
class JobEnded(Event):
    """The job finished, was cancelled or failed: its nodes are free again."""

    job_id: str = ""
    reason: EndReason = EndReason.COMPLETED


@dataclass(frozen=True)
class ProgressReport(Event):
    """A training job's report: cumulative ``samples`` at ``time``, trained at ``world_size``."""

    job_id: str = ""
    samples: float = 0.0
    world_size: int = 0
    epoch: int = 0


@dataclass(frozen=True)
class WorkerStarted(Event):
    job_id: str = ""
    node: str = ""


@dataclass(frozen=True)
class WorkerStopped(Event):
    job_id: str = ""
    node: str = ""


@dataclass(frozen=True)
class Tick(Event):
    """Periodic wake-up: lets time-based decisions (profiling windows) progress."""


@dataclass(frozen=True)
class Action:
    job_id: str


@dataclass(frozen=True)
class Grow(Action):
    """Start workers of ``job_id`` on ``nodes``; ``time_limit_s`` fits the shortest hole."""

    nodes: tuple[str, ...] = ()
    time_limit_s: float | None = None


@dataclass(frozen=True)
class Shrink(Action):
    """Stop the workers of ``job_id`` on ``nodes`` (they return to the idle pool)."""

    nodes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Checkpoint(Action):
    """Ask the job to checkpoint at its next step boundary (before a planned rescale)."""


@dataclass(frozen=True)
class Finish(Action):
    """The job is done or gone: release all its nodes and cancel whatever it still holds."""
