"""The daemon's side of ``malletrain-run``: launcher check-ins become epoch orders."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from ..wire.api import ApiError
from ..wire.checkin import CheckIn, CheckInError, CheckInReply, LauncherState
from ..wire.orders import VERSION as ORDERS_VERSION
from ..wire.orders import EpochError, OrderKind
from ..wire.reports import Report
from .api import Dispatcher, caller_gone
from .epochs import EpochCoordinator, Order

HOLD_POLL_S = 0.05   # how often a held check-in looks for a new order at the latest


class LauncherService:
    """The daemon's side of ``malletrain-run``: check-ins become orders, reports acknowledge
    checkpoints.

    ``wrap_key(key_hex, uid)`` returns the job's report key inside a munge credential that only
    ``uid`` can decode; ``report_addr`` is the ``HOST:PORT`` where reports are received.
    """

    def __init__(self, coordinator: EpochCoordinator, wrap_key: Callable[[str, int], str],
                 report_addr: str, clock: Callable[[], float],
                 lock: AbstractContextManager[Any] | None = None, admin_uids: frozenset[int] = frozenset({0}),
                 wrap_for_job: Callable[[str, str], str] | None = None,
                 persist: Callable[[], None] | None = None,
                 gone: Callable[[], bool] = caller_gone) -> None:
        self.coordinator = coordinator
        self.gone = gone
        """Inside a check-in: whether its launcher closed the connection (see
        :func:`.api.caller_gone`)."""
        self.persist = persist
        """Saves the coordinator's state; called before an order that moves a launcher to
        another epoch goes out, so that a daemon killed right after (kill -9) knows that epoch
        when it is back. Saved only at the end of the daemon's next cycle, a grow's epoch was
        lost with the daemon: back, it stopped the launchers already in it (a process
        restarted) or re-formed the job without them."""
        self.wrap_key = wrap_key
        self.wrap_for_job = wrap_for_job
        """Launchers authenticated by job secrets: ``wrap_for_job(key_hex, job)`` wraps the
        report key with that job's secret instead of a munge credential."""
        self.report_addr = report_addr
        self._news = threading.Condition()
        """Notified when a check-in changed a job's epoch, checkpoint request or end: the held
        check-ins of the other launchers look again at once instead of at their next poll (a
        joiner's ready check-in starts the epoch that the members' held check-ins carry)."""
        self.clock = clock
        self.lock = lock or threading.Lock()
        self.admin_uids = admin_uids

    def register(self, dispatcher: Dispatcher) -> None:
        dispatcher.register("checkin", self.checkin)

    def checkin(self, uid: int, args: dict[str, Any]) -> dict[str, Any]:
        """``checkin {job, node, epoch, state, rc, addr, ckpt_seen[, inplace, ready, hold_s]}`` →
        ``{order[, key, ...]}``.

        With ``hold_s`` (launchers that rescale in place) the reply is held while the order
        would only say *carry on* — up to ``hold_s`` (at most 10 s) — and sent as soon as the
        coordinator has something new: the launcher's standing request is how orders are
        pushed to it without waiting for its next poll."""
        try:
            req = CheckIn.from_args(args)
        except CheckInError as exc:
            raise ApiError(str(exc)) from None
        job, node, epoch, state = req.job, req.node, req.epoch, req.state
        if req.proto > ORDERS_VERSION:
            raise ApiError(f"this malletraind speaks launcher protocol {ORDERS_VERSION}, the "
                           f"launcher {req.proto}: upgrade malletraind before malletrain-run")
        with self.lock:
            owner = self.coordinator.owner(job)
            if owner is None:
                return CheckInReply(Order(OrderKind.WAIT, reason=f"job {job} is not known to "
                                          "the daemon yet")).to_dict()
            if uid != owner and uid not in self.admin_uids:
                raise ApiError(f"job {job} belongs to uid {owner}, not to uid {uid}")
            key = self.coordinator.key(job).hex()
        deadline = time.monotonic() + req.hold_s
        order: Order | None = None
        while True:
            with self.lock:
                if order is not None and node not in self.coordinator.state(job).launchers:
                    # dropped as lost (its peers found it silent) while held: looking again
                    # would record it anew, as if its launcher (maybe dead) had checked in
                    break
                before = self._news_mark(job)
                order = self.coordinator.checkin(job, node, self.clock(), epoch=epoch,
                                                 state=state, rc=req.rc, addr=req.addr,
                                                 ckpt_seen=req.ckpt_seen, inplace=req.inplace,
                                                 ready=req.ready, lost=req.lost)
                changed = self._news_mark(job) != before
            if changed:
                with self._news:
                    self._news.notify_all()
            running = state is LauncherState.RUNNING
            carry_on = (order.kind is OrderKind.RUN and running and order.epoch == epoch) \
                or (order.kind is OrderKind.WAIT and not running)
            left = deadline - time.monotonic()
            if not carry_on or left <= 0:
                break
            with self._news:
                self._news.wait(min(HOLD_POLL_S, left))
            if running and self.gone():
                # the launcher closed its held check-in: the batch system ended its task
                # (SIGKILL, or SIGTERM after its processes were stopped; PR_SET_PDEATHSIG
                # takes them along), usually well before the batch system says so (a PBS
                # requeue: about a second)
                with self.lock:
                    went = self.coordinator.launcher_gone(job, node, self.clock())
                if went:
                    with self._news:
                        self._news.notify_all()
                break
        if self.persist is not None and order.kind is OrderKind.RUN and order.epoch != epoch:
            self.persist()
        if order.kind is OrderKind.RUN and state is not LauncherState.RUNNING:
            wrapped = self.wrap_key(key, owner) if self.wrap_for_job is None \
                else self.wrap_for_job(key, job)
            return CheckInReply(order, wrapped, self.report_addr).to_dict()
        return CheckInReply(order).to_dict()

    def _news_mark(self, job: str) -> tuple[Any, ...]:
        """What a held check-in's order depends on, for one job (call with the lock held)."""
        try:
            st = self.coordinator.state(job)
        except EpochError:
            return ()
        return (st.epoch.number if st.epoch is not None else None, st.ckpt_request,
                st.finished, st.failed_at)

    def acknowledge(self, verified: list[Report]) -> bool:
        """Feed the checkpoint acknowledgements among verified reports to the coordinator
        (call with the lock held); True when there was one."""
        acked = False
        for report in verified:
            if report.ckpt is not None:
                self.coordinator.acknowledge_checkpoint(report.job, report.epoch, self.clock())
                acked = True
        return acked
