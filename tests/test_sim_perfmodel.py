"""The performance model's accounting: rates, rescale costs, warm-up, preemption losses."""

from __future__ import annotations

import math

import numpy as np
import pytest

from malletrain_core.model import Curve
from malletrain_core.sim.perfmodel import JobModel, PerfParams
from malletrain_core.sim.workloads import SimJob

CURVE = Curve.of([1, 2, 4], [10.0, 18.0, 30.0])


def _job(work: float | None = None, up: float = 20.0, down: float = 10.0) -> SimJob:
    return SimJob("j", "m", CURVE, 1, 4, up, down, work, 0.0)


def _model(checkpoint_s: float = 0.0, warmup: float = 0.0, **kw: float) -> JobModel:
    params = PerfParams(noise=0.0, checkpoint_interval_s=checkpoint_s, warmup_share=warmup)
    return JobModel(_job(**kw), params, np.random.default_rng(0))


def test_start_is_free_and_rate_follows_the_curve() -> None:
    m = _model()
    m.rescale(0.0, 2)
    assert not m.restarting
    m.advance(100.0)
    assert m.progress == pytest.approx(1800.0) and m.net == pytest.approx(1800.0)
    assert m.node_s == 200.0 and m.rescales == 0


def test_grow_costs_scale_up_seconds_at_the_old_rate() -> None:
    m = _model(up=20.0)
    m.rescale(0.0, 1)
    m.advance(100.0)                       # 1000 samples at 10/s
    m.rescale(100.0, 4)                    # prototype: 20 s × 10/s = 200 samples
    assert m.net == pytest.approx(800.0)
    m.advance(110.0)
    assert m.restarting and m.progress == pytest.approx(1000.0)
    m.advance(200.0)                       # restart took 20 s: trained 80 s at 30/s
    assert not m.restarting
    assert m.progress == pytest.approx(1000.0 + 30.0 * 80)
    assert m.net == pytest.approx(1000.0 + 30.0 * 100 - 200.0)
    assert m.rescale_loss == pytest.approx(200.0) and m.rescales == 1


def test_shrink_costs_scale_down_seconds_and_warmup_runs_at_half_speed() -> None:
    m = _model(warmup=0.5, down=10.0)
    m.rescale(0.0, 4)
    m.advance(10.0)                        # 300
    m.rescale(10.0, 2)                     # stall 5 s, then 10 s at half speed
    m.advance(15.0)
    assert m.progress == pytest.approx(300.0) and not m.restarting
    m.advance(25.0)
    assert m.progress == pytest.approx(300.0 + 9.0 * 10)
    m.advance(1000.0)
    assert m.progress == pytest.approx(300.0 + 18.0 * (990.0 - 10.0))
    assert m.net == pytest.approx(300.0 + 18.0 * 990.0 - 10.0 * 30.0)


def test_preemption_rolls_back_to_the_last_checkpoint() -> None:
    m = _model(checkpoint_s=100.0, down=10.0)
    m.rescale(0.0, 2)
    m.advance(250.0)                       # checkpoints at 100 and 200
    assert m.ckpt == pytest.approx(3600.0)
    m.preempt(250.0, 1)                    # lose 50 s × 18 = 900, plus 10 s × 18 = 180
    assert m.progress == pytest.approx(3600.0)
    assert m.preemption_loss == pytest.approx(900.0 + 180.0)
    assert m.preemptions == 1 and m.world == 1 and m.epoch == 2
    m.advance(1000.0)                      # the survivor restarts for 10 s
    assert m.progress == pytest.approx(3600.0 + 10.0 * 740)
    assert m.net == pytest.approx(250 * 18.0 - 900.0 - 180.0 + 10.0 * 750)


def test_only_a_resume_from_the_checkpoint_counts_as_rolled_back() -> None:
    """What the step logs would show twice: the training undone by a restart from the
    checkpoint, not the step in flight an in-place change drops (it never completed)."""
    m = JobModel(_job(), PerfParams(noise=0.0, checkpoint_interval_s=100.0,
                                    rescale_cost="inplace"), np.random.default_rng(0))
    m.rescale(0.0, 2)
    m.advance(150.0)
    m.preempt(150.0, 1)                    # survivors keep their state: a step in flight lost
    assert m.rolled_back > 0 and m.restored_loss == 0.0
    m.advance(250.0)
    m.preempt(250.0, 0)                    # every node lost: back to the checkpoint at 200
    assert m.restored_loss == pytest.approx(50.0 * 10.0)
    assert m.progress == pytest.approx(m.ckpt)


def test_checkpoint_inside_a_restart_window() -> None:
    m = _model(checkpoint_s=30.0, up=20.0)
    m.rescale(0.0, 1)
    m.advance(10.0)
    m.rescale(10.0, 2)                     # restart until 30; periodic checkpoint at 40
    m.advance(45.0)
    assert m.ckpt == pytest.approx(100.0 + 18.0 * 10)
    m.preempt(45.0, 0)
    assert m.progress == pytest.approx(280.0)


def test_planned_rescale_checkpoints_first() -> None:
    m = _model(checkpoint_s=1000.0)
    m.rescale(0.0, 2)
    m.advance(50.0)
    m.rescale(50.0, 4)                     # checkpoint at 900 samples before restarting
    assert m.ckpt == pytest.approx(900.0)
    m.advance(500.0)
    before = m.progress
    m.preempt(500.0, 0)
    assert m.progress == pytest.approx(900.0)
    assert m.preemption_loss == pytest.approx(before - 900.0 + 10.0 * 30.0)


def test_continuous_checkpoints_lose_only_the_restart_cost() -> None:
    m = _model(down=10.0)
    m.rescale(0.0, 1)
    m.advance(100.0)
    m.preempt(100.0, 0)
    assert m.progress == pytest.approx(1000.0)
    assert m.preemption_loss == pytest.approx(100.0)
    assert m.rate() == 0.0 and math.isinf(m.time_to_progress(2000.0))


@pytest.mark.parametrize("warmup", [0.0, 0.25, 1.0])
@pytest.mark.parametrize("target", [1000.0, 1100.0, 5000.0])
def test_time_to_progress_matches_advance(warmup: float, target: float) -> None:
    m = _model(warmup=warmup, work=target)
    m.rescale(0.0, 1)
    m.advance(40.0)
    m.rescale(40.0, 4)
    m.advance(43.0)
    dt = m.time_to_progress(target)
    m.advance(43.0 + dt)
    assert m.progress == pytest.approx(target)


def test_noise_has_mean_one_and_is_seeded() -> None:
    params = PerfParams(noise=0.1)
    a = JobModel(_job(), params, np.random.default_rng(3))
    b = JobModel(_job(), params, np.random.default_rng(3))
    fa, fb = [], []
    for _ in range(4000):
        a.redraw_noise()
        b.redraw_noise()
        fa.append(a.factor)
        fb.append(b.factor)
    assert fa == fb
    assert np.mean(fa) == pytest.approx(1.0, abs=0.01)
    assert np.std(fa) == pytest.approx(0.1, rel=0.1)


def test_bad_parameters_are_refused() -> None:
    with pytest.raises(ValueError):
        PerfParams(noise=-1)
    with pytest.raises(ValueError):
        PerfParams(warmup_share=2)
    with pytest.raises(ValueError):
        PerfParams(report_fast_s=0)
