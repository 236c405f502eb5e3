"""The training process's side of rescaling in place: :class:`Elastic` (see the package doc)."""

from __future__ import annotations

import atexit
import contextlib
import datetime as dt
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from .. import training
from ..control import Membership, local_layout, ready_name
from ..heartbeat import Heartbeat, peer_timeout_s
from .group import GroupMember
from .handover import Handed, StateHandover
from .lifecycle import GroupState
from .pending import StepAbandoned
from .rendezvous import Rendezvous
from .watch import ControlWatch

MAX_COLLECTIVE_TIMEOUT_S = 60.0


class Elastic(GroupMember):
    """Keeps one training process in its job across membership changes (see the package doc).

    ``extra`` maps names to objects with ``state_dict``/``load_state_dict`` (a sampler's
    position, a data iterator) that are handed over with the model. ``lr_for(world)`` gives the
    learning rate for a world size (the global-batch rule) and is applied on every change.
    Without a control folder (the restart path, or outside MalleTrain) it forms the group once
    from torchrun's environment and never re-forms. On both paths it checkpoints at step
    boundaries when ``session`` says so (its period, or the daemon's request) and resumes from
    the last checkpoint when no process holds the state (``on_save(step)`` after each save).
    ``backend`` is ``gloo`` or ``nccl`` (NCCL measured on one H100 at world 1, BENCHMARKS.md's
    section GPU; several GPUs per group not yet). ``handover`` is how a new group's members
    come to one state (:class:`~.handover.StateHandover`; the whole state broadcast by
    default). ``ddp=False`` leaves the model unwrapped and the script calls
    :meth:`average_gradients` after ``backward()`` (DDP's first use imports ``torch._dynamo``,
    about a second of CPU at every process start). With several processes per node
    (``malletrain-run --inplace --nproc-per-node N``: ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``)
    :attr:`rank` and :attr:`world` are the global ones, ``node rank × N + LOCAL_RANK`` and
    ``node count × N``, and ``lr_for`` gets that world.
    """

    def __init__(self, session: training.Session, model: Any, optimizer: Any,
                 scheduler: Any = None, lr_for: Callable[[int], float] | None = None,
                 extra: Mapping[str, Any] | None = None, step: int = 0,
                 collective_timeout_s: float = MAX_COLLECTIVE_TIMEOUT_S,
                 control_dir: str | None = None, poll_s: float = 0.02,
                 wait_membership_s: float = 600.0,
                 on_save: Callable[[int], None] | None = None, backend: str = "gloo",
                 ddp: bool = True, handover: StateHandover | None = None) -> None:
        if not 0 < collective_timeout_s <= MAX_COLLECTIVE_TIMEOUT_S:
            raise ValueError(f"collective_timeout_s must be in (0, {MAX_COLLECTIVE_TIMEOUT_S:g}]"
                             " (it is only the backstop for a hung peer)")
        if backend not in ("gloo", "nccl"):
            raise ValueError(f"backend {backend!r} cannot rescale in place: give gloo or nccl "
                             "(a backend without an abort, such as xccl, cannot let go of a "
                             "lost peer's operation); run without --inplace (the restart path)")
        super().__init__(session, model, optimizer, scheduler, extra, step, on_save, backend,
                         ddp, lr_for, collective_timeout_s, handover)
        self.poll_s = poll_s
        self.wait_membership_s = wait_membership_s
        control = control_dir if control_dir is not None else os.environ.get(
            training.ENV_CONTROL_DIR)
        self.control_dir = Path(control) if control else None
        self.inplace = self.control_dir is not None and os.environ.get(
            training.ENV_INPLACE, "1" if control_dir else "") == "1"
        # in place, the node's membership becomes this process's (see Membership.for_process)
        self.local_rank, self.local_world = local_layout(os.environ) if self.inplace else (0, 1)
        self.step_pauses: list[tuple[float, float]] = []  # this step's re-forms (start, end)
        self._step_failed = False              # this step was dropped (a lost peer)
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None
        self._channel = ControlWatch(
            self.control_dir, self.local_rank, self.local_world, poll_s, wait_membership_s,
            self._pending, lambda: (self.epoch, self.rank, self.world),
            lambda m: self._host.host(m, self.timeout_s), self._leave,
            self._sockets if self.inplace else None)
        self._rendezvous = Rendezvous(self._host, self._channel.replaced,
                                      collective_timeout_s, poll_s)
        self._beat = Heartbeat(self._channel.watched, self._channel.peer_silent,
                               peer_timeout_s() if self.inplace else 0.0,
                               host=self._channel.host_coming)
        self._beater: threading.Thread | None = None
        atexit.register(self._exit_guard)

    def _apply(self, m: Membership, kind: str) -> Handed:
        handed = super()._apply(m, kind)
        self._beat.wake()  # the epoch left stops being watched now, not at the next beat
        return handed

    # ----- the control channel (its thread: :class:`~.watch.ControlWatch`) ----------------
    def _watch(self) -> None:
        self._channel.run(self._stop)

    def _newest(self) -> Membership | None:
        return self._channel.newest()

    def average_gradients(self) -> None:
        """With ``ddp=False``: average the model's gradients over the group (one all-reduce of
        all of them, abandonable like DDP's), between ``backward()`` and the optimizer step;
        the model's floating-point buffers (BatchNorm's running statistics) are averaged in
        the same all-reduce.

        When a peer is lost in that all-reduce (a preemption, a crash), the survivors keep the
        step: they re-form at once, inside the step, and if every member of the new group holds
        this step's gradients (no joiner, nobody ahead) they average them over the new group
        and the step completes, with the lost node's samples left out. Otherwise the step is
        dropped as with DDP (:class:`StepAbandoned` reaches :meth:`guard`)."""
        import torch
        import torch.distributed as dist

        tensors = [p.grad for p in self.model.parameters() if p.grad is not None]
        if self.world <= 1 or not tensors:
            return
        # and the floating-point buffers (BatchNorm's running statistics), averaged as well:
        # each rank's forward pass moved them with its own batch, and without DDP (which
        # broadcasts rank 0's) nothing else keeps them equal between ranks
        tensors += [b for b in self.model.buffers() if b.is_floating_point()]
        while True:
            flat = torch.cat([t.reshape(-1) for t in tensors]).to(self._device)
            if self.world <= 1:
                break
            try:
                self._collective(dist.all_reduce, flat)
                break
            except Exception as exc:
                if not (self.inplace and self._is_peer_failure(exc)):
                    raise
                self._reform_holding_step()
        flat /= self.world
        offset = 0
        for t in tensors:
            t.copy_(flat[offset:offset + t.numel()].view_as(t))
            offset += t.numel()

    def _reform_holding_step(self) -> None:
        """Re-form after a peer was lost in this step's all-reduce, telling the new group that
        this process holds the step's gradients; raise :class:`StepAbandoned` unless every
        member does (see :meth:`average_gradients`)."""
        lost_t = time.time()
        self._note_abandoned()
        self.lifecycle.to(GroupState.HOLDING_STEP)
        try:
            handed = self._apply(self._channel.await_epoch((self.epoch or 0) + 1), "lost")
        finally:
            self.step_pauses.append((lost_t, time.time()))
        if not handed.kept_step:
            raise StepAbandoned(f"epoch {self.epoch}: a member of the new group does not hold "
                                f"step {self.step}'s gradients; the step is dropped")
        self.changes[-1]["kept_step"] = True

    # ----- changes ------------------------------------------------------------------------
    def _agree(self) -> int:
        """The newest epoch any member has been told about (all members call it each step)."""
        import torch
        import torch.distributed as dist

        m = self._newest()
        seen = m.epoch if m is not None else -1
        if self.world == 1:
            return seen
        t = torch.tensor([seen], dtype=torch.int64, device=self._device)
        self._collective(dist.all_reduce, t, dist.ReduceOp.MAX)
        return int(t[0])

    def _agree_and_save(self, save: Callable[[], object]) -> int:
        """:meth:`_agree`, with whether any member's session asks for a checkpoint in the same
        all-reduce: every member then calls ``save`` at this step (for a save that every rank
        takes part in, such as DCP's)."""
        import torch
        import torch.distributed as dist

        m = self._newest()
        seen, want = (m.epoch if m is not None else -1), int(self.session.should_checkpoint())
        if self.world > 1:
            t = torch.tensor([seen, want], dtype=torch.int64, device=self._device)
            self._collective(dist.all_reduce, t, dist.ReduceOp.MAX)
            seen, want = int(t[0]), int(t[1])
        if want:
            save()
        return seen

    def _start(self) -> None:
        if not self.inplace:
            import torch.distributed as dist

            if os.environ.get(training.ENV_EPOCH) is not None:  # the restart path's epoch
                self.epoch = self.session.epoch

            if self.world > 1 and not dist.is_initialized():
                dist.init_process_group(self.backend,
                                        timeout=dt.timedelta(seconds=self.timeout_s))
            if not self.has_state:
                self._resume()
            self._wrap()
            if self.lr_for is not None:
                for group in self.optimizer.param_groups:
                    group["lr"] = self.lr_for(self.world)
            if self.lifecycle.state is GroupState.NEW:  # steps() again keeps the one group
                self.lifecycle.to(GroupState.TRAINING)
            return
        assert self.control_dir is not None
        self.lifecycle.to(GroupState.FORMING)
        self._watcher = threading.Thread(target=self._watch, name="malletrain-control",
                                         daemon=True)
        self._watcher.start()
        self._beater = threading.Thread(target=self._beat.run, args=(self._stop,),
                                        name="malletrain-heartbeat", daemon=True)
        self._beater.start()
        (self.control_dir / ready_name(self.local_rank, self.local_world)).write_text(
            f"{os.getpid()}\n")
        m = self._channel.await_epoch(0)
        self._apply(m, "start")

    def _leave(self, code: int, why: str) -> None:
        print(f"malletrain: {why}", file=sys.stderr, flush=True)
        self.close(code)
        raise SystemExit(code)

    def steps(self, total: int = 0) -> Iterator[int]:
        """Yield the global step to run next until ``total`` (0: forever), re-forming between
        steps when the membership changes."""
        self._start()
        while total <= 0 or self.step < total:
            if self._old.graveyard:
                self._old.reap()
            if self._old.retiring is not None:
                self._settle_retiring(wait=False)
            self._step_failed = False
            self.step_pauses = []
            if self.inplace and self.world > 1 and self._pending.reason is not None:
                # the heartbeat abandoned this epoch between two steps: no step is started on
                # a group known lost (a sharded model's collectives could not be abandoned)
                self._step_failed = True
            else:
                yield self.step
            if not self._step_failed:
                self.step += 1
                self.has_state = True
                self._checkpoint()
            if not self.inplace:
                continue
            if self.step_pauses and self._step_failed:
                # re-formed inside the step, which was then dropped: the new group's members
                # all start the next step now (as after a re-form here), no agreement first
                continue
            target = self.epoch
            try:
                target = self._agree()
            except Exception as exc:
                if not self._is_peer_failure(exc):
                    raise
                self._step_failed = True
            if self._step_failed:
                self._note_abandoned()
                m = self._channel.await_epoch((self.epoch or 0) + 1)
                self.lifecycle.to(GroupState.REFORMING)
                self._apply(m, "lost")
            elif self.epoch is not None and target is not None and target > self.epoch:
                m = self._channel.await_epoch(target)
                self.lifecycle.to(GroupState.REFORMING)
                self._apply(*self._before_reform(m))

    def _before_reform(self, m: Membership) -> tuple[Membership, str]:
        """The hand-over's turn on the old group before a planned change into ``m``
        (:meth:`~.handover.StateHandover.before_reform`); a member lost meanwhile makes it
        the next epoch's change, as a loss."""
        import torch.distributed as dist

        try:
            self.handover.before_reform(self, dist.group.WORLD, m)
        except Exception as exc:
            if not self._is_peer_failure(exc):
                raise
            self._note_abandoned()
            return self._channel.await_epoch(m.epoch + 1), "lost"
        return m, "planned"

    @contextlib.contextmanager
    def guard(self) -> Iterator[None]:
        """Run one step; a step failed by a lost or abandoned peer is dropped, not raised."""
        try:
            yield
        except Exception as exc:
            if not (self.inplace and self.world > 1 and self._is_peer_failure(exc)):
                raise
            self._step_failed = True
            self._note_abandoned()
            if self.optimizer is not None:
                self.optimizer.zero_grad(set_to_none=True)

    def _stop_threads(self) -> None:
        """Stop this object's threads and wait for them: none may touch a future while the
        interpreter finalizes (see :meth:`~.pending._Pending.close`)."""
        self._stop.set()
        self._beat.wake()
        self._pending.close()
        for thread in (self._watcher, self._beater):
            if thread is not None and thread is not threading.current_thread():
                thread.join(timeout=5.0)

    def close(self, code: int = 0) -> None:
        """Leave the group; a process holding an abandoned collective exits at once."""
        self.lifecycle.to(GroupState.CLOSED)
        self._stop_threads()
        if not self.holds_abandoned:
            with contextlib.suppress(Exception):
                self._teardown()
        self._old.exit_if_held(code)

    def _exit_guard(self) -> None:
        """At interpreter exit: this object's threads stop first (:meth:`_stop_threads`); a
        process holding an abandoned collective would block and die of SIGABRT in its
        destructors, so it leaves at once with its exit code."""
        self._stop_threads()
        # an uncaught exception when the flag was set before the crash hook was installed
        # (guard() sets it first): never report a crash as "training finished"
        crashed = getattr(sys, "last_value", None) is not None
        self._old.exit_if_held(self._old.exit_code or (1 if crashed else 0))
