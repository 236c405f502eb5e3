"""Lifecycle enums and translation tables from batch-system state codes.

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


SLURM_NODE_STATES: dict[str, NodeState] = {
    "idle": NodeState.IDLE, "planned": NodeState.PLANNED,
    "allocated": NodeState.BUSY, "alloc": NodeState.BUSY, "mixed": NodeState.BUSY,
    "mix": NodeState.BUSY, "completing": NodeState.BUSY, "comp": NodeState.BUSY,
    "reserved": NodeState.BUSY, "resv": NodeState.BUSY,
    "down": NodeState.DOWN, "drained": NodeState.DOWN, "drain": NodeState.DOWN,
    "draining": NodeState.DOWN, "drng": NodeState.DOWN, "fail": NodeState.DOWN,
    "failing": NodeState.DOWN, "future": NodeState.DOWN, "unknown": NodeState.UNKNOWN,
    "maint": NodeState.DOWN, "inval": NodeState.DOWN, "powered_down": NodeState.DOWN,
    "power_down": NodeState.DOWN, "powering_up": NodeState.DOWN, "reboot": NodeState.DOWN,
}

SLURM_JOB_STATES: dict[str, TaskState] = {
    "PENDING": TaskState.PENDING, "PD": TaskState.PENDING,
    "CONFIGURING": TaskState.RUNNING, "CF": TaskState.RUNNING,
    "RUNNING": TaskState.RUNNING, "R": TaskState.RUNNING,
    "SUSPENDED": TaskState.RUNNING, "S": TaskState.RUNNING,
    "COMPLETING": TaskState.ENDING, "CG": TaskState.ENDING,
    "REQUEUED": TaskState.PENDING, "RQ": TaskState.PENDING,
    "REQUEUE_HOLD": TaskState.HELD, "RH": TaskState.HELD,
    "REQUEUE_FED": TaskState.PENDING, "RF": TaskState.PENDING,
    "RESIZING": TaskState.RUNNING, "RS": TaskState.RUNNING,
    "SIGNALING": TaskState.RUNNING, "SI": TaskState.RUNNING,
    "STAGE_OUT": TaskState.ENDING, "SO": TaskState.ENDING,
    "STOPPED": TaskState.RUNNING, "ST": TaskState.RUNNING,
    "COMPLETED": TaskState.DONE, "CD": TaskState.DONE,
    "CANCELLED": TaskState.DONE, "CA": TaskState.DONE,
    "FAILED": TaskState.DONE, "F": TaskState.DONE,
    "TIMEOUT": TaskState.DONE, "TO": TaskState.DONE,
    "PREEMPTED": TaskState.DONE, "PR": TaskState.DONE,
    "NODE_FAIL": TaskState.DONE, "NF": TaskState.DONE,
    "BOOT_FAIL": TaskState.DONE, "BF": TaskState.DONE,
    "DEADLINE": TaskState.DONE, "DL": TaskState.DONE,
    "OUT_OF_MEMORY": TaskState.DONE, "OOM": TaskState.DONE,
    "SPECIAL_EXIT": TaskState.HELD, "SE": TaskState.HELD,
    "REVOKED": TaskState.DONE, "RV": TaskState.DONE,
}

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


def slurm_node_state(code: str) -> NodeState:
    return translate(SLURM_NODE_STATES, code, "slurm node", NodeState.UNKNOWN)  # type: ignore[return-value]


def slurm_task_state(code: str) -> TaskState:
    return translate(SLURM_JOB_STATES, code, "slurm job", TaskState.UNKNOWN)  # type: ignore[return-value]
