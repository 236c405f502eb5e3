"""The sharded hand-over: a new group's members come to one sharded training state.

:class:`ShardedHandover` implements :class:`~malletrain_core.worker.inplace.StateHandover`
for a model that no rank holds whole. After every re-form each member rebuilds the model on
the new group's mesh (the script's ``build(mesh)``, its usual ``fully_shard`` calls) and the
shards reach it in memory:

* ``hsdp``: the mesh is ``(replicate, shard)``, a node's processes sharding among themselves
  and nodes being replicas. A change moves only whole replicas: each rank of a joining replica
  receives its shards from the matching rank of a surviving one (:func:`~.heal.heal_hsdp`),
  survivors copy their own. A node lost without warning costs nothing while one replica stays.
* ``fsdp``: one dimension over the whole group, the shard count following the world. A grow
  re-shards over the new group (:func:`~.reshard.reshard_fsdp`); a planned shrink re-shards
  over the OLD group before the leavers go (:meth:`ShardedHandover.before_reform`), the
  survivors building the model once the new group exists (:func:`~.reshard.adopt`); a change
  that also adds members then re-shards from the survivors to the whole group. A member lost
  without warning takes rows only its buddy's copy holds (:mod:`.buddy`, refreshed every
  ``buddy_every`` steps): the group rolls back to those copies' step, or, when a shard lost
  both holders (or there are no copies), every member reads the last checkpoint.

What is not sharded (the step, the sample count, the scheduler, the ``extra`` objects, the RNGs)
travels from a holder to the members that lack it in one broadcast, as
:class:`~malletrain_core.worker.inplace.BroadcastHandover` sends it. Every collective goes
through the member's abandonable ``_collective``; after a move the replicas of each shard
compare digests.
"""

from __future__ import annotations

import io
import random
import sys
import time
from collections.abc import Callable
from typing import Any

from ..inplace.handover import Handed
from .buddy import BuddyCopies, choose, restore
from .exchange import broadcast_bytes
from .heal import heal_hsdp, step_barrier
from .reshard import Resharded, adopt, default_bucket_bytes, mesh_of, reshard_fsdp
from .state import Manifest, build_seeded, local_digest, rebuild, reshard_in_place

HSDP = "hsdp"
"""Replicas across nodes, shards within a node: a change moves whole replicas."""
FSDP = "fsdp"
"""Shards across the whole job: a change re-shards to the new world."""
MESH_DIMS = ("replicate", "shard")


