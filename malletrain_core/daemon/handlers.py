"""What ``malletraind`` does when an input arrives: one named object instead of closures.

:class:`DaemonHandlers` holds the pieces a handler needs (the daemon, the epoch coordinator,
the epoch bridge, the hook listener and, once the launchers' port is open, the launcher service
and the report listener) and has one method per input: a hook datagram, the administrator's
drain and resume, a launcher's check-in, verified progress reports, and the two look-ups the
report listener and the job-secret verifier make. :func:`~malletrain_core.daemon.main.build`
makes one and registers its methods; every method takes the daemon's lock itself.
"""

from __future__ import annotations

from typing import Any

from ..events import Event
from ..wire import hooks as protocol
from .bridge import EpochBridge
from .core import Daemon
from .epochs import EpochCoordinator
from .intake import HookListener, ReportListener, to_event
from .launchers import LauncherService


class DaemonHandlers:
    """The daemon's input handlers (see the module docstring)."""

    def __init__(self, daemon: Daemon, coordinator: EpochCoordinator, bridge: EpochBridge,
                 hooks: HookListener) -> None:
        self.daemon = daemon
        self.coordinator = coordinator
        self.bridge = bridge
        self.hooks = hooks
        self.launchers: LauncherService | None = None
        self.reports: ReportListener | None = None

    # -- hook datagrams ------------------------------------------------------------------
    def other_submits(self) -> int:
        """Hook datagrams so far that announced another job's submission (the backend's
        :meth:`~malletrain_core.interfaces.Backend.watch_submits` reads it)."""
        return self.hooks.other_submits

    def on_hook(self) -> None:
        """A hint: the woken poll reads the truth. Another job's submission does not wake (a
        site submits many): the backend holds back grows after it (``watch_submits``) and
        holds again, at once, the tasks it released that have not started yet."""
        messages = self.hooks.drain()
        if any(not isinstance(m, protocol.JobSubmit) or m.elastic for m in messages):
            self.daemon.hook_wake()
        others = [m for m in messages if isinstance(m, protocol.JobSubmit) and not m.elastic]
        if others:
            # A job confined to the nodes it names (-w) can only take those.
            only = () if any(not m.only_nodes for m in others) else \
                tuple(sorted({n for m in others for n in m.only_nodes}))
            with self.daemon.lock:
                self.bridge.other_submitted(only)

    # -- the administrator's switch --------------------------------------------------------
    def drain(self, uid: int, args: dict[str, Any]) -> dict[str, Any]:
        """``malletrain admin drain`` (API op ``drain``)."""
        return self._switch(True)

    def resume(self, uid: int, args: dict[str, Any]) -> dict[str, Any]:
        """``malletrain admin resume`` (API op ``resume``)."""
        return self._switch(False)

    def _switch(self, on: bool) -> dict[str, Any]:
        daemon = self.daemon
        assert daemon.drain is not None
        with daemon.lock:
            changed = daemon.drain.set(on, daemon.clock())
            state = daemon.drain.state()
        daemon.notify()
        return {**state, "changed": changed}

    # -- launchers -----------------------------------------------------------------------
    def owner_of(self, job: str) -> int | None:
        """The uid that owns ``job`` (the job-secret verifier's look-up)."""
        with self.daemon.lock:
            return self.coordinator.owner(job)

    def key_for(self, job: str) -> bytes | None:
        """The report key of a live job (the report listener's look-up)."""
        with self.daemon.lock:
            return self.coordinator.key(job) if self.coordinator.owner(job) is not None \
                else None

    def serve_launchers(self, launchers: LauncherService, reports: ReportListener) -> None:
        """The launchers' port is open: check-ins and reports are handled from now on."""
        self.launchers = launchers
        self.reports = reports

    def checkin(self, uid: int, args: dict[str, Any]) -> Any:
        """A launcher's check-in (API op ``checkin``); a shrink it frees goes at once."""
        assert self.launchers is not None
        reply = self.launchers.checkin(uid, args)
        with self.daemon.lock:
            if self.bridge.deferred and self.bridge.releasable():
                self.daemon.notify()  # a shrink may go now: do not wait for the next poll
        return reply

    def on_reports(self) -> list[Event]:
        """Verified progress reports: acknowledged to the coordinator, events for the engine."""
        assert self.launchers is not None and self.reports is not None
        with self.daemon.lock:
            verified = self.reports.drain()
            acked = self.launchers.acknowledge(verified)
            out: list[Event] = [to_event(report) for report in verified]
            if acked and self.bridge.deferred and self.bridge.releasable():
                self.daemon.wake()
        return out
