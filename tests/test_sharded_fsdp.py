"""FSDP2 re-sharded in memory from N ranks to M, with real gloo processes on loopback.

Each case trains a small FSDP2 model (uneven rows, a shard that is empty at world 4, a
buffer, AdamW with a changed learning rate) for two steps at N, re-shards it to M with
:func:`reshard_fsdp`, and compares every local tensor BITWISE with a reference: the same full
state (``get_*_state_dict`` at N) sharded fresh at M by ``set_model_state_dict`` and
``set_optimizer_state_dict``; then one training step on both must give the same bits again.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import traceback
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from devtools.localcluster.daemon import free_port
from malletrain_core.worker.sharded import adopt, reshard_fsdp, run_collective
from malletrain_core.worker.sharded.state import inventory

pytestmark = pytest.mark.torch
torch = pytest.importorskip("torch")

RANK_TIMEOUT_S = 180  # a rank that hangs fails the test instead of holding it forever


def run_ranks(body: Callable[..., dict[str, Any]], world: int, tmp: Path,
              *args: Any) -> list[dict[str, Any]]:
    """Run ``body(rank, world, *args)`` in ``world`` spawned processes joined in one gloo
    group; return what each returned, or fail with the tracebacks of the ranks that failed."""
    port = free_port()
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_rank_main, args=(body, r, world, port, tmp, args))
             for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(RANK_TIMEOUT_S)
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
    errors = [(tmp / f"rank{r}.err").read_text() for r in range(world)
              if (tmp / f"rank{r}.err").exists()]
    codes = [p.exitcode for p in procs]
    assert not errors and codes == [0] * world, f"exit codes {codes}\n" + "\n".join(errors)
    return [json.loads((tmp / f"rank{r}.json").read_text()) for r in range(world)]


def _rank_main(body: Callable[..., dict[str, Any]], rank: int, world: int, port: int,
               tmp: Path, args: tuple[Any, ...]) -> None:
    import torch.distributed as dist

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world, timeout=timedelta(seconds=60))
        out = body(rank, world, *args)
        dist.barrier()
        (tmp / f"rank{rank}.json").write_text(json.dumps(out))
        dist.destroy_process_group()
    except BaseException:
        (tmp / f"rank{rank}.err").write_text(f"rank {rank}:\n{traceback.format_exc()}")
        os._exit(1)
    # skip the interpreter's finalization: an FSDP2 run at world 4 on gloo has been seen to
    # end in SIGABRT there, after its work was done
    os._exit(0)


class Counted:
    """A ``collective`` that counts the operations run through it (as the in-place group's
    abandonable wait would see them)."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, op: Callable[..., Any], *args: Any) -> None:
        self.count += 1
        run_collective(op, *args)


