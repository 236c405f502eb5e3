"""The hand-over: how a newly formed group's members come to hold one training state.

:class:`StateHandover` is the seam; :class:`BroadcastHandover`, the default, sends the whole
state of the most advanced member to every member that differs, in one broadcast over the new
group, and checks the digests after. A hand-over for a sharded state (each member holding its
shards, re-sharded for the new world) implements the same protocol and is given to
:class:`~.elastic.Elastic` as ``handover=``.
"""

from __future__ import annotations

import hashlib
import io
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol


def _feed(h: Any, obj: Any) -> None:
    """Hash a nested state (tensors by dtype, shape and bytes) deterministically."""
    import torch

    if isinstance(obj, torch.Tensor):
        t = obj.detach().cpu().contiguous()
        h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
        # reshape: a 0-dim tensor (BatchNorm's num_batches_tracked) cannot be viewed as bytes
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    elif isinstance(obj, Mapping):
        h.update(b"{")
        for k in sorted(obj, key=repr):
            h.update(repr(k).encode())
            _feed(h, obj[k])
        h.update(b"}")
    elif isinstance(obj, (list, tuple)):
        h.update(b"[")
        for v in obj:
            _feed(h, v)
        h.update(b"]")
    else:  # numbers, strings, None, booleans: their repr is exact and deterministic
        h.update(f"{type(obj).__name__}:{obj!r}".encode())


def digest(state: Any) -> str:
    """The sha256 of a training state (equal states give equal digests on any rank)."""
    h = hashlib.sha256()
    _feed(h, state)
    return h.hexdigest()



@dataclass(frozen=True)
class Handed:
    """What one member's hand-over did: the rank whose state every member now holds, the
    bytes it sent (0: every member held it already), the member's digest after, and whether
    the step being re-formed inside is kept (every member holds its gradients, on equal
    states: see :meth:`~.elastic.Elastic.average_gradients`)."""

    source: int
    sent_bytes: int
    digest: str
    kept_step: bool = False

    def record(self) -> dict[str, Any]:
        """The fields of a change record (:attr:`~.elastic.Elastic.changes`)."""
        return {"source": self.source, "sent_bytes": self.sent_bytes, "digest": self.digest}


class HandoverMember(Protocol):
    """What a hand-over reads and calls of the member it runs in (an
    :class:`~.elastic.Elastic`): its place in the new group, its state, and the hooks a
    subclass may override (``_load``, ``_resume``)."""

    rank: int
    world: int
    local_world: int
    step: int
    has_state: bool
    model: Any
    optimizer: Any
    scheduler: Any
    net: Any
    extra: dict[str, Any]
    session: Any

    @property
    def holding_step(self) -> bool:
        """Whether this member re-forms inside a step, holding that step's gradients."""

    @property
    def _device(self) -> Any:
        """Where collective tensors live (the GPU for NCCL, else the CPU)."""

    def state(self) -> dict[str, Any]: ...

    def digest(self) -> str: ...

    def _load(self, payload: dict[str, Any]) -> None:
        """Apply a received payload (``{"state": ..., ...}``) to this member."""

    def _resume(self) -> None:
        """Load the last disk checkpoint, if there is one."""

    def _collective(self, op: Callable[..., Any], *args: Any) -> None:
        """Run ``op(*args, async_op=True)`` on the group and wait for it, abandonably."""


class StateHandover(Protocol):
    """How the training state reaches every member of a new group.

    :meth:`hand_over` runs on every member of the group just formed, before the model is
    wrapped again, with ``group`` that group (torch's default group from then on: ranks
    ``member.rank`` of ``member.world``). Every member makes the same collectives in the same
    order, each through ``member._collective``, so that a peer lost meanwhile fails them at
    once (the re-form then moves on to the next epoch). When no member holds a state in memory
    (``has_state`` false on all: the job's first epoch, every holder lost), each one loads the
    last checkpoint (``member._resume()``). On return every member holds the same state, or it
    raised."""

    def contribution(self, member: HandoverMember) -> dict[str, Any]:
        """What ``member`` sends when the others take their state from it."""

    def apply(self, member: HandoverMember, received: dict[str, Any]) -> None:
        """Load what was received from the source into ``member``."""

    def hand_over(self, member: HandoverMember, group: Any) -> Handed:
        """Bring every member to the most advanced member's state over ``group``."""

    def before_reform(self, member: HandoverMember, group: Any, coming: Any) -> None:
        """At a planned change, on every member of the current ``group`` before it is let
        go (leavers included), ``coming`` being this member's next membership
        (:class:`~malletrain_core.worker.control.Membership`; ``coming.leave`` on a leaver):
        what the members that stay need from the leavers moves now. Collectives through
        ``member._collective``, as in :meth:`hand_over`; a no-op when nothing must move."""


