"""The PBS registry entry: how ``malletraind`` builds the backend from its ``[pbs]`` settings
(:mod:`.options`), the admin checks and the rest of :class:`~..system.BatchSystem`."""

from __future__ import annotations

from ...config import Config
from ...runner import with_bin_dir
from ..system import BatchSystem
from .backend import PbsBackend
from .checks import admin_checks
from .options import PbsOptions

__all__ = ["SYSTEM", "from_config"]


def from_config(config: Config) -> PbsBackend:
    """The backend ``malletraind`` runs with ``daemon.batch_system = "pbs"``."""
    p = config.pbs
    return PbsBackend(with_bin_dir(p.bin_dir, p.command_timeout_s), queue=p.queue,
                      grant_timeout_s=p.grant_timeout_s)


SYSTEM = BatchSystem(from_config, section="pbs", options=PbsOptions, admin_checks=admin_checks,
                     job_key_file=lambda config: config.pbs.job_key_file)
