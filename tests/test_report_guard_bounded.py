"""The report replay guard does not keep every (job, epoch) ever reported: the intake drops
the jobs that have no running launch any more (found by bench/soak.py's reading of what grows
in a long-running daemon)."""

from __future__ import annotations

import socket
import time

import pytest

from malletrain_core.daemon import intake
from malletrain_core.daemon.intake import ReportListener
from malletrain_core.wire import reports
from malletrain_core.wire.reports import ReportError

KEY = b"k" * 32


def report(job: str, epoch: int, seq: int) -> reports.Report:
    return reports.Report(job=job, epoch=epoch, seq=seq, t=float(seq), samples=1.0, world=1)


def test_retain_forgets_ended_jobs_and_keeps_refusing_replays_of_live_ones() -> None:
    guard = reports.ReplayGuard()
    for job in ("1", "2", "3"):
        for epoch in range(5):
            guard.check(report(job, epoch, 7))
    assert len(guard) == 15
    asked: list[str] = []

    def live(job: str) -> bool:
        asked.append(job)
        return job == "2"

    assert guard.retain(live) == 10
    assert sorted(asked) == ["1", "2", "3"]  # once per job
    assert len(guard) == 5
    try:
        guard.check(report("2", 4, 7))
    except ReportError as exc:
        assert "replayed" in str(exc)
    else:
        raise AssertionError("a replay of a live job's report passed")
    guard.check(report("1", 4, 7))  # forgotten: the intake refuses it before (no launch)


def test_the_listener_prunes_its_guard(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(intake, "GUARD_PRUNE_EVERY", 50)
    running = {"9": KEY, "8": KEY}
    listener = ReportListener("127.0.0.1", 0, key_for=running.get)
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            for epoch in range(1, 31):
                for job in ("8", "9"):
                    s.sendto(reports.sign(report(job, epoch, 1), KEY), listener.address)
            got: list[reports.Report] = []
            deadline = time.monotonic() + 10
            while len(got) < 60 and time.monotonic() < deadline:
                got += listener.drain()
                time.sleep(0.01)
            assert len(got) == 60 and len(listener.guard) == 60
            del running["8"]  # job 8 ended
            for seq in range(2, 62):
                s.sendto(reports.sign(report("9", 30, seq), KEY), listener.address)
            deadline = time.monotonic() + 10
            while len(got) < 120 and time.monotonic() < deadline:
                got += listener.drain()
                time.sleep(0.01)
        assert len(got) == 120
        assert {job for job, _ in listener.guard._last} == {"9"}
        assert len(listener.guard) == 30
    finally:
        listener.close()
