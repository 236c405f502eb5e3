"""A launcher's check-in and the daemon's reply, as they travel on the wire.

``malletrain-run`` (:mod:`malletrain_core.worker.launcher`) builds a :class:`CheckIn` and sends
its :meth:`CheckIn.to_args` as the arguments of the API op ``checkin``; ``malletraind``
(:mod:`malletrain_core.daemon.launchers`) reads them back with :meth:`CheckIn.from_args` and
answers a :class:`CheckInReply`. The keys and values are those of launcher protocol
:data:`~.orders.VERSION` (``tests/test_wire_checkin.py`` pins the bytes): a launcher of
release 0.1 sent no ``proto``, ``inplace``, ``ready`` nor ``hold_s`` and is read as
protocol 1, not in place, ready, not held.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from typing import Any

from ..errors import MalleTrainError
from .orders import VERSION, Order

MAX_HOLD_S = 10.0
"""A held check-in returns after this long at most (the launcher's client waits 30 s)."""


class LauncherState(str, Enum):
    """Where a launcher is, as its check-in says (the values are the wire's)."""

    IDLE = "idle"
    """No training process of an epoch (never started, stopped, or started ahead in place)."""
    RUNNING = "running"
    """Its training processes run the epoch it names."""
    EXITED = "exited"
    """Its training processes of the epoch it names exited with ``rc``."""


class CheckInError(MalleTrainError):
    """A check-in that cannot be read (the API answers it as one line)."""


@dataclass(frozen=True)
class CheckIn:
    """One launcher's check-in: who it is (``job``, ``node``, ``task``), what it runs
    (``epoch``, ``state``, ``rc``), where its node is reached (``addr``), the last checkpoint
    request it relayed (``ckpt_seen``) and, in place, whether its process is ready to join,
    how long the daemon may hold the reply (``hold_s``) and the node ranks its processes found
    silent in an epoch (``lost``: ``(epoch, ranks)``, sent only then)."""

    job: str
    node: str
    task: str | None = None
    epoch: int | None = None
    state: LauncherState = LauncherState.IDLE
    rc: int | None = None
    addr: str = ""
    ckpt_seen: int = 0
    proto: int = VERSION
    inplace: bool = False
    ready: bool = True
    hold_s: float = 0.0
    lost: tuple[int, tuple[int, ...]] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "state", state_of(self.state))

    def to_args(self) -> dict[str, Any]:
        """The op's arguments: every field, the in-place ones only in place (as sent since
        protocol 1)."""
        args: dict[str, Any] = {"job": self.job, "node": self.node, "task": self.task,
                                "epoch": self.epoch, "state": self.state.value, "rc": self.rc,
                                "addr": self.addr, "ckpt_seen": self.ckpt_seen,
                                "proto": self.proto}
        if self.inplace:
            args.update(inplace=True, ready=self.ready, hold_s=self.hold_s)
            if self.lost is not None:
                args["lost"] = [self.lost[0], list(self.lost[1])]
        return args

    @classmethod
    def from_args(cls, args: dict[str, Any]) -> CheckIn:
        """Read a check-in's arguments; :class:`CheckInError` (one line) when malformed. An
        unknown ``state`` is left to the coordinator to refuse, naming the valid ones."""
        try:
            hold_s = float(args.get("hold_s", 0.0))
            return cls(
                job=str(args["job"]), node=str(args["node"]),
                task=None if args.get("task") is None else str(args["task"]),
                epoch=None if args.get("epoch") is None else int(args["epoch"]),
                state=str(args.get("state", "idle")),  # type: ignore[arg-type]
                rc=None if args.get("rc") is None else int(args["rc"]),
                addr=str(args.get("addr", "")), ckpt_seen=int(args.get("ckpt_seen", 0)),
                proto=int(args.get("proto", 1)),  # release 0.1's launchers sent none: 1
                inplace=bool(args.get("inplace", False)), ready=bool(args.get("ready", True)),
                hold_s=min(max(hold_s, 0.0), MAX_HOLD_S) if math.isfinite(hold_s) else 0.0,
                lost=lost_of(args.get("lost")))
        except (KeyError, TypeError, ValueError, OverflowError):
            raise CheckInError("checkin needs job and node (strings); epoch, rc and ckpt_seen "
                               "are integers; lost is [epoch, [node ranks]]") from None


MAX_LOST_RANKS = 4096


def lost_of(value: Any) -> tuple[int, tuple[int, ...]] | None:
    """A check-in's ``lost``: ``[epoch, [node ranks]]`` (at most :data:`MAX_LOST_RANKS`
    ranks), or None; ValueError or TypeError when malformed."""
    if value is None:
        return None
    epoch, ranks = value
    if len(ranks) > MAX_LOST_RANKS:
        raise ValueError("too many ranks")
    return int(epoch), tuple(int(r) for r in ranks)


def state_of(value: str | LauncherState) -> LauncherState:
    """The launcher state a check-in names; :class:`CheckInError` naming the valid ones."""
    try:
        return LauncherState(value)
    except ValueError:
        raise CheckInError(f"checkin: state {value!r}; use one of "
                           f"{', '.join(s.value for s in LauncherState)}") from None


@dataclass(frozen=True)
class CheckInReply:
    """The daemon's answer: the ``order``, and with the first ``run`` order of a launcher not
    running yet the job's report ``key`` (wrapped for the job's owner) and the address where
    reports go (``report_addr``)."""

    order: Order
    key: str | None = None
    report_addr: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"order": self.order.to_dict()}
        if self.key is not None:
            out["key"] = self.key
        if self.report_addr is not None:
            out["report_addr"] = self.report_addr
        return out

    @classmethod
    def from_dict(cls, data: Any) -> CheckInReply:
        """Read a reply received over the wire; :class:`~.orders.EpochError` when its order is
        malformed, :class:`CheckInError` when the reply is not a mapping."""
        if not isinstance(data, dict):
            raise CheckInError("malformed check-in reply")
        key, addr = data.get("key"), data.get("report_addr")
        return cls(Order.from_dict(data.get("order")),
                   None if key is None else str(key), None if addr is None else str(addr))
