"""Sharded training states moved in memory: the primitives for rescaling FSDP2 and HSDP in place.

A model every rank holds whole is handed over in place by one broadcast
(:class:`~malletrain_core.worker.inplace.handover.BroadcastHandover`). A sharded model cannot
be: no rank holds it whole, and none should. This package moves the shards themselves:

* :mod:`.plan` (pure): FSDP2's dim-0 layout (``torch.chunk``'s rule), which rows go from which
  old holder to which new one when the shard count changes (:func:`~.plan.reshard_plan`), and
  which surviving HSDP replica heals each joining one (:func:`~.plan.heal_plan`);
* :mod:`.reshard`: :func:`~.reshard.reshard_fsdp`, FSDP across the job with the shard count
  following the world: parameters, AdamW's state and ``step`` re-sharded from N ranks to M
  over one gloo group, each rank sending only the rows that move, and the model rebuilt on
  the new mesh by the script's own code (or, where that mesh forms only after the exchange,
  later by :func:`~.reshard.adopt`);
* :mod:`.heal`: :func:`~.heal.heal_hsdp`, HSDP with elastic replicas: rank ``i`` of a joining
  replica receives its shards whole from rank ``i`` of a surviving one;
* :mod:`.state` names a rank's local tensors and their JSON manifest; :mod:`.exchange` moves
  slices of them in bounded buckets, one ``all_to_all_single`` each, and counts the buffers.

Not yet wired into :class:`~malletrain_core.worker.inplace.Elastic`: nothing in the in-place
group calls this package. What the wiring is to do, against the seam in
:mod:`~malletrain_core.worker.inplace.handover`:

* a ``ShardedHandover`` implementing ``StateHandover``, given to ``Elastic`` as ``handover=``.
  Its ``hand_over(member, group)`` serves both modes: :func:`~.heal.heal_hsdp` when the
  replica count changes (HSDP), :func:`~.reshard.reshard_fsdp` when the shard count does
  (FSDP). It passes ``member._collective`` as ``collective`` (each collective abandonable, a
  lost peer failing it at once) and ``member._device`` as ``device``; it learns
  ``old_ranks`` by an all-gather of each member's previous rank (and ``survivors`` from
  ``member.has_state``); the script gives ``build(mesh)`` and ``make_optimizer(model)``, and
  the new model and optimizer replace the member's old ones (``member.model`` and its
  optimizer) before the model is used again. ``contribution`` and
  ``apply``, the one-payload hooks, serve only what is not sharded: the sampler's position,
  the RNGs and the scheduler still travel as ``BroadcastHandover`` sends them.
* a planned FSDP shrink: the leavers hold rows the survivors need, so the exchange runs on
  the old group before they leave (a hook before the re-form, which the seam lacks today),
  with ``new_mesh=None``; after the re-form each survivor calls :func:`~.reshard.adopt`.
* the digest check after a hand-over becomes one per shard index (replicas of a shard agree;
  FSDP shards differ by design).
* a member lost without warning under FSDP takes rows nobody else holds: until a buddy copy
  of each shard exists, that change still reads the last checkpoint.
"""

from .exchange import Collective, Move, Traffic, run_collective
from .heal import Healed, heal_hsdp
from .plan import Piece, Source, chunk_rows, heal_plan, reshard_plan, shard_rows
from .reshard import Resharded, adopt, reshard_fsdp

__all__ = ["Collective", "Healed", "Move", "Piece", "Resharded", "Source", "Traffic",
           "adopt", "chunk_rows", "heal_hsdp", "heal_plan", "reshard_fsdp", "reshard_plan",
           "run_collective", "shard_rows"]
