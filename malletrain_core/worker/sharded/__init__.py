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

Wired into the in-place loop by :mod:`.handover` (:class:`~.handover.ShardedHandover`, the
:class:`~malletrain_core.worker.inplace.StateHandover` of a sharded state: HSDP heals joining
replicas, FSDP re-shards over the new group on a grow and over the old group before a planned
shrink) and :mod:`.elastic` (:class:`~.elastic.Elastic`, what a script uses: it gives
``build(mesh)`` and ``make_optimizer(model)`` instead of a model, since a sharded model exists
only on a group's mesh). A member lost without warning under FSDP takes its live rows, but
:mod:`.buddy` keeps a copy of every shard on the next node (refreshed every ``buddy_every``
steps): the group rolls back to it, and reads the last (DCP) checkpoint only when a shard lost
both holders; under HSDP nothing is lost while a replica survives.
"""

from .buddy import BuddyCopies, Snapshot
from .elastic import BUDDY_EVERY, Elastic
from .exchange import Collective, Move, Traffic, run_collective
from .handover import FSDP, HSDP, ShardedHandover
from .heal import Healed, heal_hsdp
from .plan import Piece, Source, chunk_rows, heal_plan, reshard_plan, shard_rows
from .reshard import Resharded, adopt, reshard_fsdp
from .state import local_digest

__all__ = ["BUDDY_EVERY", "FSDP", "HSDP", "BuddyCopies", "Collective", "Elastic", "Healed", "Move", "Piece", "Resharded",
           "ShardedHandover", "Source", "Traffic", "adopt", "chunk_rows", "heal_hsdp",
           "heal_plan", "local_digest", "reshard_fsdp", "reshard_plan", "run_collective",
           "shard_rows", "Snapshot"]
