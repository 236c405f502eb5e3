"""A model rebuilt on a new group's mesh is on that mesh, not an equal one of an earlier group.

torch 2.13's ``DeviceMesh`` equals any other of the same shape, ranks and dimension names, and
DTensor's sharding caches are keyed by such meshes: ``to_empty`` on a model sharded on a new
mesh hands back the specs, and with them the mesh, of the earlier one's ops. Under Slurm that
rebuilt the model on an earlier epoch's mesh (its group names no longer resolved, its
coordinate was the rank's old one). One gloo process here: two equal meshes are enough.
Beside it, the other single-process check of ``sharded.state``: a forward failed midway.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.test_sharded_fsdp import run_ranks

pytestmark = pytest.mark.torch
torch = pytest.importorskip("torch")


def _equal_meshes(rank: int, world: int) -> dict[str, Any]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from malletrain_core.worker.sharded.state import check_on_mesh, forget_old_meshes

    def built(mesh: Any) -> Any:
        with torch.device("meta"):
            model = fully_shard(torch.nn.Linear(8, 8), mesh=mesh)
        model.to_empty(device="cpu")
        return model

    first = init_device_mesh("cpu", (world,))
    built(first)
    second = init_device_mesh("cpu", (world,))
    stale = built(second)                      # through the caches the first model filled
    refused = ""
    try:
        check_on_mesh(stale, second)
    except RuntimeError as exc:
        refused = str(exc)
    forget_old_meshes()
    fresh = built(second)
    check_on_mesh(fresh, second)
    return {"equal": first == second and first is not second,
            "stale_on_first": all(p.device_mesh is first for p in stale.parameters()),
            "refused": refused,
            "fresh_on_second": all(p.device_mesh is second for p in fresh.parameters())}


def test_the_caches_are_emptied_before_a_build_and_a_stale_mesh_is_refused(tmp_path: Path):
    [got] = run_ranks(_equal_meshes, 1, tmp_path)
    assert got["equal"]
    # torch 2.13 keeps the first mesh: the reason for forget_old_meshes (a torch that does
    # not would make this line fail, and the workaround could go)
    assert got["stale_on_first"], got
    assert "mesh of an earlier group" in got["refused"], got
    assert got["fresh_on_second"], got


class _Boom(Exception):
    pass


def _failed_forward(rank: int, world: int) -> dict[str, Any]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    from malletrain_core.worker.sharded.state import inventory, reshard_in_place

    mesh = init_device_mesh("cpu", (world,))
    model = torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.LayerNorm(6),
                                torch.nn.Linear(6, 2))
    fully_shard(model[0], mesh=mesh)
    fully_shard(model, mesh=mesh)       # the root holds the LayerNorm's parameters
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(4, 6)).sum().backward()
    optimizer.step()
    held = [(e.key, e.kind) for e in inventory(model, optimizer)[0].entries]

    def boom(*_: Any) -> None:          # a collective failing mid-forward (a lost peer)
        raise _Boom

    handle = model[2].register_forward_pre_hook(boom)
    try:
        model(torch.randn(4, 6))
    except _Boom:
        pass
    handle.remove()
    gathered = [n for n, p in model.named_parameters() if not isinstance(p, DTensor)]
    reshard_in_place(model)
    after = [(e.key, e.kind) for e in inventory(model, optimizer)[0].entries]
    model(torch.randn(4, 6)).sum().backward()   # and the next step runs
    optimizer.step()
    return {"gathered": gathered, "held": held, "after": after}


def test_a_forward_failed_midway_leaves_the_shards_readable(tmp_path: Path):
    """A step that failed mid-forward left the root's parameters gathered (FSDP2's reshard()
    keeps a root's in its forward): the heal then refused the state ("built ... 'shard',
    held ... 'whole'") and the node read its checkpoint. reshard_in_place resets FSDP2's
    iteration first."""
    [got] = run_ranks(_failed_forward, 1, tmp_path)
    assert got["gathered"], "the failed forward left nothing gathered: the test shows nothing"
    assert got["after"] == got["held"], got
