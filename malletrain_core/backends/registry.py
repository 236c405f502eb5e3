"""The one registry of batch systems: :data:`BATCH_SYSTEMS`: ``daemon.batch_system`` names one
of its keys, and ``malletraind`` builds its backend from the configuration with the function
registered there; the daemon and the CLI ask its entry (:class:`~.system.BatchSystem`) for
everything else about it. Adding a batch system is one package under ``backends/``, its import
and one line here, and, where it has settings, their field in
:class:`~.sections.BatchSystemSections` (docs/extending.md).
"""

from __future__ import annotations

from ..config import Config
from ..errors import ConfigError
from . import toy
from .base import Backend, TaskBackend
from .pbs import system as pbs
from .slurm import system as slurm
from .system import BatchSystem

BATCH_SYSTEMS: dict[str, BatchSystem] = {
    "slurm": slurm.SYSTEM,
    "pbs": pbs.SYSTEM,
    "toy": toy.SYSTEM,
}

__all__ = ["BATCH_SYSTEMS", "Backend", "BatchSystem", "TaskBackend", "build", "system"]


def system(config: Config) -> BatchSystem:
    """The entry of ``config.daemon.batch_system``; ConfigError naming the choices."""
    name = config.daemon.batch_system
    entry = BATCH_SYSTEMS.get(name)
    if entry is None:
        raise ConfigError(f"daemon.batch_system: {name!r} is not supported; use one of "
                          f"{', '.join(repr(n) for n in BATCH_SYSTEMS)}")
    return entry


def build(config: Config) -> Backend:
    """The backend of ``config.daemon.batch_system``; ConfigError naming the choices."""
    return system(config).backend(config)
