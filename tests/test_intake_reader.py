"""The intake reader threads: the kernel's datagram queue never fills while the daemon is busy.

Real unix datagram and UDP sockets throughout. The kernel queues only
``net.unix.max_dgram_qlen`` datagrams on a unix socket (10 on many hosts), so without a
reader a flood sent while a cycle runs is refused at the sender.
"""

from __future__ import annotations

import os
import selectors
import socket
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from malletrain_core.daemon.core import Daemon
from malletrain_core.daemon.intake import (
    OVERFLOW,
    READER_NICE,
    HookListener,
    ReportListener,
    to_event,
)
from malletrain_core.daemon.store import Store
from malletrain_core.events import Action, Event
from malletrain_core.interfaces import Backend
from malletrain_core.wire import hooks as protocol
from malletrain_core.wire import reports

KEY = b"k" * 32
FLOOD = 5000


def flood_unix(path: Path, n: int, timeout_s: float = 0.5) -> int:
    """Send ``n`` hook datagrams as fast as possible with a short-timeout sender; the number
    the kernel refused (timeout, EAGAIN or ENOBUFS)."""
    refused = 0
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.settimeout(timeout_s)
        for i in range(n):
            data = protocol.encode(protocol.JobEnd(src="test", t=float(i), job=str(i)))
            try:
                s.sendto(data, str(path))
            except (TimeoutError, BlockingIOError, OSError):
                refused += 1
    return refused


def drain_until(listener: HookListener | ReportListener, n: int, timeout_s: float = 10.0
                ) -> list:
    out: list = []
    deadline = time.monotonic() + timeout_s
    while len(out) < n and time.monotonic() < deadline:
        out += listener.drain()
        time.sleep(0.01)
    return out


def readable(fd: int, timeout_s: float) -> bool:
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        return bool(sel.select(timeout_s))


def test_flood_while_the_consumer_is_blocked_loses_nothing(tmp_path: Path) -> None:
    hook = HookListener(tmp_path / "hook.sock", {os.getuid()}, decode=protocol.decode)
    try:
        sender = threading.Thread(target=lambda: result.append(flood_unix(hook.path, FLOOD)))
        result: list[int] = []
        sender.start()
        time.sleep(1.0)  # the consumer (a daemon cycle) is busy: nobody drains
        sender.join(30)
        assert result == [0], "the kernel refused datagrams"
        got = drain_until(hook, FLOOD)
        assert [m.job for m in got] == [str(i) for i in range(FLOOD)]  # type: ignore[attr-defined]
        assert hook.received == FLOOD and not hook.dropped
    finally:
        hook.close()


def test_the_queue_bound_holds_and_overflow_is_counted(tmp_path: Path) -> None:
    bound = 100
    hook = HookListener(tmp_path / "hook.sock", {os.getuid()}, max_queued=bound)
    try:
        assert flood_unix(hook.path, 1000) == 0
        deadline = time.monotonic() + 10
        while hook.dropped[OVERFLOW] < 1000 - bound and time.monotonic() < deadline:
            assert len(hook.queue) <= bound
            time.sleep(0.01)
        assert len(hook.queue) == bound
        assert hook.dropped == {OVERFLOW: 1000 - bound}
        got = hook.drain()
        assert len(got) == bound and hook.received == bound
        assert got[0] == protocol.encode(protocol.JobEnd(src="test", t=0.0, job="0"))
        # Room again: the next datagram is queued, not dropped.
        assert flood_unix(hook.path, 1) == 0
        assert len(drain_until(hook, 1)) == 1 and hook.dropped[OVERFLOW] == 1000 - bound
    finally:
        hook.close()


def test_fileno_is_readable_exactly_while_datagrams_wait(tmp_path: Path) -> None:
    hook = HookListener(tmp_path / "hook.sock", {os.getuid()}, decode=protocol.decode)
    try:
        assert not readable(hook.fileno(), 0.1)
        flood_unix(hook.path, 3)
        assert readable(hook.fileno(), 2.0)
        assert len(drain_until(hook, 3)) == 3
        assert not readable(hook.fileno(), 0.1)
    finally:
        hook.close()


def test_counters_read_from_another_thread_during_a_flood(tmp_path: Path) -> None:
    # Every datagram is from a sender that is not allowed: the reader thread counts them
    # while this thread reads the counters, as the status API does.
    hook = HookListener(tmp_path / "hook.sock", {os.getuid() + 1})
    errors: list[BaseException] = []
    done = threading.Event()

    def reader() -> None:
        try:
            while not done.is_set():
                dict(sorted(hook.dropped.items()))
                _ = hook.received
                time.sleep(0.0005)
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    watcher = threading.Thread(target=reader)
    watcher.start()
    try:
        assert flood_unix(hook.path, 2000) == 0
        deadline = time.monotonic() + 10
        while sum(hook.dropped.values()) < 2000 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        done.set()
        watcher.join()
        hook.close()
    assert not errors
    assert hook.dropped == {"sender not allowed": 2000} and hook.drain() == []


