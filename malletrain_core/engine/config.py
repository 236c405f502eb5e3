"""The engine's typed configuration and the public read-only views of its state."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING

from ..errors import ConfigError
from ..model import DEFAULT_LOOKAHEAD_S, Constraints, Curve, Objective, Problem, Solution

if TYPE_CHECKING:
    from .survival import LifetimePredictor

Policy = Callable[[Problem], Solution]
"""An allocation policy: node counts for every job of a :class:`~malletrain_core.model.Problem`."""


@dataclass(frozen=True)
class EngineConfig:
    """How one engine decides.

    ``max_running_jobs`` is the paper's P_jmax: at most this many jobs are admitted (profiling or
    running) at once, FCFS; ``None`` admits every job. ``profiling`` turns the Job Profiling
    Advisor on for jobs that bring no curve, and lets every job's believed curve follow its
    progress reports; with it off the engine trusts the curves it is given (FreeTrain), and a
    job without one is run once at the largest scale it can get and assumed to scale linearly
    from that measurement. Rescale costs are the monitor's measurements once it has them, else
    the job's declared ones, else the defaults here. ``default_time_limit_s`` is the time limit
    of a grow onto nodes whose hole has no known end.
    """

    lookahead_s: float = DEFAULT_LOOKAHEAD_S
    objective: Objective = Objective.THROUGHPUT
    max_running_jobs: int | None = None
    constraints: Constraints = field(default_factory=Constraints)
    solver: str = "auto"
    profiling: bool = True
    profile_window_s: float = 60.0
    default_scale_up_s: float = 20.0
    default_scale_down_s: float = 12.0
    default_time_limit_s: float = 72 * 3600.0
    done_retention_s: float | None = None
    """Seconds (of event time) a finished job stays in the engine's state; ``None`` keeps it
    for good. The daemon sets ``daemon.finished_job_retention_s``, so that a long-running
    site's memory and snapshots do not grow with every job ever submitted."""
    lifetime: LifetimePredictor | None = field(default=None, compare=False)
    """When set, each idle node is worth its predicted remaining idle time instead of
    ``lookahead_s`` (:mod:`malletrain_core.allocator.lifetime`); side constraints are then
    not honoured."""

    def __post_init__(self) -> None:
        for name in ("lookahead_s", "profile_window_s", "default_scale_up_s",
                     "default_scale_down_s", "default_time_limit_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                    math.isnan(value) or math.isinf(value) or value < 0:
                raise ConfigError(f"engine: {name} = {value!r}: give a finite number of "
                                  "seconds ≥ 0")
        keep = self.done_retention_s
        if keep is not None and (isinstance(keep, bool) or not isinstance(keep, (int, float))
                                 or not 0 <= keep < math.inf):
            raise ConfigError(f"engine: done_retention_s = {keep!r}: give a finite number of "
                              "seconds ≥ 0, or None to keep finished jobs")
        if self.profile_window_s <= 0:
            raise ConfigError(f"engine: profile_window_s = {self.profile_window_s!r}: give a "
                              "window > 0 seconds (60 s is the default)")
        cap = self.max_running_jobs
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):
            raise ConfigError(f"engine: max_running_jobs = {cap!r}: give a whole number ≥ 1, "
                              "or None for no cap")
        if not isinstance(self.objective, Objective):
            try:
                object.__setattr__(self, "objective", Objective(self.objective))
            except ValueError:
                raise ConfigError(f"engine: objective = {self.objective!r}: choose one of "
                                  f"{[o.value for o in Objective]}") from None


class JobPhase(str, Enum):
    """Where a job is in the engine's lifecycle."""

    QUEUED = "queued"
    """Submitted, not admitted yet (admission cap reached, or no nodes to profile it on)."""
    PROFILING = "profiling"
    """Admitted; the profiler decides its scale while it measures its curve (it trains)."""
    RUNNING = "running"
    """Admitted with a believed curve; the allocator decides its scale (possibly 0 nodes)."""
    DONE = "done"
    """Ended (completed, cancelled or failed); kept for inspection (for
    :attr:`EngineConfig.done_retention_s`, then forgotten)."""


@dataclass(frozen=True)
class JobView:
    """A read-only snapshot of one job as the engine sees it.

    ``curve`` is the believed throughput curve (``None`` until something is known),
    ``measured`` the monitor's throughput per scale, and the costs are measured seconds of lost
    progress where the monitor has seen a rescale, else the declared or default ones.
    """

    id: str
    phase: JobPhase
    nodes: tuple[str, ...]
    curve: Curve | None
    measured: Mapping[int, float]
    scale_up_s: float
    scale_down_s: float
    min_nodes: int = 1
    max_nodes: int = 1
    owner: str = ""
    model: str = ""
    submitted: float = 0.0


@dataclass
class EngineStats:
    """Counters of what the engine did (``preemptions``: jobs that lost nodes to a reclaim;
    ``profile_extensions``: extra measurements of running jobs at larger scales; ``solves``:
    policy calls, which took ``solve_ms`` in all; ``held_node_s``: node-seconds held by jobs,
    integrated over event time; ``forgotten``: finished jobs dropped from the state after
    :attr:`EngineConfig.done_retention_s`)."""

    replans: int = 0
    grows: int = 0
    shrinks: int = 0
    checkpoints: int = 0
    preemptions: int = 0
    admitted: int = 0
    profiled: int = 0
    profile_extensions: int = 0
    solver_failures: int = 0
    solve_ms: float = 0.0
    solves: int = 0
    held_node_s: float = 0.0
    forgotten: int = 0

    def to_dict(self) -> dict[str, float]:
        return dict(vars(self))

    def load_state_dict(self, state: Mapping[str, float]) -> None:
        """Set the counters :meth:`to_dict` wrote (in place: the profiler shares them)."""
        unknown = set(state) - set(vars(self))
        if unknown:
            raise ValueError(f"unknown engine counters {sorted(unknown)}")
        for key, value in state.items():
            setattr(self, key, value)
