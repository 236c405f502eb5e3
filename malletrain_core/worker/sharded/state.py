"""A sharded model's training state as named local tensors, and its manifest.

A rank of an FSDP2 or HSDP model holds, for every parameter, the local shard of the parameter
(a ``DTensor`` sharded on dim 0) and of each optimizer state of the same shape (AdamW's
``exp_avg``, ``exp_avg_sq``), plus whole tensors every rank holds alike: the optimizer's
``step`` and the model's buffers. :func:`inventory` names them all; the :class:`Manifest`
(their global shapes and dtypes, the optimizer's hyper-parameters) is what a rank that holds
nothing yet needs to allocate its part, and travels as JSON, never as a pickle.
:func:`allocate` builds that part on a model freshly sharded on the new mesh.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from itertools import zip_longest
from typing import Any

SHARD = "shard"
"""An entry sharded on dim 0 over the mesh's last dimension (its shape is the global one)."""
WHOLE = "whole"
"""An entry every rank holds whole and alike (its shape is the tensor's)."""


@dataclass(frozen=True)
class Entry:
    """One named tensor of the state: ``p/<fqn>`` a parameter, ``o/<fqn>/<name>`` one of its
    optimizer states, ``b/<fqn>`` a buffer."""

    key: str
    kind: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def rows(self) -> int:
        return self.shape[0] if self.shape else 1

    @property
    def row_numel(self) -> int:
        n = 1
        for s in self.shape[1:]:
            n *= s
        return n

    @property
    def itemsize(self) -> int:
        import torch

        return torch.empty(0, dtype=_dtype(self.dtype)).element_size()


@dataclass
class Manifest:
    """The entries of a state, in the order every rank exchanges them, and the optimizer's
    hyper-parameters per parameter group (``params`` left out)."""

    entries: list[Entry]
    groups: list[dict[str, Any]] = field(default_factory=list)

    def to_bytes(self) -> bytes:
        rows = [[e.key, e.kind, e.dtype, list(e.shape)] for e in self.entries]
        try:
            return json.dumps({"entries": rows, "groups": self.groups}).encode()
        except TypeError as exc:
            raise ValueError("an optimizer hyper-parameter is not a number, string or list "
                             f"({exc}); a tensor learning rate cannot be re-sharded") from exc

    @classmethod
    def from_bytes(cls, data: bytes) -> Manifest:
        doc = json.loads(data)
        return cls([Entry(k, kind, dt, tuple(shape)) for k, kind, dt, shape in doc["entries"]],
                   doc["groups"])


def _dtype(name: str) -> Any:
    import torch

    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"not a torch dtype: {name}")
    return dtype


def _local(t: Any) -> tuple[str, Any, tuple[int, ...]]:
    """(kind, local tensor, global shape) of a parameter or state tensor."""
    from torch.distributed.tensor import DTensor, Shard

    if isinstance(t, DTensor):
        last = t.placements[-1]
        if not isinstance(last, Shard) or last.dim != 0 or any(
                isinstance(p, Shard) for p in t.placements[:-1]):
            raise ValueError(f"only dim-0 sharding on the mesh's last dimension is supported, "
                             f"not {t.placements}")
        return SHARD, t.to_local(), tuple(t.shape)
    return WHOLE, t, tuple(t.shape)


def _named_state(model: Any, optimizer: Any) -> list[tuple[str, Any]]:
    """(key, tensor) for every parameter, optimizer state and buffer, in a fixed order."""
    import torch

    out: list[tuple[str, Any]] = []
    params = list(model.named_parameters())
    for fqn, p in params:
        out.append((f"p/{fqn}", p))
    for fqn, p in params:
        state = optimizer.state.get(p, {}) if optimizer is not None else {}
        for name in sorted(state):
            value = state[name]
            if not isinstance(value, torch.Tensor):
                raise ValueError(f"optimizer state {fqn}/{name} is not a tensor ({value!r})")
            out.append((f"o/{fqn}/{name}", value))
    out += [(f"b/{fqn}", b) for fqn, b in model.named_buffers()]
    return out


def _hyper(optimizer: Any) -> list[dict[str, Any]]:
    return [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]


def inventory(model: Any, optimizer: Any) -> tuple[Manifest, dict[str, Any]]:
    """The manifest of this rank's state and its local tensors by key (views, not copies)."""
    import torch

    entries, local = [], {}
    with torch.no_grad():
        for key, t in _named_state(model, optimizer):
            kind, loc, shape = _local(t)
            entries.append(Entry(key, kind, str(t.dtype).removeprefix("torch."), shape))
            local[key] = loc
    return Manifest(entries, _hyper(optimizer) if optimizer is not None else []), local