def test_close_joins_the_reader_every_time(tmp_path: Path) -> None:
    before = threading.active_count()
    for i in range(30):
        hook = HookListener(tmp_path / "hook.sock", {os.getuid()})
        reports_in = ReportListener("127.0.0.1", 0, key_for=lambda job: KEY)
        if i % 3 == 0:
            flood_unix(hook.path, 5)
        t0 = time.monotonic()
        hook.close()
        reports_in.close()
        assert time.monotonic() - t0 < 1.0
        assert not hook.queue.alive and not reports_in.queue.alive
    assert threading.active_count() == before
    hook.close()  # closing twice is harmless


@pytest.mark.skipif(not sys.platform.startswith("linux") or os.geteuid() != 0,
                    reason="raising a thread's priority needs root on Linux")
def test_readers_run_at_a_raised_priority_and_the_daemon_does_not(tmp_path: Path) -> None:
    hook = HookListener(tmp_path / "hook.sock", {os.getuid()})
    try:
        tid = hook.queue._thread.native_id  # set once start() returned
        assert tid is not None
        deadline = time.monotonic() + 5  # the thread raises its priority as it starts
        while os.getpriority(os.PRIO_PROCESS, tid) != READER_NICE \
                and time.monotonic() < deadline:
            time.sleep(0.01)
        assert os.getpriority(os.PRIO_PROCESS, tid) == READER_NICE
        assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) != READER_NICE
    finally:
        hook.close()


def test_report_flood_while_blocked_is_all_verified() -> None:
    listener = ReportListener("127.0.0.1", 0, key_for={"9": KEY}.get)
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            for seq in range(1, 2001):
                report = reports.Report(job="9", epoch=1, seq=seq, t=float(seq),
                                        samples=64.0 * seq, world=2)
                s.sendto(reports.sign(report, KEY), listener.address)
                if seq % 50 == 0:
                    time.sleep(0.005)  # UDP drops silently at a full buffer: pace the sender
        time.sleep(0.5)
        got = drain_until(listener, 2000)
        assert [r.seq for r in got] == list(range(1, 2001))
        assert listener.received == 2000 and not listener.dropped
    finally:
        listener.close()


def test_a_report_is_timed_at_its_receipt_not_by_its_senders_clock() -> None:
    """A node whose clock is an hour ahead or behind (or jumps) must not move the engine's
    time: the report's time is the daemon's clock when the reader received it."""
    now = [1000.0]
    listener = ReportListener("127.0.0.1", 0, key_for={"9": KEY}.get, clock=lambda: now[0])
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            for seq, skew in enumerate((3600.0, -3600.0, 0.0), start=1):
                report = reports.Report(job="9", epoch=1, seq=seq, t=time.time() + skew,
                                        samples=64.0 * seq, world=2)
                s.sendto(reports.sign(report, KEY), listener.address)
                got = drain_until(listener, 1)
                assert len(got) == 1 and got[0].seq == seq and got[0].t == now[0]
                assert to_event(got[0]).time == now[0]
                now[0] += 2.0
    finally:
        listener.close()


class SlowBackend(Backend):
    """A batch system whose poll takes ``poll_s`` (a slow squeue)."""

    def __init__(self, poll_s: float) -> None:
        self.name = "slow"
        self.poll_s = poll_s
        self.polls = 0

    def poll(self, now: float) -> list[Event]:
        self.polls += 1
        time.sleep(self.poll_s)
        return []

    def execute(self, actions: Sequence[Action], now: float) -> list[Event]:
        return []


class Engine:
    node_map: dict[str, str] = {}

    def handle_many(self, events: Sequence[Event]) -> list[Action]:
        return []


@pytest.mark.parametrize("poll_s", [1.0])
def test_a_flood_during_a_slow_daemon_cycle_is_not_refused(tmp_path: Path, poll_s: float
                                                           ) -> None:
    store = Store(tmp_path / "state")
    backend = SlowBackend(poll_s)
    daemon = Daemon(Engine(), backend, store, poll_interval_s=60.0, wake_delay_s=0.0,
                    wake_lead_s=0.0)
    hook = HookListener(tmp_path / "hook.sock", {os.getuid()}, decode=protocol.decode)
    heard: list[object] = []
    daemon.watch(hook, lambda: heard.extend(hook.drain()), wake=True)
    refused: list[int] = []
    sender = threading.Thread(target=lambda: refused.append(flood_unix(hook.path, FLOOD)))
    try:
        sender.start()
        daemon.run_once()  # the first cycle: a 1 s poll while the flood arrives
        sender.join(30)
        assert refused == [0], "the kernel refused datagrams during the cycle"
        assert backend.polls == 1
        deadline = time.monotonic() + 10
        while len(heard) < FLOOD and time.monotonic() < deadline:
            daemon.run_once(timeout_s=0.5)  # woken by the hook queue, then a cycle
        assert len(heard) == FLOOD and not hook.dropped
        assert backend.polls >= 2, "the hooks brought the next cycle forward"
    finally:
        hook.close()
        daemon.close()
        store.close()