class Net(torch.nn.Module):
    """13 and 3 rows: uneven at every world, and one shard empty at world 4."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(6, 13)
        self.norm = torch.nn.LayerNorm(13)
        self.b = torch.nn.Linear(13, 3)
        self.register_buffer("scale", torch.tensor([0.5, 2.0, 1.0]))

    def forward(self, x: Any) -> Any:
        return self.b(torch.relu(self.norm(self.a(x)))) * self.scale


def shard(model: Any, mesh: Any) -> Any:
    from torch.distributed.fsdp import fully_shard

    fully_shard(model.a, mesh=mesh)
    fully_shard(model.b, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def build_meta(mesh: Any) -> Any:
    with torch.device("meta"):
        model = Net()
    return shard(model, mesh)


def make_optimizer(model: Any) -> Any:
    return torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.1)


def train_step(model: Any, optimizer: Any, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    loss = model(torch.randn(4, 6, generator=g)).pow(2).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()


def local_bits(model: Any, optimizer: Any) -> dict[str, Any]:
    _, local = inventory(model, optimizer)
    return {k: v.detach().reshape(-1).clone().view(torch.uint8) for k, v in local.items()}


def differing(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    if a.keys() != b.keys():
        return [f"keys {sorted(a.keys() ^ b.keys())}"]
    return [k for k in a if not torch.equal(a[k], b[k])]


def reshard_case(rank: int, world: int, old: list[int], new: list[int], full_path: str,
                 bucket_bytes: int | None, adopt_after: bool = False) -> dict[str, Any]:
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )
    from torch.distributed.device_mesh import DeviceMesh

    groups = {"old": dist.new_group(old), "new": dist.new_group(new)}
    model = optimizer = None
    full = StateDictOptions(full_state_dict=True)
    if rank in old:
        torch.manual_seed(0)
        model = shard(Net(), DeviceMesh.from_group(groups["old"], "cpu"))
        optimizer = make_optimizer(model)
        for step in range(2):
            train_step(model, optimizer, 10 * step + old.index(rank))
        for g in optimizer.param_groups:
            g["lr"] = 0.005  # as a scheduler would: a joiner must not start from 0.01
        msd = get_model_state_dict(model, options=full)
        osd = get_optimizer_state_dict(model, optimizer, options=full)
        if rank == old[0]:
            torch.save({"model": msd, "optim": osd}, full_path)
    dist.barrier()
    new_mesh = DeviceMesh.from_group(groups["new"], "cpu") if rank in new else None
    calls = Counted()
    done = reshard_fsdp(model, optimizer, build=build_meta, make_optimizer=make_optimizer,
                        group=None, old_ranks=old, new_ranks=new,
                        new_mesh=None if adopt_after else new_mesh,
                        bucket_bytes=bucket_bytes, collective=calls)
    del model, optimizer
    if adopt_after and new_mesh is not None:  # as after a shrink's re-form: the mesh comes later
        assert done.model is None and done.shards
        adopt(done, build=build_meta, make_optimizer=make_optimizer, mesh=new_mesh)
    # the manifest's two broadcasts and one all_to_all per bucket, all through `collective`
    assert calls.count == 2 + done.traffic.buckets, (calls.count, done.traffic)
    out: dict[str, Any] = {"rank": rank, "sent": done.traffic.sent_bytes,
                           "received": done.traffic.received_bytes,
                           "kept": done.traffic.kept_bytes, "buckets": done.traffic.buckets,
                           "peak_buffer": done.traffic.peak_buffer_bytes,
                           "old_bytes": done.old_bytes, "new_bytes": done.new_bytes,
                           "ratio": done.peak_extra_ratio}
    if new_mesh is None:
        assert done.model is None
        return out
    saved = torch.load(full_path, weights_only=True)
    ref = build_meta(new_mesh)
    ref.to_empty(device="cpu")
    ref_opt = make_optimizer(ref)
    set_model_state_dict(ref, saved["model"], options=full)
    set_optimizer_state_dict(ref, ref_opt, saved["optim"], options=full)
    out["after_reshard"] = differing(local_bits(done.model, done.optimizer),
                                     local_bits(ref, ref_opt))
    out["lr"] = [g["lr"] for g in done.optimizer.param_groups]
    for model, optimizer in ((done.model, done.optimizer), (ref, ref_opt)):
        train_step(model, optimizer, 100 + new.index(rank))
    out["after_step"] = differing(local_bits(done.model, done.optimizer),
                                  local_bits(ref, ref_opt))
    return out


@pytest.mark.parametrize(("old", "new", "bucket_bytes", "adopt_after"), [
    ([0, 1], [0, 1, 2], 256, False),       # grow 2 -> 3: rank 2 joins
    ([0, 1, 2], [0, 2], 256, False),       # planned shrink 3 -> 2: the middle rank leaves
    ([0, 1, 2, 3], [3], 256, False),       # shrink 4 -> 1 onto the last rank
    ([0], [0, 1], 256, False),             # grow 1 -> 2
    ([0, 1, 2, 3], [1, 2], None, False),   # 4 -> 2, the outer ranks leave, one bucket
    ([0, 1, 2], [1, 2], 256, True),        # 3 -> 2 received before the new mesh exists
], ids=["2to3", "3to2", "4to1", "1to2", "4to2-one-bucket", "3to2-adopt-after"])
def test_reshard_equals_the_full_state_sharded_fresh(old: list[int], new: list[int],
                                                     bucket_bytes: int | None,
                                                     adopt_after: bool,
                                                     tmp_path: Path) -> None:
    world = len(set(old) | set(new))
    ranks = run_ranks(reshard_case, world, tmp_path, old, new, str(tmp_path / "full.pt"),
                      bucket_bytes, adopt_after)
    for r in ranks:
        if r["rank"] in new:
            assert r["after_reshard"] == [], f"rank {r['rank']} differs from the reference"
            assert r["after_step"] == [], f"rank {r['rank']} differs after a step"
            assert r["lr"] == [0.005]
        assert r["ratio"] <= 2.0, r
        if r["rank"] not in old:
            assert r["sent"] == 0 and r["kept"] == 0
        if r["rank"] not in new:
            assert r["received"] == 0 and r["kept"] == 0
    assert sum(r["sent"] for r in ranks) == sum(r["received"] for r in ranks) > 0
    print("\n".join(json.dumps({k: v for k, v in r.items() if k not in ("after_reshard",
                                                                          "after_step")})
                    for r in ranks))


def misordered_case(rank: int, world: int) -> dict[str, Any]:
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh

    # the mesh's shard order is its group's rank order, not the order the ranks were named in
    mesh = DeviceMesh.from_group(dist.new_group([1, 0]), "cpu")
    torch.manual_seed(0)
    model = shard(Net(), mesh)
    try:
        reshard_fsdp(model, make_optimizer(model), build=build_meta,
                     make_optimizer=make_optimizer, group=None, old_ranks=[0, 1],
                     new_ranks=[1, 0], new_mesh=mesh)
    except ValueError as exc:
        return {"error": str(exc)}
    return {"error": None}


def test_a_layout_that_disagrees_with_the_mesh_is_refused(tmp_path: Path) -> None:
    for r in run_ranks(misordered_case, 2, tmp_path):
        assert "in the order of the mesh's group" in (r["error"] or ""), r