class ShardedHandover:
    """Hands a sharded state over to a new group (see the module doc), in ``mode``
    :data:`HSDP` or :data:`FSDP`.

    ``build(mesh)`` returns the model sharded on ``mesh`` (its ``fully_shard`` calls); it is
    called with parameters on the meta device at every change (the shards are copied in) and
    once for real, seeded with ``seed``, when nobody holds a state (the job's first epoch).
    ``make_optimizer(model)`` and ``make_scheduler(optimizer)`` (optional) build the rest; the
    global RNG is left as it was by both. What the last change moved is in :attr:`moved`."""

    def __init__(self, mode: str, build: Callable[[Any], Any],
                 make_optimizer: Callable[[Any], Any],
                 make_scheduler: Callable[[Any], Any] | None = None, seed: int = 0,
                 bucket_bytes: int | None = None, buddy_every: int = 0) -> None:
        if mode not in (HSDP, FSDP):
            raise ValueError(f"mode {mode!r}: give {HSDP!r} (replicas across nodes, shards "
                             f"within one) or {FSDP!r} (shards across the whole job)")
        self.mode = mode
        self.build = build
        self.make_optimizer = make_optimizer
        self.make_scheduler = make_scheduler
        self.seed = seed
        self.bucket_bytes = bucket_bytes
        self.place: tuple[int, int] = (0, 0)   # (shard index, count) the model is sharded as
        self.moved: dict[str, Any] = {}
        self._stash: Resharded | None = None   # a planned shrink's shards, for adopt
        self.copies = BuddyCopies(buddy_every if mode == FSDP else 0)

    # ----- the non-sharded part ---------------------------------------------------------
    def contribution(self, member: Any) -> dict[str, Any]:
        import torch

        return {"scheduler": (member.scheduler.state_dict() if member.scheduler is not None
                              else None),
                "extra": {k: v.state_dict() for k, v in member.extra.items()},
                "step": member.step, "samples": member.session.samples,
                "rng": torch.get_rng_state(), "py_rng": random.getstate()}

    def apply(self, member: Any, received: dict[str, Any]) -> None:
        import torch

        if member.scheduler is not None and received.get("scheduler") is not None:
            member.scheduler.load_state_dict(received["scheduler"])
        for k, v in member.extra.items():
            if k in received["extra"]:
                v.load_state_dict(received["extra"][k])
        member.step = int(received["step"])
        member.session.samples = float(received["samples"])
        torch.set_rng_state(received["rng"])
        random.setstate(received["py_rng"])
        member.has_state = True

    def _send_rest(self, member: Any, src: int, lacking: bool) -> int:
        """The non-sharded part from rank ``src`` to every member, taken where ``lacking``."""
        import torch

        data = None
        if member.rank == src:
            buf = io.BytesIO()
            torch.save(self.contribution(member), buf)
            data = buf.getvalue()
        got = broadcast_bytes(data, src, device=member._device, collective=member._collective)
        if lacking:
            self.apply(member, torch.load(io.BytesIO(got), weights_only=True))
        return len(got)

    # ----- building -----------------------------------------------------------------------
    def _meta(self, mesh: Any) -> Any:
        import torch

        with torch.random.fork_rng(devices=[]), torch.device("meta"):
            return self.build(mesh)

    def _install(self, member: Any, model: Any, optimizer: Any) -> None:
        """Make ``model`` and ``optimizer`` the member's, the scheduler following (HSDP: the
        optimizer's step waits for the node's other ranks, :func:`~.heal.step_barrier`)."""
        member.model = member.net = model
        member.optimizer = optimizer
        if self.mode == HSDP:
            mesh = mesh_of(model)
            optimizer.register_step_pre_hook(lambda *_: step_barrier(member, mesh))
        if self.make_scheduler is not None:
            lrs = [g["lr"] for g in optimizer.param_groups]
            old, member.scheduler = member.scheduler, self.make_scheduler(optimizer)
            if old is not None:
                member.scheduler.load_state_dict(old.state_dict())
            for g, lr in zip(optimizer.param_groups, lrs, strict=True):
                g["lr"] = lr   # as the state held them (a fresh scheduler resets them)

    def _fresh(self, member: Any, mesh: Any) -> None:
        """Build the model for real (seeded) and load the last checkpoint, if any."""

        member.model = member.net = member.optimizer = member.scheduler = None  # let go first
        model = build_seeded(self.build, mesh, self.seed)
        self._install(member, model, self.make_optimizer(model))
        member.has_state, member.step = False, 0
        member._resume()

    def _mesh(self, member: Any) -> Any:
        from torch.distributed.device_mesh import init_device_mesh

        kind = member._device.type
        if self.mode == FSDP:
            return init_device_mesh(kind, (member.world,))
        width = member.local_world
        if member.world % width:
            raise ValueError(f"HSDP: a group of {member.world} processes is not whole nodes of "
                             f"{width}")
        return init_device_mesh(kind, (member.world // width, width),
                                mesh_dim_names=MESH_DIMS)

    def _gather(self, member: Any, row: list[int]) -> list[list[int]]:
        import torch
        import torch.distributed as dist

        mine = torch.tensor(row, dtype=torch.int64, device=member._device)
        rows = [torch.zeros_like(mine) for _ in range(member.world)]
        member._collective(dist.all_gather, rows, mine)
        return [[int(x) for x in r.cpu()] for r in rows]

    # ----- the hand-over --------------------------------------------------------------------
    def hand_over(self, member: Any, group: Any) -> Handed:
        handed = self._hand_over(member)
        self.copies.drop()  # of the old layout: refreshed at the next step agreement
        return handed

    def _hand_over(self, member: Any) -> Handed:
        if member.model is not None:
            reshard_in_place(member.model)
        mesh = self._mesh(member)
        stash, self._stash = self._stash, None
        rows = self._gather(member, [1 if member.has_state and member.model is not None
                                     else 0, member.step, *self.place,
                                     *(stash.place if stash is not None else (-1, 0)),
                                     *self.copies.row()])
        top = max((r[1] for r in rows if r[0]), default=-1)
        self.moved = {"mode": self.mode, "sent_bytes": 0, "received_bytes": 0,
                      "from_disk": False, **(self.moved if stash is not None else {})}
        # the members a planned shrink re-sharded to (before_reform), in their order
        stashed = [r for r in range(member.world) if rows[r][4] >= 0]
        whole = bool(stashed) and all(rows[r][5] == len(stashed) and rows[r][4] == i
                                      for i, r in enumerate(stashed))
        if self.mode == HSDP:
            src, lacking = self._heal(member, mesh, rows, top)
        elif whole and len(stashed) == member.world:
            assert stash is not None
            member.model = member.net = member.optimizer = None
            done = adopt(stash, build=self._meta, make_optimizer=self.make_optimizer, mesh=mesh,
                         device=member._device)
            self._install(member, done.model, done.optimizer)
            self.place = (member.rank, member.world)
            return Handed(0, 0, "")
        elif whole:
            src, lacking = self._adopt_and_grow(member, mesh, stash, stashed)
        else:
            src, lacking = self._reshard(member, mesh, rows, top)
            if src < 0 and self._from_copies(member, mesh, rows) >= 0:
                src, lacking = 0, [False] * member.world
        sent = 0
        if src < 0:
            if any(r[0] for r in rows):   # a state was held in memory: say why it was not used
                held = "; ".join(f"{i}: {'yes' if r[0] else 'no'}, {r[1]}, "
                                 f"{[x for x in r[6::4] if x >= 0]}" for i, r in enumerate(rows))
                print(f"malletrain: {self.mode}: no step is held whole in memory, the checkpoint is "
                      f"read (rank: in memory, step, copies' steps: {held})", file=sys.stderr)
            self._fresh(member, mesh)
            self.moved["from_disk"] = True
        elif any(lacking):
            sent = self._send_rest(member, src, lacking[member.rank])
        self.place = (member.rank, member.world) if self.mode == FSDP else \
            (member.rank % member.local_world, member.local_world)
        mine = ""
        if any(lacking) and src >= 0:
            mine = self._check(member)
        return Handed(max(src, 0), sent + self.moved["sent_bytes"], mine)

    def _heal(self, member: Any, mesh: Any, rows: list[list[int]],
              top: int) -> tuple[int, list[bool]]:
        """HSDP: the replicas whose every rank holds step ``top`` survive; the others heal
        from them. (-1, ...) when no replica holds it whole: the checkpoint, then."""
        width = member.local_world
        replicas = member.world // width
        whole = [all(rows[r * width + i][0] and rows[r * width + i][1] == top
                     for i in range(width)) for r in range(replicas)]
        survivors = [r for r in range(replicas) if whole[r]]
        lacking = [not whole[r // width] for r in range(member.world)]
        if not survivors:
            return -1, lacking
        joiners = [r for r in range(replicas) if not whole[r]]
        self._move(member, whole[member.rank // width], lambda model, optimizer: heal_hsdp(
            model, optimizer, build=self._meta, make_optimizer=self.make_optimizer, mesh=mesh,
            survivors=survivors, joiners=joiners, device=member._device,
            bucket_bytes=self.bucket_bytes, collective=member._collective))
        return survivors[0] * width, lacking

    def _reshard(self, member: Any, mesh: Any, rows: list[list[int]],
                 top: int) -> tuple[int, list[bool]]:
        """FSDP: the members holding step ``top`` must hold every shard of one layout; they
        re-shard it to the new world. (-1, ...) when a shard is missing (a member lost)."""
        holding = [r for r in range(member.world) if rows[r][0] and rows[r][1] == top]
        count = {rows[r][3] for r in holding}
        lacking = [r not in holding for r in range(member.world)]
        if len(count) != 1:
            return -1, lacking
        n = count.pop()
        old_ranks = [-1] * n
        for r in holding:
            if 0 <= rows[r][2] < n and old_ranks[rows[r][2]] < 0:
                old_ranks[rows[r][2]] = r
        if not n or min(old_ranks) < 0 or len(holding) != n:
            return -1, lacking
        self._reshard_from(member, mesh, old_ranks)
        return old_ranks[0], lacking

    def _from_copies(self, member: Any, mesh: Any, rows: list[list[int]]) -> int:
        """FSDP, a shard lost with its member: roll back to the newest step whose buddy copies
        hold every shard (:func:`~.buddy.choose`), re-sharded to the new group, the rest from
        a holder's copy of that step. Returns that holder's rank, -1 when no step is whole."""
        import torch

        holders = choose([r[6:] for r in rows])
        if holders is None:
            return -1
        src, snap = holders.by_shard[0][0], self.copies.at(holders.step)
        kw = {"device": member._device, "collective": member._collective}
        manifest = Manifest.from_bytes(broadcast_bytes(
            snap.manifest.to_bytes() if snap is not None and member.rank == src else None,
            src, **kw))
        member.model = member.net = member.optimizer = None
        model, optimizer, targets = rebuild(self._meta, self.make_optimizer, mesh, manifest,
                                            member._device)
        traffic = restore(snap, holders, manifest, targets=targets, rank=member.rank,
                          world=member.world, new_ranks=list(range(member.world)),
                          bucket_bytes=self.bucket_bytes or default_bucket_bytes(
                              manifest, member.world), **kw)
        self._install(member, model, optimizer)
        rest = broadcast_bytes(snap.rest if snap is not None and member.rank == src else None,
                               src, **kw)
        top = member.step
        self.apply(member, torch.load(io.BytesIO(rest), weights_only=True))
        self.moved.update(sent_bytes=traffic.sent_bytes, received_bytes=traffic.received_bytes,
                          from_buddy=True, rolled_back_to=holders.step,
                          steps_lost=max(0, top - holders.step))
        return src

    def refresh(self, member: Any) -> None:
        """FSDP: refresh the buddy copies when due (:class:`~.buddy.BuddyCopies`); every
        member calls it at the same step agreement."""
        import torch

        if self.mode != FSDP or member.model is None or \
                not self.copies.due(member.step, member.world, member.local_world):
            return
        if self.place != (member.rank, member.world):
            raise RuntimeError(f"shard {self.place} held at rank {member.rank} of "
                               f"{member.world}: the layout is not the group's")
        buf = io.BytesIO()
        torch.save(self.contribution(member), buf)
        reshard_in_place(member.model)
        self.copies.take(member.model, member.optimizer, rank=member.rank, world=member.world,
                         width=member.local_world, step=member.step, rest=buf.getvalue(),
                         device=member._device, bucket_bytes=self.bucket_bytes,
                         collective=member._collective)

    def _adopt_and_grow(self, member: Any, mesh: Any, stash: Resharded | None,
                        stashed: list[int]) -> tuple[int, list[bool]]:
        """FSDP, a planned change that dropped and added members: the members that stayed
        adopt their shards on a mesh of their own, then re-shard to the whole new world."""
        from torch.distributed.device_mesh import DeviceMesh

        staying = DeviceMesh(member._device.type, stashed)  # every rank forms its groups
        if stash is not None:
            member.model = member.net = member.optimizer = None
            adopt(stash, build=self._meta, make_optimizer=self.make_optimizer, mesh=staying,
                  device=member._device)
            member.model, member.optimizer = stash.model, stash.optimizer
        self._reshard_from(member, mesh, stashed)
        return stashed[0], [r not in stashed for r in range(member.world)]

    def _reshard_from(self, member: Any, mesh: Any, old_ranks: list[int]) -> None:
        """Re-shard from the holders ``old_ranks`` (shard ``i`` on ``old_ranks[i]``) to the
        whole group, on ``mesh``."""
        self._move(member, member.rank in old_ranks, lambda model, optimizer: reshard_fsdp(
            model, optimizer, build=self._meta, make_optimizer=self.make_optimizer, group=None,
            old_ranks=old_ranks, new_ranks=list(range(member.world)), new_mesh=mesh,
            device=member._device, bucket_bytes=self.bucket_bytes,
            collective=member._collective))

    def _move(self, member: Any, keep: bool, move: Callable[[Any, Any], Any]) -> None:
        """``move(model, optimizer)`` with this member's old ones where ``keep`` (else None),
        held nowhere else meanwhile; its model and optimizer become the member's. A move
        that fails (a peer lost) leaves the old ones, which it only read, to the next try."""
        model, optimizer = (member.model, member.optimizer) if keep else (None, None)
        member.model = member.net = member.optimizer = None
        try:
            done = move(model, optimizer)
        except BaseException:
            if keep:
                member.model = member.net = model
                member.optimizer = optimizer
            raise
        del model, optimizer
        self._install(member, done.model, done.optimizer)
        self._record(done)

    def _record(self, done: Any) -> None:
        """What a heal or a re-shard moved, into :attr:`moved`."""
        self.moved.update(sent_bytes=done.traffic.sent_bytes,
                          received_bytes=done.traffic.received_bytes,
                          peak_extra_ratio=round(done.peak_extra_ratio, 3))

    def _check(self, member: Any) -> str:
        """The digest of this rank's shards, compared with the other replicas' of the same
        shard index (FSDP: one holder per index, nothing to compare)."""
        mine = local_digest(member.model, member.optimizer, member.step)
        rows = self._gather(member, [int(mine[:15], 16)])
        width = member.local_world if self.mode == HSDP else member.world
        for index in range(width):
            if len({rows[r][0] for r in range(index, member.world, width)}) != 1:
                raise RuntimeError(f"shard {index}: the replicas' digests differ after the "
                                   "hand-over")
        return mine

    def before_reform(self, member: Any, group: Any, coming: Any) -> None:
        """FSDP, a planned change that drops members: re-shard over the old group, leavers
        included, to the members that stay (ordered by their new rank), before it is let
        go; they adopt the shards on the new group's mesh in :meth:`hand_over`."""
        self._stash = None
        if self.mode != FSDP or member.world <= 1 or member.model is None:
            return
        rows = self._gather(member, [-1 if coming.leave else coming.rank, coming.world])
        staying = sorted((row[0], r) for r, row in enumerate(rows) if row[0] >= 0)
        if len(staying) in (0, member.world):
            return
        if self.place != (member.rank, member.world):
            raise RuntimeError(f"shard {self.place} held at rank {member.rank} of "
                               f"{member.world}: the layout is not the group's")
        t0 = time.monotonic()
        reshard_in_place(member.model)
        done = reshard_fsdp(member.model, member.optimizer, build=self._meta,
                            make_optimizer=self.make_optimizer, group=None,
                            old_ranks=list(range(member.world)),
                            new_ranks=[r for _, r in staying], new_mesh=None,
                            device=member._device, bucket_bytes=self.bucket_bytes,
                            collective=member._collective)
        self.moved = {"mode": self.mode, "before_reform_s": round(time.monotonic() - t0, 4)}
        self._record(done)
        if not coming.leave:
            self._stash = done