class BroadcastHandover:
    """The whole state, pickled with ``torch.save`` (model, optimizer, scheduler, extras,
    step, samples, the RNGs), broadcast from the most advanced member (the highest step, then
    the lowest rank) in one message, loaded with ``weights_only`` and digest-checked; nothing
    is sent when every member's digest is the source's already."""

    def contribution(self, member: HandoverMember) -> dict[str, Any]:
        import torch

        return {"state": member.state(), "samples": member.session.samples,
                "rng": torch.get_rng_state(), "py_rng": random.getstate()}

    def apply(self, member: HandoverMember, received: dict[str, Any]) -> None:
        member._load(received)

    def before_reform(self, member: HandoverMember, group: Any, coming: Any) -> None:
        """Nothing: every member holds the whole state."""

    @staticmethod
    def _digest_without_buffers(member: HandoverMember) -> str:
        """The digest of the state less the model's buffers (only its parameters)."""
        state = member.state()
        params = {name for name, _ in member.model.named_parameters()}
        state["model"] = {k: v for k, v in state["model"].items() if k in params}
        return digest(state)

    def hand_over(self, member: HandoverMember, group: Any) -> Handed:
        """Agree on the most advanced member and send its state to every rank that differs.
        The collectives run on the default group, which is ``group``."""
        import torch
        import torch.distributed as dist

        holding = member.holding_step
        if member.world == 1:
            if not member.has_state:
                member._resume()
            return Handed(0, 0, member.digest(), kept_step=holding)
        dev = member._device
        flag = torch.tensor([1 if member.has_state else 0], dtype=torch.int64, device=dev)
        member._collective(dist.all_reduce, flag, dist.ReduceOp.MAX)
        if int(flag[0]) == 0:
            member._resume()  # nobody holds a state in memory: every rank reads the checkpoint
        mine = member.digest()
        # Holding a step, the members compare their states less the model's buffers: the
        # forward pass has put this rank's batch into BatchNorm's running statistics, which
        # the step's all-reduce then averages (see average_gradients).
        agree = self._digest_without_buffers(member) if holding else mine
        # (step held, digest, step whose gradients are held or -1): see average_gradients
        info = torch.tensor([member.step if member.has_state else -1, int(agree[:15], 16),
                             member.step if holding else -1],
                            dtype=torch.int64, device=dev)
        rows = [torch.zeros(3, dtype=torch.int64, device=dev) for _ in range(member.world)]
        member._collective(dist.all_gather, rows, info)
        steps = [int(r[0]) for r in rows]
        src = max(range(member.world), key=lambda r: (steps[r], -r))
        need = any(int(r[0]) != steps[src] or int(r[1]) != int(rows[src][1]) for r in rows)
        kept = not need and all(int(r[2]) == steps[src] >= 0 for r in rows)
        sent = 0
        if need:
            size = torch.zeros(1, dtype=torch.int64, device=dev)
            data = b""
            if member.rank == src:
                buf = io.BytesIO()
                torch.save(self.contribution(member), buf)
                data = buf.getvalue()
                size[0] = len(data)
            member._collective(dist.broadcast, size, src)
            sent = int(size[0])
            blob = (torch.frombuffer(bytearray(data), dtype=torch.uint8).to(dev)
                    if member.rank == src
                    else torch.empty(sent, dtype=torch.uint8, device=dev))
            member._collective(dist.broadcast, blob, src)
            if member.rank != src:
                # weights_only: tensors, containers and plain values, never arbitrary objects
                self.apply(member, torch.load(io.BytesIO(blob.cpu().numpy().tobytes()),
                                              weights_only=True))
            mine = member.digest()
            check = torch.tensor([int(mine[:15], 16)], dtype=torch.int64, device=dev)
            got = [torch.zeros(1, dtype=torch.int64, device=dev) for _ in range(member.world)]
            member._collective(dist.all_gather, got, check)
            if len({int(g[0]) for g in got}) != 1:
                raise RuntimeError("training state digests differ after the hand-over")
        return Handed(src, sent, mine, kept_step=kept)
