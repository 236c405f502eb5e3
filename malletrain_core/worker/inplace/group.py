"""One process's membership of the job's group: forming, wrapping and letting go of each
epoch's group, and the hand-over into it (:class:`GroupMember`, the base of
:class:`~.elastic.Elastic`, which adds the step loop and the control channel)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from .. import training
from ..control import Membership
from ..startup import ddp_without_dynamo
from .device import bind_device, configuration_error
from .handover import BroadcastHandover, Handed, StateHandover
from .letgo import EXIT_ABORT_HUNG, OldGroups, _Abandoned, _forget_default_group, abandon_action
from .lifecycle import GroupState, Lifecycle
from .pending import StepAbandoned, _Pending
from .release import GroupSockets
from .rendezvous import Rendezvous
from .state import TrainingState
from .store import StoreHost
from .watch import ControlWatch


class GroupMember(TrainingState):
    """The group side of one training process: its current group (:attr:`epoch`,
    :attr:`rank`, :attr:`world`, the wrapped :attr:`net`), the operations in flight on it,
    its state in :attr:`lifecycle`, the groups it let go of, and :meth:`_apply`, which
    re-forms into a new membership. :class:`~.elastic.Elastic` supplies the control channel
    (``_channel``), the rendezvous and how the process leaves (``_leave``)."""

    _channel: ControlWatch
    _rendezvous: Rendezvous

    def __init__(self, session: training.Session, model: Any, optimizer: Any, scheduler: Any,
                 extra: Mapping[str, Any] | None, step: int,
                 on_save: Callable[[int], None] | None, backend: str, ddp: bool,
                 lr_for: Callable[[int], float] | None, timeout_s: float,
                 handover: StateHandover | None) -> None:
        super().__init__(session, model, optimizer, scheduler, extra, step, on_save)
        self.backend = backend
        self.ddp = ddp
        self.lr_for = lr_for
        self.handover: StateHandover = handover if handover is not None else BroadcastHandover()
        self.timeout_s = timeout_s
        self.net: Any = model
        self.epoch: int | None = None
        self.rank = session.rank
        self.world = session.world_size
        self.local_world = 1   # processes per node (Elastic reads its environment)
        self.changes: list[dict[str, Any]] = []
        self.lifecycle = Lifecycle()
        self._pending = _Pending(device_sync=backend == "nccl")
        if backend == "nccl":
            bind_device()
        self._old = OldGroups(timeout_s, lambda: self._pending.reason is not None)
        self._phases: dict[str, float] = {}    # the current re-form's pieces (_apply)
        self._store: Any = None
        self._host = StoreHost()
        # gloo: each group's connections, shut down when an abandoned operation holds the
        # main thread (:mod:`.release`); NCCL's communicators are aborted instead
        self._sockets = GroupSockets() if backend == "gloo" else None

    def _leave(self, code: int, why: str) -> None:
        """End the process with ``code``, saying ``why`` (:meth:`.elastic.Elastic._leave`)."""
        raise NotImplementedError

    @property
    def holds_abandoned(self) -> bool:
        """Whether this process holds an abandoned operation, or a group whose let-go has not
        returned: it then leaves with ``os._exit`` (see :class:`~.letgo.OldGroups`)."""
        return self._old.held

    @holds_abandoned.setter
    def holds_abandoned(self, held: bool) -> None:
        self._old.held = held

    @property
    def retired(self) -> list[dict[str, Any]]:
        """What letting go of each old group took (its epoch, kind, seconds, error)."""
        return self._old.retired

    @property
    def retire_bound_s(self) -> float | None:
        """How long letting go of an old group may take; None: by its kind
        (:meth:`~.letgo.OldGroups.bound`)."""
        return self._old.bound_s

    @retire_bound_s.setter
    def retire_bound_s(self, seconds: float | None) -> None:
        self._old.bound_s = seconds

    @property
    def holding_step(self) -> bool:
        """Whether a re-form inside a step is under way, this step's gradients kept."""
        return self.lifecycle.holding_step

    def _teardown(self) -> None:
        """Let go of the current group without waiting for it (see :mod:`.letgo`).

        The group is forgotten by torch.distributed at once, so the next one can be formed
        beside it, and is shut down (planned changes) or aborted (NCCL, an abandoned
        operation) in a thread of its own. An abandoned gloo group cannot be shut down while
        its operation is pending: it goes to the graveyard until that operation ends."""
        import torch.distributed as dist

        old_net, self.net = self.net, self.model
        works = self._pending.release()
        if not dist.is_initialized():
            self._store = None
            return
        backend = str(dist.get_backend())
        if self._pending.reason is not None and abandon_action(backend) == "forget":
            # An abandoned gloo operation is still pending on a hung peer: shutting the group
            # down would wait for it (the collective timeout). Forget the group instead and
            # keep it referenced, so that no destructor waits either; this process leaves with
            # os._exit (see close()).
            self._old.forget(_Abandoned(dist.group.WORLD, self._store, old_net, works))
            self._let_go_store()
            _forget_default_group()
            return
        # NCCL with an abandoned operation: aborting the communicators ends it. A shut-down or
        # abort that hangs itself (a communicator stuck in the driver) is given up on after
        # retire_bound_s: the node's processes leave and restart (never a hung job).
        kind = "abort" if self._pending.reason is not None else "shutdown"
        t0 = time.monotonic()
        self._settle_retiring(wait=True)   # at most one old group being let go at a time
        self._phases["wait_retiring_s"] = time.monotonic() - t0
        parts = [old_net, dist.group.WORLD, self._store]
        del old_net
        self._let_go_store()
        _forget_default_group()
        # The parts go to the thread with no reference of their own left here: the thread
        # can be done before this one runs again, and a last reference dropped here freed the
        # group and the store this process hosted on the step's path (the store's destructor
        # joins its thread, seen in a 5-s reverse DNS lookup).
        self._old.retire(kind, self.epoch, backend, parts, works)
        del parts, works   # the lists the thread empties, not their contents

    def _let_go_store(self) -> None:
        """Forget the group's store here (its new owner keeps it, or nobody)."""
        self._host.let_go(self._store)
        self._store = None

    def _settle_retiring(self, wait: bool) -> None:
        """Forget the group let go in the background once done; past its bound, leave for the
        restart path (:data:`~.letgo.EXIT_ABORT_HUNG`, see :meth:`~.letgo.OldGroups.settle`)."""
        why = self._old.settle(wait)
        if why:
            self._leave(EXIT_ABORT_HUNG, why)

    @property
    def _device(self) -> Any:
        """Where the control collectives' tensors live: the GPU for NCCL, else the CPU."""
        import torch

        if self.backend == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def _form(self, m: Membership) -> bool:
        """Form ``m``'s group (:class:`~.rendezvous.Rendezvous`); False when ``m`` was given
        up meanwhile (a newer membership told, or a peer of its epoch found silent)."""
        t0 = time.monotonic()
        store = self._rendezvous.meet(m)
        if store is None:
            return False
        self._store = store
        self._phases["store_s"] = time.monotonic() - t0
        self._rendezvous.init_group(m, store, self.backend,
                                    self._device if self.backend == "nccl" else None)
        return True

    def _wrap(self) -> None:
        from torch import nn

        if self.world > 1 and self.ddp:
            with ddp_without_dynamo():   # a joiner's first step imports no torch._dynamo
                net = nn.parallel.DistributedDataParallel(self.model)
            # a lambda: DDP refuses a hook whose parameters carry (string) annotations
            net.register_comm_hook(None, lambda state, bucket: self._pending.hook(state, bucket))
            self.net = net
        else:
            self.net = self.model

    def _collective(self, op: Callable[..., Any], *args: Any) -> None:
        self._pending.wait(self._pending.track(op(*args, async_op=True)))

    def _apply(self, m: Membership, kind: str) -> Handed:
        """Re-form into ``m`` (the state already moved to FORMING, REFORMING or HOLDING_STEP),
        or the next epoch if ``m``'s is given up; then TRAINING. Returns the hand-over's."""
        import torch.distributed as dist

        t0 = time.monotonic()
        # where a re-form's time goes (the last try's, in the change record): the wait for
        # the group let go before (at most one at a time), meeting at the store, the new
        # group's init, and the hand-over of the state
        self._phases = {}
        while True:
            if m.leave:
                self._leave(0, f"epoch {m.epoch}: this node leaves the job")
            self._teardown()
            self._channel.let_go = self.epoch  # no longer watched by the heartbeat
            self._host.let_go_before(m.epoch)
            self._pending.reset(m.epoch)
            t_form = time.monotonic()
            if self._sockets is not None:
                self._sockets.opening()
            try:
                formed = self._form(m)
            except Exception:
                # the group's init failed (a peer stopped between checking in and connecting
                # waits out the collective timeout in gloo): the next epoch if a peer of this
                # one was found silent meanwhile (or it was replaced), else the error
                if not self._channel.replaced(m):
                    raise
                formed = False
            if not formed:
                m = self._channel.await_epoch(m.epoch + 1)  # replaced before it formed
                continue
            self._phases["form_s"] = time.monotonic() - t_form
            if self._sockets is not None:   # releasable from here (a hand-over held too)
                self._sockets.opened(m.epoch, self._channel.store_ports)
            self.epoch, self.rank, self.world = m.epoch, m.rank, m.world
            self.session.set_membership(m.epoch, m.rank, m.world)
            try:
                t_hand = time.monotonic()
                handed = self.handover.hand_over(self, dist.group.WORLD)
                self._phases["hand_over_s"] = time.monotonic() - t_hand
                self._wrap()  # DDP's constructor runs collectives too
                break
            except Exception as exc:  # a member lost during the hand-over: the next epoch
                if not self._is_peer_failure(exc):
                    raise
                self._note_abandoned()
                m = self._channel.await_epoch(m.epoch + 1)
            finally:
                if self._sockets is not None:   # the group's and its subgroups' connections
                    self._sockets.opened(self.epoch, self._channel.store_ports)
        if self.lr_for is not None:
            lr = self.lr_for(self.world)
            for group in self.optimizer.param_groups:
                group["lr"] = lr
        self.changes.append({"epoch": m.epoch, "kind": kind, "world": m.world, "rank": m.rank,
                             "step": self.step, "reform_s": round(time.monotonic() - t0, 4),
                             **{k: round(v, 4) for k, v in self._phases.items()},
                             **handed.record()})
        self.lifecycle.to(GroupState.TRAINING)
        return handed

    def _note_abandoned(self) -> None:
        """Remember that this process holds an operation the control thread abandoned (called
        on every peer failure: the node's other processes are told too)."""
        self._old.held = self._old.held or self._pending.reason is not None
        self._channel.tell_siblings()

    def _is_peer_failure(self, exc: BaseException) -> bool:
        import torch.distributed as dist

        setup = configuration_error(exc)
        if setup:
            raise RuntimeError(f"malletrain: {setup} ({type(exc).__name__}: "
                               f"{str(exc).splitlines()[0] if str(exc) else ''})") from exc
        if isinstance(exc, (StepAbandoned, dist.DistError)) or self._pending.reason:
            return True
        text = str(exc)
        return isinstance(exc, RuntimeError) and any(
            w in text for w in ("gloo", "Connection closed", "Connection reset", "Timed out"))
