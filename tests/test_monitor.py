"""The Job Monitor's throughput and rescale-cost estimates."""

from __future__ import annotations

import random

import pytest

from malletrain_core.engine import Monitor
from malletrain_core.events import ProgressReport


def feed(monitor: Monitor, job: str, times: list[float], rate: float, size: int,
         start_samples: float = 0.0) -> float:
    samples = start_samples
    last = times[0]
    for t in times:
        samples += rate * (t - last)
        last = t
        monitor.report(ProgressReport(t, job, samples, size))
    return samples


def test_throughput_per_scale_ignores_the_warm_up_report() -> None:
    m = Monitor(window_s=60.0)
    m.add("j")
    m.rescale("j", -100.0, 2)
    feed(m, "j", [-90.0, -80.0, -70.0, -60.0, -50.0], 60.0, 2, start_samples=-2400.0)
    m.rescale("j", 0.0, 4)
    # First report at the new size comes after a slow restart: 5 samples in 30 s since the
    # order (80 s since the last report at 2 nodes).
    assert m.report(ProgressReport(30.0, "j", 5.0, 4)) is False
    samples = 5.0
    for t in range(40, 130, 10):
        samples += 100.0 * 10
        assert m.report(ProgressReport(float(t), "j", samples, 4)) is True
    assert m.throughput("j") == {2: pytest.approx(60.0), 4: pytest.approx(100.0)}
    assert m.scale_up_s("j") == pytest.approx(30.0)


def test_stale_world_size_reports_are_ignored() -> None:
    m = Monitor(window_s=30.0)
    m.add("j")
    m.rescale("j", 0.0, 8)
    feed(m, "j", [10.0, 20.0, 30.0, 40.0, 50.0], 80.0, 8)
    m.rescale("j", 50.0, 4)  # ordered down to 4
    # The old workers still report at 8 before they stop: ignored, for 4 and for 8.
    assert not m.report(ProgressReport(55.0, "j", 10_000.0, 8))
    assert m.throughput("j") == {8: pytest.approx(80.0)}
    feed(m, "j", [62.0, 72.0, 82.0, 92.0, 102.0], 50.0, 4, start_samples=3200.0)
    rates = m.throughput("j")
    assert rates[4] == pytest.approx(50.0) and rates[8] == pytest.approx(80.0)


def test_rescale_costs_are_the_time_to_the_first_report_at_the_new_size() -> None:
    m = Monitor(window_s=30.0)
    m.add("j")
    m.rescale("j", 0.0, 2)
    feed(m, "j", [5.0, 15.0, 25.0], 20.0, 2)
    assert m.scale_up_s("j") is None  # a first start is not a rescale of a running job
    m.rescale("j", 100.0, 8)
    feed(m, "j", [100.0 + 18.0, 128.0, 138.0], 70.0, 8)
    m.rescale("j", 200.0, 4)
    feed(m, "j", [207.0, 217.0], 40.0, 4)
    m.rescale("j", 300.0, 1, preempted=True)  # a reclaim: not a planned shrink
    feed(m, "j", [340.0, 350.0], 10.0, 1)
    assert m.scale_up_s("j") == pytest.approx(18.0)
    assert m.scale_down_s("j") == pytest.approx(7.0)
    assert m.typical_costs() == (pytest.approx(18.0), pytest.approx(7.0))


def test_window_average_is_robust_to_noise_and_follows_a_change() -> None:
    rng = random.Random(3)
    m = Monitor(window_s=60.0)
    m.add("j")
    m.rescale("j", 0.0, 4)
    samples, t = 0.0, 0.0
    for _ in range(30):
        t += 5.0
        samples += 100.0 * 5.0 * rng.uniform(0.8, 1.2)
        m.report(ProgressReport(t, "j", samples, 4))
    assert m.throughput("j")[4] == pytest.approx(100.0, rel=0.08)
    for _ in range(30):  # the job slows down to half: within a window the estimate follows
        t += 5.0
        samples += 50.0 * 5.0
        m.report(ProgressReport(t, "j", samples, 4))
    assert m.throughput("j")[4] == pytest.approx(50.0, rel=0.02)


def test_drift_at_the_running_scale_carries_over_to_the_others() -> None:
    m = Monitor(window_s=20.0)
    m.add("j")
    m.rescale("j", 0.0, 8)
    feed(m, "j", [float(t) for t in range(10, 60, 5)], 80.0, 8)
    m.rescale("j", 60.0, 4)
    end = feed(m, "j", [float(t) for t in range(70, 120, 5)], 50.0, 4, 4000.0)
    assert m.throughput("j") == {8: pytest.approx(80.0), 4: pytest.approx(50.0)}
    feed(m, "j", [float(t) for t in range(120, 200, 5)], 25.0, 4, end)
    rates = m.throughput("j")
    assert rates[4] == pytest.approx(25.0)
    assert rates[8] == pytest.approx(40.0)  # halved like the measured scale


def test_rollback_to_a_checkpoint_starts_a_new_baseline() -> None:
    m = Monitor(window_s=30.0)
    m.add("j")
    m.rescale("j", 0.0, 2)
    feed(m, "j", [10.0, 20.0, 30.0, 40.0], 10.0, 2, 1000.0)
    assert not m.report(ProgressReport(50.0, "j", 900.0, 2))  # samples went back
    feed(m, "j", [60.0, 70.0, 80.0, 90.0, 100.0], 10.0, 2, 900.0 + 100.0)
    assert m.throughput("j")[2] == pytest.approx(10.0)


def test_window_done_needs_a_full_window_after_the_step_began() -> None:
    m = Monitor(window_s=30.0)
    m.add("j")
    m.rescale("j", 0.0, 4)
    feed(m, "j", [10.0, 20.0, 30.0], 10.0, 4)
    assert not m.window_done("j", 4, since=0.0)
    feed(m, "j", [40.0], 10.0, 4, 200.0)
    assert m.window_done("j", 4, since=0.0)
    assert not m.window_done("j", 4, since=15.0) and not m.window_done("j", 2, since=0.0)
    assert m.throughput("unknown") == {} and m.scale_up_s("unknown") is None


def test_noise_and_warm_up_do_not_move_the_other_scales() -> None:
    rng = random.Random(9)
    m = Monitor(window_s=30.0)
    m.add("j")
    m.rescale("j", 0.0, 8)
    feed(m, "j", [float(t) for t in range(10, 80, 10)], 80.0, 8)
    samples, t = 0.0, 100.0
    for segment in range(20):
        m.rescale("j", t, 4 if segment % 2 == 0 else 3)
        size = 4 if segment % 2 == 0 else 3
        t += 15.0
        m.report(ProgressReport(t, "j", samples, size))
        for i in range(12):
            t += 10.0
            speed = 0.5 if i == 0 else rng.uniform(0.9, 1.1)  # a slow warm-up interval first
            samples += 10.0 * size * 10.0 * speed
            m.report(ProgressReport(t, "j", samples, size))
    rates = m.throughput("j")
    assert rates[8] == pytest.approx(80.0)
    assert rates[4] == pytest.approx(40.0, rel=0.1) and rates[3] == pytest.approx(30.0, rel=0.1)