def local_bytes(tensors: Mapping[str, Any]) -> int:
    """The bytes of the data in ``tensors`` (FSDP's padding not counted)."""
    return sum(t.numel() * t.element_size() for t in tensors.values())


def allocate(model: Any, optimizer: Any, manifest: Manifest) -> dict[str, Any]:
    """Give ``optimizer`` (over ``model``'s parameters, freshly sharded and ``to_empty``'d) the
    manifest's state entries and hyper-parameters, and return the local tensors to fill by key.
    """
    import torch

    params = dict(model.named_parameters())
    if len(optimizer.param_groups) != len(manifest.groups):
        raise ValueError(f"the new optimizer has {len(optimizer.param_groups)} parameter "
                         f"groups, the state held {len(manifest.groups)}")
    group_of = {}
    for g, hyper in zip(optimizer.param_groups, manifest.groups, strict=True):
        for k, v in hyper.items():
            g[k] = tuple(v) if isinstance(g.get(k), tuple) else v
        group_of.update({id(p): g for p in g["params"]})
    with torch.no_grad():
        for e in manifest.entries:
            if not e.key.startswith("o/"):
                continue
            fqn, name = e.key[2:].rsplit("/", 1)
            p = params[fqn]
            dtype = _dtype(e.dtype)
            g = group_of[id(p)]
            # as torch's Adam keeps it: ``step`` on the CPU unless capturable or fused
            on = p.device if g.get("capturable") or g.get("fused") else "cpu"
            value = (torch.zeros_like(p, dtype=dtype) if e.kind == SHARD
                     else torch.zeros(e.shape, dtype=dtype, device=on))
            optimizer.state[p][name] = value
    mine, local = inventory(model, optimizer)
    built = [(e.key, e.kind, e.dtype, e.shape) for e in mine.entries]
    held = [(e.key, e.kind, e.dtype, e.shape) for e in manifest.entries]
    if built != held:
        first, (b, h) = next((i, pair) for i, pair in enumerate(zip_longest(built, held))
                             if pair[0] != pair[1])
        raise ValueError("the model built for the new layout does not match the state held "
                         f"(entry {first}: built {b}, held {h}; "
                         f"{len(built)} entries built, {len(held)} held)")
    return local


def forget_old_meshes() -> None:
    """Empty DTensor's sharding caches (torch 2.13: the C++ fast path's and the Python
    propagator's, this thread's), before a model is built on a new group's mesh.

    A ``DeviceMesh`` equals another of the same shape, ranks and dimension names, whatever
    group it was made on; the caches, keyed by such meshes, hand back the output specs, and
    with them the mesh, of an earlier group's op. A model rebuilt after a change whose layout
    an earlier epoch had (3 nodes, 2, then 3 again) came back on that OLD mesh: its group
    names no longer resolved (HSDP: "Could not resolve the process group registered under the
    name 4") and its coordinate was this rank's old one (FSDP's next re-shard refused it).
    Emptied, the first ops on the new mesh are propagated again (milliseconds)."""
    import torch
    from torch.distributed.tensor import DTensor

    native = getattr(torch._C, "_clear_DTensor_sharding_propagator_cache", None)
    if native is not None:
        native()
    propagator = DTensor._op_dispatcher.sharding_propagator
    for cache in (propagator.propagate_op_sharding, propagator._propagate_tensor_meta_cached):
        clear = getattr(cache, "cache_clear", None)
        if clear is not None:
            clear()


def check_on_mesh(model: Any, mesh: Any) -> None:
    """Every sharded parameter of ``model`` is on ``mesh`` (or a mesh cut from it), not on an
    equal one of an earlier group (see :func:`forget_old_meshes`)."""
    import torch
    from torch.distributed.tensor import DTensor

    root = mesh._get_root_mesh()
    for name, p in model.named_parameters():
        if isinstance(p, DTensor) and p.device_mesh._get_root_mesh() is not root:
            raise RuntimeError(f"{name} was built on the mesh of an earlier group, not this "
                               f"group's: DTensor's sharding cache kept it (torch "
                               f"{torch.__version__}); the node's processes start again")


def build_seeded(build: Callable[[Any], Any], mesh: Any, seed: int) -> Any:
    """The model built for real on ``mesh`` (its parameters initialised), seeded with
    ``seed``; the global RNG is left as it was."""
    import torch

    forget_old_meshes()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = build(mesh)
    check_on_mesh(model, mesh)
    return model


def rebuild(build: Callable[[Any], Any], make_optimizer: Callable[[Any], Any], mesh: Any,
            manifest: Manifest, device: Any) -> tuple[Any, Any, dict[str, Any]]:
    """The model sharded on ``mesh`` by the script's ``build`` (on the meta device), given
    memory with ``to_empty``, its optimizer with the manifest's state allocated, and the
    local tensors to fill."""
    forget_old_meshes()
    model = build(mesh)
    model.to_empty(device=device)
    check_on_mesh(model, mesh)
    optimizer = make_optimizer(model)
    return model, optimizer, allocate(model, optimizer, manifest)


