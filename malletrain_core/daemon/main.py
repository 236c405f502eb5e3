"""``malletraind``: build the daemon from its configuration and run it."""

from __future__ import annotations

import argparse
import json
import logging
import pwd
import signal
import socket
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from .. import __version__, logs
from ..backends import registry as backends
from ..backends.base import Backend
from ..config import Config, TrainerConfig, load
from ..engine import Engine, EngineConfig
from ..engine import build as engine_build
from ..engine.router import Router
from ..errors import MalleTrainError
from ..jobsecret import JobSecretVerifier, read_key_file
from ..munge import Munge
from ..wire import hooks as protocol
from ..wire.orders import EpochError
from .api import Dispatcher, TcpApiServer, UnixApiServer
from .bridge import EpochBridge
from .core import Daemon
from .drain import Drain
from .epochs import EpochCoordinator
from .handlers import DaemonHandlers
from .intake import HookListener, ReportListener
from .launchers import LauncherService
from .service import attach
from .store import Store, open_checked

log = logging.getLogger("malletraind")

EPOCHS_KEY = "epochs"


class Closable(Protocol):
    """What :meth:`RunningDaemon.close` releases."""

    def close(self) -> None: ...


def engine_config(config: Config, trainer: TrainerConfig | None = None) -> EngineConfig:
    """The engine settings of ``trainer`` (else of the whole file), with the time limit the
    configured batch system gives a grow onto a hole of unknown end."""
    return engine_build.engine_config(config, trainer, **_daemon_overrides(config))


def make_engine(config: Config) -> Engine | Router:
    """The daemon's engine, or router over one engine per ``[[trainer]]``
    (:func:`~malletrain_core.engine.build.make_engine`)."""
    return engine_build.make_engine(config, **_daemon_overrides(config))


def _daemon_overrides(config: Config) -> dict[str, Any]:
    limit = backends.system(config).default_time_limit_s(config)
    return {} if limit is None else {"default_time_limit_s": limit}


def make_backend(config: Config) -> Backend:
    return backends.build(config)


def admin_uids(names: Sequence[str]) -> set[int]:
    uids = {0}
    for name in names:
        try:
            uids.add(pwd.getpwnam(name).pw_uid)
        except KeyError:
            log.warning("admin user %r does not exist on this host; ignored", name)
    return uids


def make_coordinator(config: Config, store: Store) -> EpochCoordinator:
    """The epoch coordinator, with the running epochs of a previous run when there are any."""
    saved = store.get(EPOCHS_KEY)
    if saved:
        try:
            coordinator = EpochCoordinator.from_dict(saved)
        except (EpochError, KeyError, TypeError, ValueError) as exc:
            log.warning("saved epoch state is unusable (%s); launchers re-register", exc)
        else:
            log.info("recovered the epochs of %d jobs", len(coordinator.jobs()))
            return coordinator
    e = config.epochs
    return EpochCoordinator((e.port_min, e.port_max), checkpoint_timeout_s=e.checkpoint_timeout_s,
                            join_timeout_s=e.join_timeout_s, join_wait_s=e.join_wait_s,
                            launcher_timeout_s=e.launcher_timeout_s, max_failures=e.max_failures)


