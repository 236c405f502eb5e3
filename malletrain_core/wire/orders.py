"""The orders the daemon gives each ``malletrain-run`` launcher, as they travel on the wire.

* ``run``        be in epoch ``e`` with this rank, world size, master, port and id (a launcher
                 that runs in place re-forms its live process; ``abandon``: a peer is gone);
* ``wait``       no epoch for this node now: stay idle and ask again;
* ``stop``       leave the epoch you run (the job shrank off this node, or a peer was lost);
* ``checkpoint`` ask rank 0 to checkpoint at its next step (before a planned change);
* ``exit``       training finished: the launcher exits.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from enum import Enum
from typing import Any

from ..errors import MalleTrainError

VERSION = 1
"""The launcher protocol: what a check-in announces (``proto``) and which orders it knows.
A check-in without ``proto`` is from a launcher of release 0.1, which spoke 1."""


class OrderKind(str, Enum):
    """The kinds of order (the values are the wire's; see the module docstring)."""

    RUN = "run"
    """Be in the order's epoch with its rank, world size, master, port and id."""
    WAIT = "wait"
    """No epoch for this node now: stay idle and ask again."""
    STOP = "stop"
    """Leave the epoch you run."""
    CHECKPOINT = "checkpoint"
    """Ask rank 0 to checkpoint at its next step (``request``: the request's number)."""
    EXIT = "exit"
    """Training finished: exit with ``rc``."""


ORDER_KINDS = tuple(kind.value for kind in OrderKind)


class EpochError(MalleTrainError):
    """A request the coordinator cannot satisfy (unknown job, port range exhausted)."""


@dataclass(frozen=True)
class Order:
    """What one launcher must do now; see the module docstring for the kinds."""

    kind: OrderKind
    epoch: int | None = None
    rank: int | None = None
    world: int | None = None
    master: str | None = None
    port: int | None = None
    rdzv_id: str | None = None
    request: int | None = None
    rc: int | None = None
    reason: str = ""
    abandon: bool | None = None   # run in place: a peer of the previous epoch is gone

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", OrderKind(self.kind))

    def to_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in asdict(self).items() if v is not None and v != ""}
        out["kind"] = self.kind.value
        return out

    @classmethod
    def from_dict(cls, data: Any) -> Order:
        """Parse an order received over the wire; raises :class:`EpochError` if malformed."""
        if isinstance(data, dict) and isinstance(data.get("kind"), str) \
                and data["kind"] not in ORDER_KINDS and data["kind"].isidentifier():
            raise EpochError(f"order {data['kind']!r} is not one this launcher knows (launcher "
                             f"protocol {VERSION}: {', '.join(ORDER_KINDS)}); the daemon must "
                             "send only what a launcher's check-in announces")
        if not isinstance(data, dict) or data.get("kind") not in ORDER_KINDS:
            raise EpochError(f"malformed order {data!r}; expected kind in {', '.join(ORDER_KINDS)}")
        ints = ("epoch", "rank", "world", "port", "request", "rc")
        try:
            args = {k: (int(data[k]) if k in ints else str(data[k]))
                    for k in ("epoch", "rank", "world", "master", "port", "rdzv_id", "request",
                              "rc", "reason") if data.get(k) is not None}
        except (TypeError, ValueError):
            raise EpochError(f"malformed order {data!r}") from None
        if data.get("abandon") is not None:
            args["abandon"] = bool(data["abandon"])
        order = cls(kind=OrderKind(data["kind"]), **args)  # type: ignore[arg-type]
        if order.kind is OrderKind.RUN and None in (order.epoch, order.rank, order.world, order.master,
                                            order.port, order.rdzv_id):
            raise EpochError(f"incomplete run order {data!r}")
        return order
