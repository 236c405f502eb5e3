"""A cycle's follow-up rounds are bounded, and what the last round's actions caused is kept
for the next cycle, never dropped (quick: a stand-in engine and backend).

Seen on the local cluster: three grows held back in one cycle (a production job had just been
submitted); the third round's WorkerStopped and NodesReclaimed were dropped, so the engine kept
two nodes for a job whose tasks never started, and waited for them for good."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from malletrain_core.daemon.core import Daemon
from malletrain_core.daemon.store import Store
from malletrain_core.events import Action, Event, Grow, NodesReclaimed, WorkerStopped
from malletrain_core.interfaces import Backend as BackendProtocol


class Engine:
    node_map: dict[str, str] = {}

    def __init__(self) -> None:
        self.seen: list[Event] = []
        self.n = 0

    def handle_many(self, events: Sequence[Event]) -> list[Action]:
        self.seen.extend(events)
        self.n += 1
        return [Grow("7", (f"n{self.n}",), None)]  # plans again after every failed grow


class Backend(BackendProtocol):
    name = "fake"

    def poll(self, now: float) -> list[Event]:
        return [NodesReclaimed(now, ("n0",))]

    def execute(self, actions: Sequence[Action], now: float) -> list[Event]:
        out: list[Event] = []
        for a in actions:
            assert isinstance(a, Grow)
            out += [WorkerStopped(now, a.job_id, n) for n in a.nodes]
            out.append(NodesReclaimed(now, a.nodes))
        return out


def test_the_last_rounds_events_go_to_the_next_cycle(tmp_path: Path) -> None:
    engine = Engine()
    d = Daemon(engine, Backend(), Store(tmp_path / "state"), clock=lambda: 10.0)
    d.cycle()
    assert engine.n == 3  # bounded: three rounds in one cycle
    assert d.pending == [WorkerStopped(10.0, "7", "n3"), NodesReclaimed(10.0, ("n3",))]
    d.cycle()
    assert WorkerStopped(10.0, "7", "n3") in engine.seen
