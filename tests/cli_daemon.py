"""A real daemon (real Engine, journal and API server) over a scripted in-memory backend, for
the tests of the read-only API, the CLI and the metrics endpoint."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from malletrain_core.daemon.api import Dispatcher, UnixApiServer
from malletrain_core.daemon.core import Daemon
from malletrain_core.daemon.service import StatusService
from malletrain_core.daemon.store import Store
from malletrain_core.engine import Engine, EngineConfig
from malletrain_core.events import (
    Action,
    Event,
    IdleNode,
    JobRequest,
    JobSubmitted,
    NodesIdle,
    NodesReclaimed,
    ProgressReport,
)
from malletrain_core.interfaces import Backend
from malletrain_core.model import Curve

T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z


class ScriptedBackend(Backend):
    """Hands out queued events at the next poll; accepts every action."""

    name = "scripted"

    def __init__(self) -> None:
        self.queue: list[Event] = []
        self.executed: list[Action] = []

    def poll(self, now: float) -> list[Event]:
        events, self.queue = self.queue, []
        return events

    def execute(self, actions: Sequence[Action], now: float) -> list[Event]:
        self.executed.extend(actions)
        return []


@dataclass
class Clock:
    now: float = T0

    def __call__(self) -> float:
        return self.now


def build(state_dir: Path) -> tuple[Daemon, ScriptedBackend, Clock]:
    """The daemon after a fixed story: eight idle nodes (four with holes ending in 5 to 8
    hours), jobs 101 and 102 running at their maximum with user curves, one node free, 103
    queued (cap of two), 101 measured at 4 nodes."""
    clock = Clock()
    backend = ScriptedBackend()
    engine = Engine(EngineConfig(max_running_jobs=2, profile_window_s=20.0))
    daemon = Daemon(engine, backend, Store(state_dir), clock=clock, tick_interval_s=1e9)
    idle = [IdleNode(f"n0{i}", None, None) for i in range(1, 5)]
    idle += [IdleNode(f"n0{i}", T0 + 3600.0 * i, None) for i in (5, 6, 7, 8)]
    backend.queue = [
        NodesIdle(T0, tuple(idle)),
        JobSubmitted(T0, JobRequest("101", 1, 4, "alice", "resnet50",
                                    Curve.of([1, 4], [100.0, 400.0]))),
        JobSubmitted(T0, JobRequest("102", 2, 3, "bob", "bert",
                                    Curve.of([2, 3], [150.0, 210.0]))),
        JobSubmitted(T0, JobRequest("103", 1, 2, "carol", "")),
    ]
    daemon.cycle()
    size = len(engine.jobs["101"].nodes)
    for i, t in enumerate(range(10, 60, 10)):
        backend.queue.append(ProgressReport(T0 + t, "101", 390.0 * 10 * i, size))
    clock.now = T0 + 60.0
    daemon.cycle()
    return daemon, backend, clock


def reclaim(daemon: Daemon, backend: ScriptedBackend, clock: Clock, *names: str) -> None:
    """The batch system takes ``names`` back; one more cycle."""
    clock.now += 30.0
    backend.queue.append(NodesReclaimed(clock.now, names))
    daemon.cycle()


@contextlib.contextmanager
def serving(daemon: Daemon, socket_path: Path) -> Iterator[UnixApiServer]:
    """The daemon's read-only API on a unix socket, for as long as the block runs."""
    dispatcher = Dispatcher()
    StatusService(daemon).register(dispatcher)
    server = UnixApiServer(str(socket_path), dispatcher)
    server.start()
    try:
        yield server
    finally:
        server.close()


def config_file(tmp_path: Path, socket_path: Path, api_port: int = 0) -> Path:
    path = tmp_path / "malletrain.toml"
    path.write_text(f'[daemon]\napi_socket = "{socket_path}"\napi_port = {api_port}\n')
    return path
