"""The ``[slurm]`` section of malletrain.toml: the Slurm backend's settings, their defaults and
their checks, in one place.

A leaf module (it imports only the errors): :mod:`malletrain_core.config` reads the section
into a :class:`SlurmOptions` without importing the backend, and the Slurm registry entry
(:mod:`.system`) names it. The backend's own defaults and checks come from here.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

from ...errors import ConfigError


@dataclass(frozen=True)
class SlurmOptions:
    """The ``[slurm]`` section (malletrain.toml documents each key). Each default is the one
    default of its setting: the backend's module constants (``DEFAULT_TIME_LIMIT_S``,
    ``HOLE_MARGIN_S``, ...) and its constructor's defaults are read from here."""

    partition: str = "preemptable"
    default_time_limit_s: float = 72 * 3600.0
    command_timeout_s: float = 30.0
    bin_dir: str = ""
    pyslurm: str = "off"
    unplanned_wait_s: float = 60.0
    hole_margin_s: float = 60.0
    """Taken off a planned hole: at least the backfill's bf_resolution (Slurm's default 60 s);
    a cluster that plans in finer steps fills shorter holes with a smaller margin."""
    epilog_margin_s: float = 0.0
    """Taken off a planned hole on top of ``hole_margin_s`` where the nodes run a node
    ``Epilog``: a task's Epilog keeps its node COMPLETING, and the waiting job cannot have the
    node until it ends. ``backends.slurm.backend.epilog_margin_for`` gives the figure (the
    Epilog's longest run plus slurmctld's 30-s time-limit check); 0: no node Epilog."""
    grant_timeout_s: float = 90.0
    """A released task that is not running after this long is held again and its node given
    back to the allocator, which plans again at once: a grant must start at Slurm's next
    scheduling pass, or at the next backfill cycle for a planned hole, and may wait for a
    preempted predecessor's KillWait. ``backends.slurm.backend.grant_timeout_for`` gives the
    figure a cluster's settings call for (73 s at Slurm's defaults; 13 s on the local test
    cluster). The one default: the backend's own comes from here."""
    task_failures_max: int = 5
    task_failure_window_s: float = 600.0

    def problems(self) -> Iterator[tuple[str, str]]:
        """Each setting that cannot be meant: (its key, one line saying what it must be)."""
        for key, value, what in (
                ("command_timeout_s", self.command_timeout_s, "a finite number"),
                ("default_time_limit_s", self.default_time_limit_s, "a finite number"),
                ("grant_timeout_s", self.grant_timeout_s, "a finite number of seconds"),
                ("task_failure_window_s", self.task_failure_window_s,
                 "a finite number of seconds")):
            if not value > 0 or not math.isfinite(value):
                yield key, f"{value!r} must be {what} > 0"
        if self.default_time_limit_s < 60:
            yield "default_time_limit_s", (f"{self.default_time_limit_s:g} s is under Slurm's "
                                           "one-minute unit")
        for key, value, hint in (
                ("unplanned_wait_s", self.unplanned_wait_s,
                 "0: grants never wait for other jobs"),
                ("hole_margin_s", self.hole_margin_s, "bf_resolution + bf_interval of slurm.conf"),
                ("epilog_margin_s", self.epilog_margin_s,
                 "the node Epilog's longest run + 30; 0 without a node Epilog")):
            if not value >= 0 or not math.isfinite(value):
                yield key, f"{value!r} must be a finite number ≥ 0 ({hint})"
        if self.task_failures_max < 1:
            yield "task_failures_max", (f"{self.task_failures_max!r} must be at least 1 (task "
                                        "failures before a job is stopped)")

    def validate(self) -> None:
        """The ``[slurm]`` section's own checks: a ConfigError naming the first wrong key (the
        configuration calls it; the backend reads the same :meth:`problems`)."""
        for key, problem in self.problems():
            raise ConfigError(f"slurm.{key}: {problem}")
