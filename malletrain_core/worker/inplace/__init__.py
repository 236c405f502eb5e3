"""Rescaling in place: the training processes stay alive across membership changes.

The launcher writes each new membership (epoch, rank, world size, the daemon's fresh master and
port) atomically into ``membership.json`` in the control folder. :class:`Elastic` watches that
file from a control thread and, at step boundaries, re-forms the group (gloo, or NCCL on
GPUs), re-wraps DDP, hands the training state from the most advanced member to everyone else
(digest-checked), and applies the learning-rate rule. A script opts in with a few lines::

    session = training.Session()
    model, optimizer = build()
    el = inplace.Elastic(session, model, optimizer, lr_for=lambda world: 0.1 * world)
    for step in el.steps(total=1000):         # the global step; re-forms happen between steps
        with el.guard():                      # a step abandoned by a lost peer is retried
            loss = loss_fn(el.net(x(step, el.rank)), y)
            optimizer.zero_grad(); loss.backward(); optimizer.step()
        session.report(samples=batch * el.world)

The membership names NODES (the daemon's rank and world are a node's rank and the node count).
``malletrain-run --inplace --nproc-per-node N`` starts N processes per node with ``LOCAL_RANK``
and ``LOCAL_WORLD_SIZE``; each reads the node's file and takes the global rank
``node rank × N + LOCAL_RANK`` in a group of ``node count × N`` (:meth:`Membership.for_process`),
so a node's processes all re-form at the same epoch, and each writes its own ready file.

Planned changes (grow, shrink) stop every member at the same step boundary: after each step
the members all-reduce the newest epoch any of them has been told about, so no step is lost.
A lost peer (SIGKILL) fails the collective in flight at once; a hung peer is abandoned when the
membership says so (``abandon``): the control thread fails the DDP comm hook's futures and the
boundary agreement, the step in flight is dropped (at most one step lost) and the survivors
re-form. The collective timeout (60 s at most) is only the backstop. A process that still
holds an abandoned gloo operation cannot exit cleanly, so it leaves with ``os._exit``.

The parts, in the manner of TorchElastic's agent, rendezvous and worker group:

* :mod:`.elastic`: :class:`Elastic`, the step loop a script drives (the agent);
  :mod:`.group` its group side (:class:`~.group.GroupMember`: form, wrap, re-form, let go)
  and :mod:`.state` the training state it hands over and checkpoints;
* :mod:`.lifecycle`: the group's states (:class:`GroupState`) and the one table of the moves
  between them; a move the table does not allow raises :class:`LifecycleError`;
* :mod:`.watch`: the control thread and the heartbeat's calls (:class:`ControlWatch`);
* :mod:`.rendezvous` and :mod:`.store`: meeting at the epoch's store, hosted by its rank 0,
  on the port the daemon handed out;
* :mod:`.pending`: the collectives in flight, which the control thread may fail;
* :mod:`.letgo`: the old groups, shut down, aborted or forgotten beside the next one;
* :mod:`.handover`: how a new group's members come to one state; :mod:`.device`;
* :mod:`.restart`: the restart path under ``malletrain-run --inplace`` where a script has no
  in-process path (:mod:`..byo_inplace`).

The hand-over is a seam (:class:`StateHandover`). Once a new group is formed, every member
calls ``hand_over(member, group)`` with ``group`` that group (torch's default group: ranks
``member.rank`` of ``member.world``), before the model is wrapped again. Each member
contributes what it holds (``contribution``: by default its whole state, step, samples and
RNGs); the members agree on the most advanced one (the highest step), whose contribution
reaches every member that differs over ``group``, is loaded there (``apply``) and
digest-checked; with none in memory, each loads the last checkpoint. Every collective goes
through ``member._collective``, so that a peer lost meanwhile fails it at once and the
re-form moves on to the next epoch. The default, :class:`BroadcastHandover`, sends the whole
state in one broadcast; a sharded state (each member holding its shards, re-sharded for the
new world) plugs in as ``Elastic(..., handover=...)`` (:mod:`..sharded`). At a planned change
the hand-over also runs on the old group before it is let go (``before_reform``, empty for
the broadcast): a sharded state's leavers hand over the rows only they hold there.
"""

from __future__ import annotations

from ..control import (  # the control-file format, also importable from here as before
    LOST_NAME,
    MEMBERSHIP_NAME,
    READY_NAME,
    Membership,
    is_ready,
    local_layout,
    read_membership,
    ready_name,
    write_membership,
    write_peers_lost,
)
from .device import CONFIG_ERRORS, bind_device, configuration_error
from .elastic import MAX_COLLECTIVE_TIMEOUT_S, Elastic
from .group import GroupMember
from .handover import BroadcastHandover, Handed, HandoverMember, StateHandover, _feed, digest
from .letgo import (
    ABORT_BOUND_S,
    EXIT_ABORT_HUNG,
    OldGroups,
    _Abandoned,
    _abort_default_group,
    _abort_group,
    _forget_default_group,
    _Retiring,
    _shutdown_group,
    abandon_action,
)
from .lifecycle import TRANSITIONS, GroupState, Lifecycle, LifecycleError
from .pending import KEEP_WORKS_S, NAP_S, StepAbandoned, _Pending
from .rendezvous import Rendezvous
from .state import TrainingState
from .store import PortCycle, StoreHost, _accepts, _GaveUp, _one_line, _StoreCalls, listen_on
from .watch import ControlWatch

__all__ = [
    "ABORT_BOUND_S", "CONFIG_ERRORS", "EXIT_ABORT_HUNG", "KEEP_WORKS_S", "LOST_NAME",
    "MAX_COLLECTIVE_TIMEOUT_S", "MEMBERSHIP_NAME", "NAP_S", "READY_NAME", "TRANSITIONS",
    "BroadcastHandover", "ControlWatch", "Elastic", "GroupMember", "GroupState", "Handed",
    "HandoverMember", "Lifecycle", "LifecycleError", "Membership", "OldGroups", "PortCycle",
    "Rendezvous", "StateHandover", "StepAbandoned", "StoreHost", "TrainingState",
    "_Abandoned", "_GaveUp", "_Pending", "_Retiring", "_StoreCalls", "_abort_default_group",
    "_abort_group", "_accepts", "_feed", "_forget_default_group", "_one_line",
    "_shutdown_group", "abandon_action", "bind_device", "configuration_error", "digest",
    "is_ready", "listen_on", "local_layout", "read_membership", "ready_name",
    "write_membership", "write_peers_lost",
]
