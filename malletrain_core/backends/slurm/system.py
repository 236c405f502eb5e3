"""The Slurm registry entry: how ``malletraind`` builds the backend from its ``[slurm]`` settings
(:mod:`.options`), the admin checks and the rest of :class:`~..system.BatchSystem`."""

from __future__ import annotations

from ...config import Config
from ...runner import with_bin_dir
from ..system import BatchSystem
from .backend import SlurmBackend
from .checks import admin_checks
from .options import SlurmOptions
from .pyslurm_reader import source_for

__all__ = ["SYSTEM", "from_config"]


def from_config(config: Config) -> SlurmBackend:
    """The backend ``malletraind`` runs with ``daemon.batch_system = "slurm"``: the poll reads
    through pyslurm where ``slurm.pyslurm`` asks for it and a matching one exists."""
    s = config.slurm
    runner = with_bin_dir(s.bin_dir, s.command_timeout_s)
    return SlurmBackend(runner, partition=s.partition,
                        default_time_limit_s=s.default_time_limit_s,
                        unplanned_wait_s=s.unplanned_wait_s,
                        hole_margin_s=s.hole_margin_s,
                        epilog_margin_s=s.epilog_margin_s,
                        grant_timeout_s=s.grant_timeout_s,
                        task_failures_max=s.task_failures_max,
                        task_failure_window_s=s.task_failure_window_s,
                        source=source_for(s.pyslurm, runner))


SYSTEM = BatchSystem(from_config, section="slurm", options=SlurmOptions, admin_checks=admin_checks,
                     default_time_limit_s=lambda config: config.slurm.default_time_limit_s)
