"""HSDP replicas healed in memory, with real gloo processes on loopback.

The surviving replicas train on their own mesh first; then every rank rebuilds the model on
the grown mesh ``(replicate, shard)`` and :func:`heal_hsdp` sends each joining rank its shards
from the matching rank of a survivor. A joiner's local state must equal its source's bitwise,
a survivor's must be what it held, and after one more step on the grown mesh (data differing
per replica) the replicas must still hold the same bits.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from malletrain_core.worker.sharded import heal_hsdp
from tests.test_sharded_fsdp import (
    Counted,
    Net,
    build_meta,
    local_bits,
    make_optimizer,
    run_ranks,
    shard,
    train_step,
)

pytestmark = pytest.mark.torch
torch = pytest.importorskip("torch")

NAMES = ("replicate", "shard")


def digests(model: Any, optimizer: Any) -> dict[str, str]:
    return {k: hashlib.sha256(v.numpy().tobytes()).hexdigest()
            for k, v in local_bits(model, optimizer).items()}


def heal_case(rank: int, world: int, width: int, survivors: list[int],
              joiners: list[int]) -> dict[str, Any]:
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

    layout = torch.arange(world).view(-1, width)
    old_mesh = DeviceMesh("cpu", layout[survivors], mesh_dim_names=NAMES)
    replica = rank // width
    model = optimizer = None
    before = None
    if replica in survivors:
        torch.manual_seed(0)
        model = shard(Net(), old_mesh)  # a 2-D mesh makes it HSDP
        optimizer = make_optimizer(model)
        for step in range(2):
            train_step(model, optimizer, 10 * step + survivors.index(replica))
        before = digests(model, optimizer)
    mesh = init_device_mesh("cpu", (world // width, width), mesh_dim_names=NAMES)
    calls = Counted()
    healed = heal_hsdp(model, optimizer, build=build_meta, make_optimizer=make_optimizer,
                       mesh=mesh, survivors=survivors, joiners=joiners, bucket_bytes=512,
                       collective=calls)
    del model, optimizer
    assert calls.count == 2 + healed.traffic.buckets, (calls.count, healed.traffic)
    after = digests(healed.model, healed.optimizer)
    train_step(healed.model, healed.optimizer, 100 + replica)
    return {"rank": rank, "replica": replica, "shard": rank % width, "source": healed.source,
            "before": before, "after": after,
            "stepped": digests(healed.model, healed.optimizer),
            "sent": healed.traffic.sent_bytes, "received": healed.traffic.received_bytes,
            "ratio": healed.peak_extra_ratio, "new_bytes": healed.new_bytes}


@pytest.mark.parametrize(("width", "survivors", "joiners"), [
    (2, [0], [1]),             # two processes per node: a node joins one that survived
    (1, [0, 2], [1, 3]),       # two joiners, served by two survivors at once
], ids=["one-joiner-2x2", "two-joiners-4x1"])
def test_a_joining_replica_holds_its_sources_state_bitwise(
        width: int, survivors: list[int], joiners: list[int], tmp_path: Path) -> None:
    ranks = {r["rank"]: r for r in run_ranks(heal_case, 4, tmp_path, width, survivors,
                                              joiners)}
    for r in ranks.values():
        if r["replica"] in survivors:
            assert r["source"] == r["rank"] and r["after"] == r["before"]
            assert r["received"] == 0
        else:
            src = ranks[r["source"]]
            assert src["replica"] in survivors and src["shard"] == r["shard"]
            assert r["after"] == src["after"], f"rank {r['rank']} differs from its source"
            assert r["received"] == r["new_bytes"] > 0 and r["sent"] == 0
            assert r["ratio"] <= 2.0
    for index in range(width):
        stepped = {r["rank"]: r["stepped"] for r in ranks.values() if r["shard"] == index}
        assert len({str(sorted(d.items())) for d in stepped.values()}) == 1, stepped.keys()
    healers = [ranks[r["source"]]["replica"] for r in ranks.values() if r["replica"] in joiners]
    assert sorted(set(healers)) == sorted(survivors)  # several survivors serve at once


def _barrier(rank: int, world: int, folder: str) -> dict[str, Any]:
    import time
    from types import SimpleNamespace

    import torch.distributed as dist

    from malletrain_core.worker.inplace.pending import StepAbandoned, _Pending
    from malletrain_core.worker.sharded.heal import step_barrier

    class Node:   # the node's shard group: here the whole group of two
        @staticmethod
        def get_group(_name: str) -> Any:
            return dist.group.WORLD

    pending = _Pending()
    member = SimpleNamespace(local_world=2, world=4, _device=torch.device("cpu"),
                             _pending=pending)
    out: dict[str, Any] = {}
    # the lost peer's epoch abandoned on rank 0 before its barrier, on rank 1 not yet: rank 1
    # enters the barrier late, and both take the step
    if rank == 0:
        pending.abandon("epoch 3 replaces epoch 2")
    else:
        time.sleep(0.3)
    step_barrier(member, Node(), grace_s=30.0)
    out["stepped"] = True
    dist.barrier()
    # rank 1's reduction failed (it never enters): rank 0 drops the step after the grace
    pending.reset()
    if rank == 0:
        pending.abandon("epoch 3 replaces epoch 2")
        t0 = time.monotonic()
        try:
            step_barrier(member, Node(), grace_s=0.5)
            out["dropped"] = False
        except StepAbandoned:
            out["dropped"] = True
        out["waited_s"] = time.monotonic() - t0
        (Path(folder) / "dropped").touch()
        pending.release()[-1].wait()
    else:   # then pairs the abandoned all-reduce, so that the group ends clean
        while not (Path(folder) / "dropped").exists():
            time.sleep(0.05)
        dist.all_reduce(torch.ones(1, dtype=torch.int64))
    return out


def test_an_abandoned_step_barrier_takes_the_step_when_every_sibling_entered_it(tmp_path: Path):
    """The step barrier's outcome is its all-reduce's: a rank whose epoch was abandoned while
    its sibling had not yet entered the barrier still takes the step the sibling takes, and
    drops it, after the grace, when the sibling never enters."""
    first, second = run_ranks(_barrier, 2, tmp_path, str(tmp_path))
    assert first["stepped"] and second["stepped"]
    assert first["dropped"] and 0.5 <= first["waited_s"] < 5, first
