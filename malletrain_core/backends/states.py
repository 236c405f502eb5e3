"""The lifecycle enums every backend maps its batch system's state codes onto.

Each batch system keeps its own table (``backends/slurm/states.py``, ``backends/pbs/parse.py``)
and looks codes up with :func:`translate`.

Unknown codes map to ``UNKNOWN`` and are logged once per code.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from enum import Enum

log = logging.getLogger(__name__)


class NodeState(str, Enum):
    """A node as MalleTrain sees it."""

    IDLE = "idle"            # free: MalleTrain may use it
    PLANNED = "planned"      # free, but a waiting job is planned on it (a hole with an end)
    HARVESTED = "harvested"  # running a MalleTrain worker
    BUSY = "busy"            # running a regular job
    DOWN = "down"            # down, drained, failing, unavailable
    UNKNOWN = "unknown"


class TaskState(str, Enum):
    """One worker task (a Slurm array task, a PBS subjob)."""

    HELD = "held"
    PENDING = "pending"
    RUNNING = "running"
    ENDING = "ending"
    DONE = "done"
    UNKNOWN = "unknown"


_logged: set[tuple[str, str]] = set()


def translate(table: Mapping[str, Enum], code: str, kind: str, unknown: Enum) -> Enum:
    """Look ``code`` up in ``table`` (flags after ``+``/``*``/``~``/``#`` stripped)."""
    key = code.strip().rstrip("*~#!%$@^-+")
    key = key.split("+", 1)[0]
    for candidate in (key, key.lower(), key.upper()):
        if candidate in table:
            return table[candidate]
    if (kind, code) not in _logged:
        _logged.add((kind, code))
        log.warning("unknown %s state %r: treated as %s", kind, code, unknown.value)
    return unknown
