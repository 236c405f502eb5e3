"""The seams the daemon relies on: what it holds as an engine (:class:`Planner`) and as a
backend (:class:`Backend`) is declared, and the daemon asks for nothing else.

mypy checks the daemon against both protocols; these tests check, at run time, that every
class the daemon is given declares each member, and that ``daemon/`` does not probe an engine
or a backend for a member with ``getattr``/``hasattr``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from malletrain_core.backends.base import TaskBackend
from malletrain_core.backends.registry import BATCH_SYSTEMS
from malletrain_core.daemon.bridge import EpochBridge
from malletrain_core.engine import Engine, EngineConfig, Router
from malletrain_core.engine.planner import Planner
from malletrain_core.interfaces import Backend
from malletrain_core.sim.backend import SimBackend
from malletrain_core.sim.churn import ChurnBackend

DAEMON = Path(__file__).resolve().parents[1] / "malletrain_core" / "daemon"


def members(protocol: type) -> set[str]:
    own = set(vars(protocol)) | set(getattr(protocol, "__annotations__", {}))
    return {m for m in own if not m.startswith("_")}


def test_the_planner_protocol_is_what_an_engine_and_a_router_offer():
    engine = Engine(EngineConfig())
    router = Router({"a": engine}, node_owner=lambda n: "a", job_owner=lambda r: "a")
    wanted = members(Planner)
    assert {"name", "hole_ends", "trainer_of_job", "trainer_of_node", "handle_many"} <= wanted
    for planner in (engine, router):
        missing = sorted(m for m in wanted if not hasattr(planner, m))
        assert missing == [], f"{type(planner).__name__} lacks {missing}"
    assert engine.trainer_of_job("1") == "" and router.hole_ends == {}


@pytest.mark.parametrize("cls", [TaskBackend, SimBackend, ChurnBackend, EpochBridge])
def test_every_backend_the_daemon_drives_declares_the_protocol(cls):
    assert Backend in cls.__mro__  # declared, so it inherits the defaults
    for name in ("busy", "grant_starts", "watch_submits", "other_submitted", "wake_lead_s"):
        assert hasattr(cls, name)


def test_every_registered_batch_system_builds_a_backend_of_the_protocol():
    from malletrain_core.config import Config, DaemonConfig

    for name, entry in BATCH_SYSTEMS.items():
        try:
            backend = entry.backend(Config(daemon=DaemonConfig(batch_system=name)))
        except Exception as exc:  # noqa: BLE001 - a system that needs its binaries
            pytest.skip(f"{name}: {exc}")
        assert Backend in type(backend).__mro__, name


def probes(source: str) -> list[str]:
    """``getattr``/``hasattr`` calls whose object names an engine or a backend."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                node.func.id in ("getattr", "hasattr") and node.args:
            target = ast.unparse(node.args[0])
            if any(word in target for word in ("engine", "backend", "bridge", "router")):
                found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_daemon_does_not_probe_an_engine_or_a_backend():
    bad = {p.name: hits for p in sorted(DAEMON.glob("*.py"))
           if (hits := probes(p.read_text()))}
    assert bad == {}


def test_the_probe_finder_sees_a_probe():
    assert probes('x = getattr(self.backend, "busy", None)\n') != []
    assert probes('x = getattr(action, "nodes", ())\n') == []