class RunningDaemon:
    """The running ``malletraind``: the daemon's cycle (:class:`~.core.Daemon`), its epoch
    coordinator and bridge, the API dispatcher and everything to close; :meth:`close`
    releases it all. (The read-only API ops are :class:`~.service.StatusService`; the input
    handlers :class:`~.handlers.DaemonHandlers`.)"""

    def __init__(self, daemon: Daemon, coordinator: EpochCoordinator, bridge: EpochBridge,
                 dispatcher: Dispatcher) -> None:
        self.daemon = daemon
        self.coordinator = coordinator
        self.bridge = bridge
        self.dispatcher = dispatcher
        self.closables: list[Closable] = []
        self._saved = ""
        self._logged = {job: max((h["epoch"] for h in coordinator.state(job).history),
                                 default=-1) for job in coordinator.jobs()}

    def save(self, locked: bool = False) -> None:
        """Persist the coordinator (report keys, running epochs) when it changed, and log
        the epochs that started since (their path: in place or from disk); ``locked``: hold
        the daemon's lock throughout (a check-in's save beside the cycle's)."""
        if locked:
            with self.daemon.lock:
                self.save()
            return
        with self.daemon.lock:
            state = self.coordinator.to_dict()
        for job, st in state["jobs"].items():
            for h in st.get("history", ()):
                if h["epoch"] > self._logged.get(job, -1):
                    self._logged[job] = h["epoch"]
                    log.info("job %s: epoch %d, world %d, path %s%s", job, h["epoch"],
                             h["world"], h["path"], " (abandon)" if h["abandon"] else "")
        text = json.dumps(state, sort_keys=True)
        if text != self._saved:
            self.daemon.store.put(EPOCHS_KEY, state)
            self._saved = text

    def close(self) -> None:
        listeners = [item for item in self.closables
                     if isinstance(item, (HookListener, ReportListener))]
        for item in reversed(self.closables):
            try:
                item.close()
            except Exception:  # noqa: BLE001 - closing must go on
                log.exception("closing %s failed", type(item).__name__)
        self.closables.clear()
        for item in listeners:  # closed: the counts are final (a restart starts from zero)
            what = "reports" if isinstance(item, ReportListener) else "hook datagrams"
            log.info("final intake counts: %s received %d, dropped %s", what, item.received,
                     json.dumps(dict(sorted(item.dropped.items())), separators=(",", ":")))


def build(config: Config) -> RunningDaemon:
    """The daemon, its listeners and API servers, state recovered from the store (a corrupt
    one is moved aside and the daemon starts from an empty one: :func:`.store.open_checked`)."""
    return open_checked(config.daemon.state_dir, lambda store: _build(config, store))


def _build(config: Config, store: Store) -> RunningDaemon:
    d = config.daemon
    coordinator = make_coordinator(config, store)
    engine = make_engine(config)
    backend = make_backend(config)
    bridge = EpochBridge(backend, coordinator)
    daemon = Daemon(engine, bridge, store, poll_interval_s=d.poll_interval_s,
                    idle_poll_interval_s=d.idle_poll_interval_s,
                    tick_interval_s=max(1.0, min(config.profiler.window_s / 4, 10.0)),
                    journal_max_events=d.journal_max_events)
    admins = admin_uids(d.admin_users)
    running = RunningDaemon(daemon, coordinator, bridge, Dispatcher(admin_uids=admins))
    try:
        _wire(config, running, admins)
        daemon.recover()
    except BaseException:
        running.close()
        store.close()
        raise
    return running


