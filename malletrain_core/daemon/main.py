"""``malletraind``: build the daemon from its configuration and run it."""

from __future__ import annotations

import argparse
import logging
import os
import pwd
import signal
import sys
from collections.abc import Sequence

from .. import __version__, protocol
from ..backends.base import Backend
from ..config import Config, load
from ..engine import Engine, EngineConfig
from ..errors import MalleTrainError
from ..model import Constraints, Objective
from ..runner import CommandRunner
from .core import Daemon
from .intake import HookListener
from .store import Store

log = logging.getLogger("malletraind")


def engine_config(config: Config) -> EngineConfig:
    a, p = config.allocator, config.profiler
    return EngineConfig(
        lookahead_s=a.lookahead_s, objective=Objective(a.objective),
        max_running_jobs=a.max_running_jobs or None,
        constraints=Constraints(user_max_nodes=dict(a.user_max_nodes), min_share=a.min_share),
        solver=a.solver, profiling=p.enabled, profile_window_s=p.window_s,
        default_scale_up_s=p.default_scale_up_s, default_scale_down_s=p.default_scale_down_s,
        default_time_limit_s=config.slurm.default_time_limit_s)


def _runner(bin_dir: str, timeout_s: float) -> CommandRunner:
    env = dict(os.environ)
    if bin_dir:
        env["PATH"] = f"{bin_dir}:{env.get('PATH', '')}"
    # Absolute times in Slurm's output: the backfill plan's hole ends depend on it.
    env.pop("SLURM_TIME_FORMAT", None)
    return CommandRunner(timeout_s=timeout_s, env=env)


def make_backend(config: Config) -> Backend:
    if config.daemon.batch_system == "pbs":
        from ..backends.pbs import PbsBackend
        return PbsBackend(_runner(config.pbs.bin_dir, config.pbs.command_timeout_s),
                          queue=config.pbs.queue)
    from ..backends.slurm import SlurmBackend
    return SlurmBackend(_runner(config.slurm.bin_dir, config.slurm.command_timeout_s),
                        partition=config.slurm.partition,
                        default_time_limit_s=config.slurm.default_time_limit_s)


def admin_uids(names: Sequence[str]) -> set[int]:
    uids = {0}
    for name in names:
        try:
            uids.add(pwd.getpwnam(name).pw_uid)
        except KeyError:
            log.warning("admin user %r does not exist on this host; ignored", name)
    return uids


def build(config: Config) -> tuple[Daemon, list[HookListener]]:
    """The daemon and its listeners, state recovered from the journal."""
    store = Store(config.daemon.state_dir)
    engine = Engine(engine_config(config))
    daemon = Daemon(engine, make_backend(config), store,
                    poll_interval_s=config.daemon.poll_interval_s,
                    tick_interval_s=max(1.0, min(config.profiler.window_s / 4, 10.0)))
    daemon.recover()
    hooks = HookListener(config.daemon.hook_socket, admin_uids(config.daemon.admin_users),
                         decode=protocol.decode)

    def on_hook() -> None:
        hooks.drain()  # a hint: the woken poll reads the truth

    daemon.watch(hooks, on_hook, wake=True)
    return daemon, [hooks]


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
        logging.basicConfig(level=config.daemon.log_level.upper(),
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        daemon, listeners = build(config)
    except MalleTrainError as err:
        if args.debug:
            raise
        print(f"malletraind: error: {err}", file=sys.stderr)
        return err.exit_code
    signal.signal(signal.SIGTERM, daemon.stop)
    signal.signal(signal.SIGINT, daemon.stop)
    log.info("malletraind %s started: %s backend, state in %s", __version__,
             config.daemon.batch_system, config.daemon.state_dir)
    try:
        if args.once:
            daemon.cycle()
        else:
            daemon.run()
    except MalleTrainError as err:
        if args.debug:
            raise
        print(f"malletraind: error: {err}", file=sys.stderr)
        return err.exit_code
    finally:
        for listener in listeners:
            listener.close()
        daemon.store.close()
    log.info("malletraind stopped")
    return 0
