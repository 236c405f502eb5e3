"""A batch system's registry entry: everything the daemon and the CLI need to know about it.

One :class:`BatchSystem` per key of :data:`~malletrain_core.backends.registry.BATCH_SYSTEMS`,
made in the batch system's own package (``SYSTEM``). ``malletraind`` builds its backend with ``backend``,
gives the engine the time limit of ``default_time_limit_s`` and verifies job secrets with the
key of ``job_key_file``; ``malletrain admin check`` runs ``admin_checks``. Nothing outside
``backends/`` tests a batch system's name: it asks the entry.

The worker side (``malletrain-run``, :mod:`malletrain_core.worker.identity`) runs inside the
job and reaches no backend code, and the local test clusters are development tools outside
the package; neither is on the entry.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..config import Config
from .base import Backend
from .checks import Check


def _no_limit(config: Config) -> float | None:
    return None


def _no_key(config: Config) -> str:
    return ""


@dataclass(frozen=True)
class BatchSystem:
    """``backend`` builds the daemon's backend from the configuration. The rest is optional:
    ``section`` and ``options`` (the batch system's table of malletrain.toml and the frozen
    dataclass that holds it, with its defaults and a ``validate()``, in the batch system's
    ``options.py``; ``Config`` has a field of that name and type, ``tests/test_config.py``
    checks it), ``admin_checks`` (the site's setup, checked; ``None``: ``admin check`` says it has none),
    ``default_time_limit_s`` (the time limit of a grow onto a hole with no known end;
    ``None``: the engine's default) and ``job_key_file`` (a file of the key that signs job
    secrets where munge is not run; ``""``: none)."""

    backend: Callable[[Config], Backend]
    section: str = ""
    options: type | None = None
    admin_checks: Callable[[Config], list[Check]] | None = None
    default_time_limit_s: Callable[[Config], float | None] = _no_limit
    job_key_file: Callable[[Config], str] = _no_key
