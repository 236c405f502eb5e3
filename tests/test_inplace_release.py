"""Releasing a process held in an abandoned group's operation (:mod:`...inplace.release`).

The real case, with two gloo processes on loopback: an FSDP2 model on a node's shard group,
one process that does its forward and never its backward (it failed its part of the step
and left), and its sibling in the backward's collectives with it. Without the release the
sibling waits for the group's timeout (60 s here); with it, its backward fails as soon as
the abandoned epoch's connections are shut down. Then the conditions of the release, with a
stand-in for the pending operations (quick).
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from malletrain_core.worker.inplace import StepAbandoned, _Pending, release
from malletrain_core.worker.inplace.release import GroupSockets

AFTER_S = 0.5


def stuck_sibling_case(rank: int, world: int, tmp: str, sockets: GroupSockets,
                       store_port: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from tests.test_sharded_fsdp import Net, shard

    mesh = init_device_mesh("cpu", (1, world), mesh_dim_names=("replicate", "shard"))
    torch.manual_seed(0)
    model = shard(Net(), mesh)
    dist.barrier(group=mesh.get_group("shard"))   # the subgroup's connections are made
    sockets.opened(1, {store_port})   # the store's connections are not the group's
    loss = model(torch.randn(4, 6)).pow(2).mean()
    done = Path(tmp) / "released"
    if rank == 0:   # the sibling that left: alive, holding its group, never in the backward
        deadline = time.monotonic() + 90
        while not done.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        return {"rank": rank, "recorded": len(sockets.by_epoch[1])}
    pending = _Pending()
    pending.reset(1)
    shut: list[int] = []

    def control() -> None:   # the control thread: the epoch is abandoned, then checked
        time.sleep(0.3)
        pending.abandon("a peer was lost")
        while not shut or not shut[-1]:
            shut.append(sockets.check(pending, {store_port}))
            time.sleep(0.02)

    threading.Thread(target=control, daemon=True).start()
    t0 = time.monotonic()
    error = ""
    try:
        loss.backward()
    except Exception as exc:   # the collective fails as a lost peer's would
        error = str(exc).splitlines()[0]
    held = time.monotonic() - t0
    done.write_text("1")
    return {"rank": rank, "held_s": held, "error": error, "shut": max(shut, default=0),
            "recorded": len(sockets.by_epoch[1])}


def _rank(rank: int, port: int, tmp: str) -> None:
    """One process of the case; no barrier at its end (the group is shut down by then)."""
    import os
    import traceback
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    try:
        sockets = GroupSockets(after_s=AFTER_S)   # the group and its mesh's, as in _apply
        sockets.opening()
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=2, timeout=timedelta(seconds=60))
        out = stuck_sibling_case(rank, 2, tmp, sockets, port)
        (Path(tmp) / f"rank{rank}.json").write_text(json.dumps(out))
    except BaseException:
        (Path(tmp) / f"rank{rank}.err").write_text(traceback.format_exc())
    os._exit(0)


@pytest.mark.torch
def test_a_sibling_held_in_an_fsdp2_collective_is_released(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    import multiprocessing

    from devtools.localcluster.daemon import free_port

    port = free_port()
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_rank, args=(r, port, str(tmp_path))) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(150)
        if p.is_alive():
            p.kill()
    errors = [f.read_text() for f in tmp_path.glob("rank*.err")]
    assert not errors, "\n".join(errors)
    ranks = {r: json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)}
    held = ranks[1]
    assert ranks[0]["recorded"] >= 1 and held["recorded"] >= 1, ranks
    assert held["shut"] >= 1 and "closed" in held["error"].lower(), held
    # abandoned at 0.3 s, released AFTER_S later; the group's own timeout is 60 s
    assert held["held_s"] < 10, held


class Pending:
    """What GroupSockets.check reads of the pending operations."""

    def __init__(self, reason: str | None = "lost", at: float | None = 100.0, epoch: int = 3,
                 graced: int = 0, quiet_until: float = 0.0) -> None:
        self.lock = threading.Lock()
        self.reason, self.abandoned_at, self.epoch, self.graced = reason, at, epoch, graced
        self.quiet_until = quiet_until


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[set[int]]:
    seen: list[set[int]] = []

    def fake(inodes: Any, keep: set[int]) -> int:
        seen.append(set(inodes))
        return len(seen[-1])

    monkeypatch.setattr(release, "shut_down", fake)
    return seen


def test_only_an_abandonment_held_past_the_bound_is_released_and_only_once(
        calls: list[set[int]]) -> None:
    s = GroupSockets(after_s=5.0)
    s.by_epoch = {1: {11}, 2: {21, 22}, 3: {31}, 4: {41}}
    assert s.check(Pending(reason=None), set(), now=200.0) == 0        # not abandoned
    assert s.check(Pending(), set(), now=104.9) == 0                   # not for 5 s yet
    assert s.check(Pending(graced=1), set(), now=200.0) == 0           # in the barrier
    assert s.check(Pending(quiet_until=200.1), set(), now=200.0) == 0  # and its grace after
    assert calls == []
    assert s.check(Pending(), set(), now=105.0) == 4                   # epochs 1-3, not 4
    assert calls == [{11, 21, 22, 31}]
    assert s.check(Pending(), set(), now=300.0) == 0                   # once per abandonment
    assert s.check(Pending(at=400.0), set(), now=405.0) == 4           # a new abandonment
    assert len(calls) == 2


def test_the_real_pending_dates_its_abandonment_and_counts_shared_operations() -> None:
    p = _Pending()
    p.reset(2)
    assert p.abandoned_at is None
    assert not p.abandon("lost", 1)              # another epoch's loss: not this group's
    assert p.abandoned_at is None
    assert p.abandon("lost", 2)
    first = p.abandoned_at
    assert first is not None
    p.abandon("again")
    assert p.abandoned_at == first               # dated by the first abandonment
    p.reset(3)
    assert p.abandoned_at is None and p.reason is None

    t0 = time.monotonic()
    with p.shared(3.0):
        assert p.graced == 1
    assert p.graced == 0 and p.quiet_until >= t0 + 3.0
    try:
        with p.shared(1.0):
            raise StepAbandoned("lost")
    except StepAbandoned:
        pass
    assert p.graced == 0


def test_only_established_connections_off_the_store_ports_are_shut_down() -> None:
    import socket

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        a = socket.create_connection(("127.0.0.1", port))
        b, _ = server.accept()
        try:
            inode = {fd: i for i, fd in release.socket_fds().items()}[a.fileno()]
            listening = {fd: i for i, fd in release.socket_fds().items()}[server.fileno()]
            assert release.shut_down([inode, listening], {port}) == 0   # a store's port
            assert release.shut_down([inode, listening], set()) == 1    # not the listener
            assert b.recv(1) == b""          # the peer sees the connection end
            a.fileno()                       # the descriptor is still the owner's
        finally:
            a.close()
            b.close()
