"""Quiet polling: while nothing changes the daemon reads the batch system once per
``idle_poll_interval_s``; a hook or API wake, a poll that saw a change, an action taken, or
work in flight in the backend brings the poll back at every cycle. The live counterpart
(slurmctld's RPC counts) is tests/slurm/test_quiet_poll.py and bench/slurmctld_load.py."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

from malletrain_core.daemon.core import Daemon
from malletrain_core.daemon.store import Store
from malletrain_core.events import Action, Event, Grow, IdleNode, NodesIdle, ProgressReport
from malletrain_core.interfaces import Backend as BackendProtocol


class Engine:
    def __init__(self) -> None:
        self.seen: list[Event] = []
        self.reply: list[Action] = []
        self.node_map: dict[str, str] = {}

    def handle_many(self, events: Sequence[Event]) -> list[Action]:
        self.seen.extend(events)
        out, self.reply = self.reply, []
        return out


class Backend(BackendProtocol):
    name = "fake"

    def __init__(self) -> None:
        self.polls = 0
        self.next: list[Event] = []
        self.in_flight = False

    def poll(self, now: float) -> list[Event]:
        self.polls += 1
        out, self.next = self.next, []
        return out

    def execute(self, actions: Sequence[Action], now: float) -> list[Event]:
        return []

    def busy(self) -> bool:
        return self.in_flight


def make(tmp_path: Path, idle_s: float | None) -> tuple[Daemon, Engine, Backend]:
    engine, backend = Engine(), Backend()
    d = Daemon(engine, backend, Store(tmp_path / "state"), poll_interval_s=1.0,
               idle_poll_interval_s=idle_s, clock=time.time)
    return d, engine, backend


def test_quiet_cycles_skip_the_poll_until_something_may_have_changed(tmp_path: Path) -> None:
    d, engine, backend = make(tmp_path, 60.0)
    d.cycle()
    assert backend.polls == 1  # the first cycle always polls
    for _ in range(5):
        d.cycle()
    assert backend.polls == 1  # nothing changed: no poll
    d.wake()  # a hook datagram or an API wake
    d.cycle()
    d.cycle()
    assert backend.polls == 2
    backend.next = [NodesIdle(1.0, (IdleNode("n1", None),))]
    d.wake()
    d.cycle()  # the poll sees a change ...
    d.cycle()  # ... so the next cycle polls as well
    assert backend.polls == 4
    d.cycle()
    assert backend.polls == 4  # and then nothing changed
    backend.in_flight = True  # a grow not yet seen running
    d.cycle()
    d.cycle()
    assert backend.polls == 6
    backend.in_flight = False
    engine.reply = [Grow("7", ("n1",), None)]  # an action taken without a poll
    d.submit([ProgressReport(3.0, job_id="7", samples=10.0, world_size=1)])
    d.cycle()
    d.cycle()
    assert backend.polls == 7


def test_reports_reach_the_engine_without_a_poll(tmp_path: Path) -> None:
    d, engine, backend = make(tmp_path, 60.0)
    d.cycle()
    report = ProgressReport(2.0, job_id="7", samples=100.0, world_size=1)
    d.submit([report])
    d.cycle()
    assert backend.polls == 1 and report in engine.seen


def test_the_idle_interval_still_polls(tmp_path: Path) -> None:
    d, _, backend = make(tmp_path, 1.05)
    d.cycle()
    d.cycle()
    assert backend.polls == 1
    time.sleep(1.1)
    d.cycle()
    assert backend.polls == 2


def test_off_by_default_and_when_not_longer_than_the_poll(tmp_path: Path) -> None:
    for idle in (None, 1.0, 0.5):
        d, _, backend = make(tmp_path / str(idle), idle)
        for _ in range(3):
            d.cycle()
        assert backend.polls == 3


def test_a_wake_after_a_quiet_spell_runs_the_cycle_at_once_a_burst_is_paced(
        tmp_path: Path) -> None:
    """The first hook datagram after a quiet spell brings the cycle within wake_lead_s (a
    node that fell idle is granted at once); wakes right after a cycle wait for wake_delay_s
    after it, so a burst of datagrams costs one cycle per wake_delay_s."""
    engine, backend = Engine(), Backend()
    d = Daemon(engine, backend, Store(tmp_path / "state"), poll_interval_s=60.0,
               wake_delay_s=0.5, wake_lead_s=0.01)
    d.run_once(timeout_s=0.0)  # the first cycle (due at once)
    assert backend.polls == 1
    d.wake()                   # right after that cycle: paced
    assert d._next_cycle >= d._last_cycle_end + 0.5 - 1e-6
    d._last_cycle_end -= 10.0  # ten seconds of quiet since the cycle
    d._next_cycle = time.monotonic() + 60.0
    t = time.monotonic()
    d.wake()
    assert d._next_cycle - t <= 0.01 + 1e-3
    d.run_once(timeout_s=1.0)
    assert backend.polls == 2 and time.monotonic() - t < 0.5


def test_a_hook_whose_change_the_poll_does_not_show_yet_is_looked_at_again_soon(
        tmp_path: Path) -> None:
    """Slurm runs a preempted task's EpilogSlurmctld while the task is still completing: the
    poll right after the datagram may show nothing new. The daemon then polls again
    wake_delay_s later, not a whole poll interval later (once: a quiet hook costs one poll)."""
    engine, backend = Engine(), Backend()
    d = Daemon(engine, backend, Store(tmp_path / "state"), poll_interval_s=60.0,
               wake_delay_s=0.2, wake_lead_s=0.0)
    d.run_once(timeout_s=0.0)
    assert backend.polls == 1
    d._last_cycle_end -= 10.0
    d.hook_wake()                       # the datagram: its cycle sees nothing new
    d.run_once(timeout_s=1.0)
    assert backend.polls == 2
    assert d._next_cycle - d._last_cycle_end <= 0.2 + 1e-6
    backend.next = [NodesIdle(1.0, (IdleNode("n1", None),))]
    engine.reply = [Grow("7", ("n1",), None)]
    t = time.monotonic()
    d.run_once(timeout_s=1.0)           # ... the next poll does, soon
    assert backend.polls == 3 and time.monotonic() - t < 0.5
    d.run_once(timeout_s=0.3)           # that cycle acted and no hook came: no third look
    assert backend.polls == 3
