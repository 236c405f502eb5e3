"""Backends: translate a batch system's state into engine events and execute its actions.

:data:`BATCH_SYSTEMS` is the one registry of batch systems: ``daemon.batch_system`` names one
of its keys, and ``malletraind`` builds its backend from the configuration with the function
registered there. Adding a batch system is one package under ``backends/`` and one line here
(docs/extending.md).
"""

from __future__ import annotations

from collections.abc import Callable

from ..config import Config
from ..errors import ConfigError
from . import pbs, slurm, toy
from .base import Backend, TaskBackend

BATCH_SYSTEMS: dict[str, Callable[[Config], Backend]] = {
    "slurm": slurm.from_config,
    "pbs": pbs.from_config,
    "toy": toy.from_config,
}

__all__ = ["BATCH_SYSTEMS", "Backend", "TaskBackend", "build"]


def build(config: Config) -> Backend:
    """The backend of ``config.daemon.batch_system``; ConfigError naming the choices."""
    name = config.daemon.batch_system
    factory = BATCH_SYSTEMS.get(name)
    if factory is None:
        raise ConfigError(f"daemon.batch_system: {name!r} is not supported; use one of "
                          f"{', '.join(repr(n) for n in BATCH_SYSTEMS)}")
    return factory(config)