def _wire(config: Config, running: RunningDaemon, admins: set[int]) -> None:
    d, daemon, dispatcher = config.daemon, running.daemon, running.dispatcher
    running.closables.append(daemon)
    hooks = HookListener(d.hook_socket, admins, decode=protocol.decode,
                         group=d.hook_group or None)
    running.closables.append(hooks)
    handlers = DaemonHandlers(daemon, running.coordinator, running.bridge, hooks)
    running.bridge.watch_submits(handlers.other_submits)
    daemon.watch(hooks, handlers.on_hook)
    daemon.after_cycle.append(running.save)
    daemon.drain = Drain(daemon.store)
    if daemon.drain.drained:
        log.warning("MalleTrain is drained (malletrain admin drain): no node is given to any "
                    "job until malletrain admin resume")
    dispatcher.register("drain", handlers.drain, admin=True)
    dispatcher.register("resume", handlers.resume, admin=True)
    servers: list[UnixApiServer | TcpApiServer] = []
    metrics = attach(daemon, dispatcher, d.metrics_port)
    if metrics is not None:
        running.closables.append(metrics)
    if d.api_socket:
        Path(d.api_socket).parent.mkdir(parents=True, exist_ok=True, mode=0o755)
        servers.append(UnixApiServer(d.api_socket, dispatcher, group=d.api_group or None))
        running.closables.append(servers[-1])
    if not d.api_port:
        log.warning("daemon.api_port is 0: launchers cannot reach the daemon; elastic jobs "
                    "will wait for orders")
    else:
        munge = Munge(config.munge.socket, ttl_s=config.munge.credential_ttl_s)
        job_secret = None
        key_file = backends.system(config).job_key_file(config)
        if key_file:
            job_secret = JobSecretVerifier(read_key_file(key_file), handlers.owner_of,
                                           ttl_s=config.munge.credential_ttl_s)
        reports_in = ReportListener(d.api_host, d.api_port, handlers.key_for)
        running.closables.append(reports_in)
        host = d.advertise_host or socket.gethostname()
        launchers = LauncherService(
            running.coordinator, lambda key, uid: munge.encode(key, restrict_uid=uid),
            f"{host}:{reports_in.address[1]}", time.time, lock=daemon.lock,
            admin_uids=frozenset(admins),
            wrap_for_job=job_secret.wrap if job_secret is not None else None,
            persist=lambda: running.save(locked=True))
        handlers.serve_launchers(launchers, reports_in)
        dispatcher.register("checkin", handlers.checkin)
        daemon.watch(reports_in, handlers.on_reports)
        servers.append(TcpApiServer((d.api_host, d.api_port), dispatcher, munge,
                                    job_secret=job_secret))
        running.closables.append(servers[-1])
    for server in servers:  # closed with the rest if anything above failed
        server.start()


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="malletraind", description=(
        "The MalleTrain daemon: harvests idle batch-system nodes for elastic training."))
    parser.add_argument("--version", action="version", version=f"malletraind {__version__}")
    parser.add_argument("--config", help="TOML file (default: $MALLETRAIN_CONFIG or "
                        "/etc/malletrain/malletrain.toml)")
    parser.add_argument("--state-dir", help="override daemon.state_dir")
    parser.add_argument("--hook-socket", help="override daemon.hook_socket")
    parser.add_argument("--poll-interval-s", type=float, help="override daemon.poll_interval_s")
    parser.add_argument("--log-level", help="override daemon.log_level")
    parser.add_argument("--once", action="store_true", help="run one cycle and exit")
    parser.add_argument("--debug", action="store_true", help="tracebacks on errors")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    flags = {k: v for k, v in (("state_dir", args.state_dir), ("hook_socket", args.hook_socket),
                               ("poll_interval_s", args.poll_interval_s),
                               ("log_level", args.log_level)) if v is not None}
    try:
        config = load(args.config, overrides={"daemon": flags} if flags else None)
        logs.configure(config.daemon.log_level)
        running = build(config)
    except MalleTrainError as err:
        if args.debug:
            raise
        print(f"malletraind: error: {err}", file=sys.stderr)
        return err.exit_code
    daemon = running.daemon
    # The intake threads must get the interpreter within a few ms while a cycle computes:
    # the kernel queues only net.unix.max_dgram_qlen hook datagrams meanwhile.
    sys.setswitchinterval(0.001)
    signal.signal(signal.SIGTERM, daemon.stop)
    signal.signal(signal.SIGINT, daemon.stop)
    log.info("malletraind %s started: %s backend, state in %s", __version__,
             config.daemon.batch_system, config.daemon.state_dir)
    code = 0
    try:
        try:
            if args.once:
                daemon.cycle()
            else:
                daemon.run()
        except MalleTrainError as err:
            if args.debug:
                raise
            print(f"malletraind: error: {err}", file=sys.stderr)
            code = err.exit_code
    finally:
        try:
            running.save()
        except MalleTrainError as err:
            # said once: the full disk that stopped the cycle fails this last write too (it
            # raised out of here, a second error line and a traceback: CI, a full disk)
            if code == 0:
                if args.debug:
                    raise
                print(f"malletraind: error: {err}", file=sys.stderr)
                code = err.exit_code
        running.close()
        daemon.store.close()
    if code:
        return code
    log.info("malletraind stopped")
    return 0