def empty_shards(manifest: Manifest, count: int, index: int, device: Any) -> dict[str, Any]:
    """Plain tensors for shard ``index`` of ``count`` of every entry, to receive into before
    the mesh they will be sharded on exists."""
    import torch

    from .plan import shard_rows

    out = {}
    for e in manifest.entries:
        shape = e.shape
        if e.kind == SHARD:
            start, stop = shard_rows(e.rows, count, index)
            shape = (stop - start, *e.shape[1:])
        out[e.key] = torch.empty(shape, dtype=_dtype(e.dtype), device=device)
    return out


def local_digest(model: Any, optimizer: Any, step: int) -> str:
    """The sha256 of this rank's local shards, optimizer state and buffers, and the step."""
    h = hashlib.sha256(f"step:{step}".encode())
    _, local = inventory(model, optimizer)
    for key in sorted(local):
        t = local[key].detach().cpu().contiguous()
        h.update(f"{key}:{t.dtype}{tuple(t.shape)}".encode())
        if t.numel():
            import torch

            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def reshard_in_place(model: Any) -> None:
    """Put every FSDP module of ``model`` back in its sharded state, so that its local shards
    can be read. A step that failed mid-forward or mid-backward (a peer lost, or a sibling
    that left the step first) leaves FSDP2's iteration half done: the root's parameters stay
    gathered after a failed forward, since ``reshard()`` keeps a root's parameters in its
    forward (seen: a heal refused "built ('p/norm.weight', 'shard', ...), held ('p/norm.weight',
    'whole', ...)", and the node read its checkpoint). torch 2.13's recovery for that,
    ``reset_iter_state()`` on the root, is called first, with the collectives FSDP2 left in
    flight dropped before (it would wait for an all-gather whose peer is gone)."""
    from torch.distributed.fsdp import FSDPModule

    drop_in_flight(model)
    for module in model.modules():
        if not isinstance(module, FSDPModule):
            continue
        state = module._get_fsdp_state()
        if getattr(state, "_is_root", None) and hasattr(module, "reset_iter_state"):
            module.reset_iter_state()
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


def drop_in_flight(model: Any) -> None:
    """Forget the collectives FSDP2 left in flight in ``model`` (a prefetched all-gather):
    their works hold their groups, and waiting for them could wait for a lost peer."""
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if not isinstance(module, FSDPModule):
            continue
        group = getattr(module._get_fsdp_state(), "_fsdp_param_group", None)
        ctx = getattr(group, "comm_ctx", None)
        for owner, attr in ((group, "_all_gather_result"), (group, "_all_reduce_state"),
                            (ctx, "all_gather_state")):
            if hasattr(owner, attr):
                setattr(owner, attr, None)
        getattr(ctx, "reduce_scatter_states", []).clear()


_GROUP_ATTRS = ("shard_process_group", "replicate_process_group",
                "reduce_scatter_process_group")


def let_go_of_groups(model: Any) -> list[Any]:
    """Take ``model``'s process groups from it (FSDP2's mesh infos, its meshes' registries),
    once it is resharded, and return them: freed (off the main thread, see
    :meth:`.elastic.Elastic._teardown`) once torch.distributed forgets them too, a gloo group
    closes its connections, and a peer waiting in a collective with this process fails at once
    instead of after the collective timeout. Seen under HSDP: of a node's two processes, one
    failed its step on the lost node's closed connection and left for the next epoch, the
    other had passed that all-reduce and waited for its sibling in the next unit's
    reduce-scatter (60 s on real Slurm, the epoch then given up). The model's local shards
    stay readable; it runs no collective any more (torch 2.13's attributes; a missing one is
    skipped)."""
    from torch.distributed.fsdp import FSDPModule

    reshard_in_place(model)   # drops the collectives in flight first (they hold groups too)
    taken: list[Any] = []
    for module in model.modules():
        if not isinstance(module, FSDPModule):
            continue
        group = getattr(module._get_fsdp_state(), "_fsdp_param_group", None)
        for info in (getattr(group, "mesh_info", None),
                     getattr(group, "post_forward_mesh_info", None)):
            if info is None:
                continue
            for attr in _GROUP_ATTRS:
                pg = getattr(info, attr, None)
                if pg is not None:
                    taken.append(pg)
                    setattr(info, attr, None)
            mesh = getattr(info, "mesh", None)
            registry = getattr(mesh._get_root_mesh(), "_pg_registry", {}) if mesh else {}
            taken += registry.values()
            registry.clear()
    return taken
