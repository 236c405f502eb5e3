"""PBS Professional / OpenPBS: an elastic job is an array of one-node subjobs in a
preemptable queue (see :mod:`.backend`)."""

from __future__ import annotations

from ...config import Config
from ...runner import with_bin_dir
from ..system import BatchSystem
from .backend import PbsBackend
from .checks import admin_checks

__all__ = ["SYSTEM", "PbsBackend", "from_config"]


def from_config(config: Config) -> PbsBackend:
    """The backend ``malletraind`` runs with ``daemon.batch_system = "pbs"``."""
    p = config.pbs
    return PbsBackend(with_bin_dir(p.bin_dir, p.command_timeout_s), queue=p.queue,
                      grant_timeout_s=p.grant_timeout_s)


SYSTEM = BatchSystem(from_config, admin_checks=admin_checks,
                     job_key_file=lambda config: config.pbs.job_key_file)
