"""Moving slices of local tensors between the ranks of a group, in bounded buckets.

Every rank computes the same list of :class:`Move` (from the same manifest and plan), so the
buckets, and the collectives, are the same on all. A bucket is one ``all_to_all_single`` of
bytes: each rank packs what it sends into one buffer ordered by destination and receives
into one ordered by source, then unpacks into its targets; moves from a rank to itself are
local copies and never enter a buffer. The buffers of one bucket are the only memory the
exchange adds to the tensors it reads and writes; :class:`Traffic` counts them.

Each collective goes through ``collective(op, *args)``, which runs ``op(*args, async_op=True)``
and waits for it: the in-place group passes its own, abandonable, wait (gloo's point-to-point
works have no future to poll, so the exchange uses collectives only).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Collective = Callable[..., None]
"""``collective(op, *args)``: run ``op(*args, async_op=True)`` and wait for its work."""


def run_collective(op: Callable[..., Any], *args: Any) -> None:
    """Run ``op(*args, async_op=True)`` and wait for it (no abandoning)."""
    op(*args, async_op=True).wait()


@dataclass(frozen=True)
class Move:
    """Elements ``[src_at, src_at + numel)`` of ``key``'s local tensor on rank ``src`` (flat,
    row-major) become elements ``[dst_at, dst_at + numel)`` of its local tensor on ``dst``."""

    key: str
    src: int
    dst: int
    src_at: int
    dst_at: int
    numel: int
    itemsize: int
    src_key: str = ""
    """The key of the tensor read on ``src`` when not ``key`` (a copy held under another
    name: :mod:`.buddy`)."""

    @property
    def nbytes(self) -> int:
        return self.numel * self.itemsize

    @property
    def source(self) -> str:
        return self.src_key or self.key


@dataclass
class Traffic:
    """What one rank's exchange did: bytes sent, received and copied locally, the number of
    buckets (collectives), and the largest send plus receive buffers alive at once."""

    sent_bytes: int = 0
    received_bytes: int = 0
    kept_bytes: int = 0
    buckets: int = 0
    peak_buffer_bytes: int = 0


def _flat_bytes(t: Any, at: int, numel: int) -> Any:
    """Elements ``[at, at + numel)`` of ``t`` as a byte view (writes reach ``t``)."""
    import torch

    if not t.is_contiguous():
        raise ValueError(f"a local shard must be contiguous to be exchanged: {tuple(t.shape)}")
    if at + numel > t.numel():
        raise ValueError(f"elements {at}..{at + numel} are past a local tensor of {t.numel()}")
    return t.reshape(-1)[at:at + numel].view(torch.uint8)


def buckets(moves: Sequence[Move], order: Sequence[str], bucket_bytes: int) -> list[list[str]]:
    """Consecutive keys of ``order`` whose moved bytes (over all ranks, local copies left out)
    add up to at most ``bucket_bytes``; a key that moves more is a bucket of its own. Keys
    that move nothing between ranks go with their neighbours."""
    moved: dict[str, int] = {}
    for m in moves:
        if m.src != m.dst:
            moved[m.key] = moved.get(m.key, 0) + m.nbytes
    out: list[list[str]] = [[]]
    size = 0
    for key in order:
        n = moved.get(key, 0)
        if out[-1] and size + n > bucket_bytes:
            out.append([])
            size = 0
        out[-1].append(key)
        size += n
    return [b for b in out if b]


def exchange(moves: Sequence[Move], order: Sequence[str], rank: int, world: int,
             sources: Mapping[str, Any], targets: Mapping[str, Any], *, bucket_bytes: int,
             group: Any = None, device: Any = "cpu",
             collective: Collective = run_collective) -> Traffic:
    """Carry out ``moves`` on rank ``rank`` of ``group`` (``world`` ranks), reading
    ``sources[key]`` (this rank's old local tensors; ``sources[src_key]`` where a move names
    one) and writing ``targets[key]`` (its new ones); the buffers live on ``device`` (the GPU for NCCL). Every rank of the group calls
    it with the same ``moves`` and ``order``."""
    import torch
    import torch.distributed as dist

    traffic = Traffic()
    for m in moves:
        if m.src == m.dst == rank:
            _flat_bytes(targets[m.key], m.dst_at, m.numel).copy_(
                _flat_bytes(sources[m.source], m.src_at, m.numel))
            traffic.kept_bytes += m.nbytes
    a2a = functools.partial(dist.all_to_all_single, group=group)
    for keys in buckets(moves, order, bucket_bytes):
        chosen = set(keys)
        inside = [m for m in moves if m.key in chosen and m.src != m.dst]
        if not inside:
            continue
        sends = sorted((m for m in inside if m.src == rank), key=lambda m: m.dst)
        recvs = sorted((m for m in inside if m.dst == rank), key=lambda m: m.src)
        send_split = [0] * world
        recv_split = [0] * world
        for m in sends:
            send_split[m.dst] += m.nbytes
        for m in recvs:
            recv_split[m.src] += m.nbytes
        # .to: AdamW keeps ``step`` on the CPU beside parameters on the GPU
        send_buf = (torch.cat([_flat_bytes(sources[m.source], m.src_at, m.numel).to(device)
                               for m in sends])
                    if sends else torch.empty(0, dtype=torch.uint8, device=device))
        recv_buf = torch.empty(sum(recv_split), dtype=torch.uint8, device=device)
        traffic.peak_buffer_bytes = max(traffic.peak_buffer_bytes,
                                        send_buf.numel() + recv_buf.numel())
        collective(a2a, recv_buf, send_buf, recv_split, send_split)
        at = 0
        for m in recvs:
            _flat_bytes(targets[m.key], m.dst_at, m.numel).copy_(recv_buf[at:at + m.nbytes])
            at += m.nbytes
        traffic.sent_bytes += send_buf.numel()
        traffic.received_bytes += recv_buf.numel()
        traffic.buckets += 1
        del send_buf, recv_buf
    return traffic


def broadcast_bytes(data: bytes | None, src: int, *, group: Any = None, device: Any = "cpu",
                    collective: Collective = run_collective) -> bytes:
    """``data`` from group rank ``src`` on every rank of ``group`` (two broadcasts, of
    tensors on ``device``: the length, then the bytes)."""
    import torch
    import torch.distributed as dist

    op = functools.partial(dist.broadcast, group=group, group_src=src)
    size = torch.tensor([len(data) if data is not None else 0], dtype=torch.int64,
                        device=device)
    collective(op, size)
    buf = (torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device) if data
           else torch.empty(int(size[0]), dtype=torch.uint8, device=device))
    collective(op, buf)
    return buf.cpu().numpy().tobytes()
