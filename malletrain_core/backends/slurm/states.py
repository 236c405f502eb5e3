"""Slurm's node and job state codes, as ``sinfo``/``squeue`` print them, mapped onto the
backends' lifecycle enums."""

from __future__ import annotations

from ..states import NodeState, TaskState, translate

NODE_STATES: dict[str, NodeState] = {
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

JOB_STATES: dict[str, TaskState] = {
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

def node_state(code: str) -> NodeState:
    return translate(NODE_STATES, code, "slurm node", NodeState.UNKNOWN)  # type: ignore[return-value]


def task_state(code: str) -> TaskState:
    return translate(JOB_STATES, code, "slurm job", TaskState.UNKNOWN)  # type: ignore[return-value]
