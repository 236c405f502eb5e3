"""Reclaim prediction: the life table, residual lives, hole ends, online learning, traces."""

from __future__ import annotations

import json

import numpy as np
import pytest

from malletrain_core import events as ev
from malletrain_core.engine import Engine, EngineConfig
from malletrain_core.engine.survival import (
    LifetimePredictor,
    SurvivalModel,
    log_edges,
    trace_fragments,
)
from malletrain_core.errors import ConfigError, ValidationError
from malletrain_core.model import Curve
from malletrain_core.sim.backend import reclaim_times
from malletrain_core.sim.traces import from_transitions

EDGES = [0.0, 10.0, 20.0, 50.0, 200.0]


def model(lengths=(5, 15, 25, 100), censored=()) -> SurvivalModel:
    return SurvivalModel.from_fragments(lengths, censored, edges=EDGES)


def test_survival_without_censoring_is_the_share_still_idle() -> None:
    # 15, 25, 100 reach 10 s; 25, 100 reach 20 s; 100 reaches 50 s; none reaches 200 s.
    assert model().survival_at_edges().tolist() == [1.0, 0.75, 0.5, 0.25, 0.0]
    assert model().survival(15.0) == pytest.approx(0.625)


def test_censored_fragments_count_as_at_risk_not_as_ended() -> None:
    # Bin [0, 10): one of two ends → S(10) = 1/2. Bin [10, 20): the other is censored there
    # (half at risk), nothing ends → S(20) = 1/2.
    m = SurvivalModel.from_fragments([5], [15], edges=[0.0, 10.0, 20.0])
    assert m.survival_at_edges().tolist() == [1.0, 0.5, 0.5]
    # Actuarial rule: 2 ended and 2 censored in the first bin: hazard 2 / (4 − 1) = 2/3.
    m = SurvivalModel.from_fragments([1, 2], [3, 4, 15], edges=[0.0, 10.0, 20.0])
    assert m.survival_at_edges()[1] == pytest.approx(1 - 2 / (5 - 1))


def test_residual_life_and_risk_are_exact_integrals_of_the_linear_survival() -> None:
    m = model()
    life, risk = m.residual(np.array([0.0, 20.0, 10.0]), horizon_s=10.0)
    # Age 0, H 10: ∫_0^10 S = (1 + 0.75) / 2 · 10; risk 1 − S(10).
    assert life[0] == pytest.approx(8.75)
    assert risk[0] == pytest.approx(0.25)
    # Age 10, H 10: ∫_10^20 S / S(10) = (0.75 + 0.5) / 2 · 10 / 0.75.
    assert life[2] == pytest.approx(6.25 / 0.75)
    assert risk[2] == pytest.approx(1 - 0.5 / 0.75)
    life, risk = m.residual(np.array([20.0, 10.0]), horizon_s=30.0)
    assert life[0] == pytest.approx((0.5 + 0.25) / 2 * 30 / 0.5)
    assert risk[0] == pytest.approx(0.5)
    # Inside a bin: S(15) = 0.625, S(40) = 0.5 − 0.25 · 20/30.
    life, risk = m.residual(np.array([15.0]), horizon_s=25.0)
    s40 = 0.5 - 0.25 * 20 / 30
    area = (0.625 + 0.5) / 2 * 5 + (0.5 + s40) / 2 * 20
    assert life[0] == pytest.approx(area / 0.625)
    assert risk[0] == pytest.approx(1 - s40 / 0.625)


def test_a_node_older_than_every_fragment_is_not_written_off() -> None:
    # S reaches 0 at 200 s: ages from 50 s on are taken as 50 s, where S falls linearly from
    # 0.25 to 0 over [50, 200]: life = ∫_50^110 S / S(50), risk = 1 − S(110) / S(50).
    life, risk = model().residual(np.array([50.0, 150.0, 500.0, 1e9]), horizon_s=60.0)
    s110 = 0.25 * 90 / 150
    assert life.tolist() == pytest.approx([(0.25 + s110) / 2 * 60 / 0.25] * 4)
    assert risk.tolist() == pytest.approx([1 - s110 / 0.25] * 4)


def test_an_empty_model_trusts_the_horizon() -> None:
    life, risk = SurvivalModel(EDGES).residual(np.array([0.0, 30.0]), horizon_s=60.0)
    assert life.tolist() == [60.0, 60.0] and risk.tolist() == [0.0, 0.0]


def test_older_nodes_live_longer_on_heavy_tailed_fragments() -> None:
    rng = np.random.default_rng(3)
    m = SurvivalModel.from_fragments(rng.pareto(1.2, 20000) * 100.0)
    life, _ = m.residual(np.array([10.0, 100.0, 1000.0, 10000.0]), horizon_s=3600.0)
    assert np.all(np.diff(life) > 0)


def test_online_updates_equal_learning_in_one_go_and_refresh_the_predictions() -> None:
    m = model(lengths=[5, 15])
    before = m.residual(np.array([0.0]), 30.0)[0][0]
    for x in (25, 100):
        m.observe(x)
    m.observe(30, censored=True)
    assert m.to_dict() == model(censored=[30]).to_dict()
    assert m.residual(np.array([0.0]), 30.0)[0][0] > before
    assert m.count == 5


def test_state_round_trips_through_json() -> None:
    m = SurvivalModel.from_fragments([3, 30, 300, 3000], [60])
    again = SurvivalModel.from_dict(json.loads(json.dumps(m.to_dict())))
    assert again.to_dict() == m.to_dict()
    p = LifetimePredictor(m, 300.0, learn_online=False)
    q = LifetimePredictor.from_dict(json.loads(json.dumps(p.to_dict())))
    ages, holes = [0.0, 100.0], [None, None]
    assert np.array_equal(q.predict(ages, holes)[0], p.predict(ages, holes)[0])
    assert q.horizon_s == 300.0 and not q.learn_online


@pytest.mark.parametrize("bad", [{"edges": [0, 10]}, {"edges": [0, 10], "ended": [1, 2],
                                                       "censored": [0]},
                                 {"edges": [0, 10], "ended": [-1], "censored": [0]}])
def test_broken_states_are_refused_in_one_line(bad) -> None:
    with pytest.raises(ValidationError, match="SurvivalModel.to_dict"):
        SurvivalModel.from_dict(bad)


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValidationError, match="finite seconds"):
        SurvivalModel().observe(-1.0)
    with pytest.raises(ValidationError, match="increasing"):
        SurvivalModel([0.0, 10.0, 5.0])
    with pytest.raises(ConfigError, match="horizon_s"):
        LifetimePredictor(None, 0.0)
    assert log_edges(10, 1000, 2).tolist() == pytest.approx([0, 10, 31.6227766, 100,
                                                             316.227766, 1000])


def test_the_plans_hole_end_wins_over_the_statistics() -> None:
    p = LifetimePredictor(model(), horizon_s=30.0)
    life, risk = p.predict([0.0, 0.0, 0.0, 500.0], [None, 12.0, 90.0, 5.0])
    stats_life, stats_risk = model().residual(np.array([0.0]), 30.0)
    assert life.tolist() == pytest.approx([stats_life[0], 12.0, 30.0, 5.0])
    assert risk.tolist() == pytest.approx([stats_risk[0], 1.0, 0.0, 1.0])
    # A plan-only predictor: nodes without a hole end stay beyond the horizon.
    life, risk = LifetimePredictor(None, 30.0).predict([0.0, 7.0], [None, 7.0])
    assert life.tolist() == [30.0, 7.0] and risk.tolist() == [0.0, 1.0]


def test_the_engine_learns_each_fragment_that_ends_and_uses_idle_ages() -> None:
    p = LifetimePredictor(SurvivalModel(EDGES), horizon_s=60.0)
    engine = Engine(EngineConfig(lifetime=p, profiling=False))
    curve = Curve.of([1, 2], [10.0, 19.0])
    engine.handle_many([ev.NodesIdle(0.0, (ev.IdleNode("a"), ev.IdleNode("b"))),
                        ev.JobSubmitted(0.0, ev.JobRequest("j", 1, 2, curve=curve,
                                                           profile=False))])
    assert set(engine.node_map) == {"a", "b"}
    engine.handle(ev.NodesReclaimed(42.0, ("a",)))
    assert p.survival is not None and p.survival.count == 1
    assert p.survival.ended[2] == 1  # 42 s lies in [20, 50)
    engine.handle(ev.NodesIdle(50.0, (ev.IdleNode("c"),)))
    engine.handle(ev.NodesReclaimed(60.0, ("c", "b")))
    assert p.survival.ended[1] == 1 and p.survival.ended[3] == 1  # 10 s and 60 s
    assert EngineConfig(lifetime=p) == EngineConfig()  # the predictor is no part of equality


def tiny_trace():
    # Node 0 idle from the start until 50; node 1 idle 10..40 and again from 70; node 2 idle
    # 20..30; the trace ends at 100.
    times = np.array([10, 20, 30, 40, 50, 70], dtype=float)
    nodes = np.array([1, 2, 2, 1, 0, 1])
    idle = np.array([True, True, False, False, False, True])
    return from_transitions("tiny", ["n0", "n1", "n2"], np.array([0]), times, nodes, idle,
                            start=0.0, end=100.0)


def test_fragments_of_a_trace_leave_out_those_of_unknown_beginning() -> None:
    closed, censored = trace_fragments(tiny_trace())
    assert sorted(closed.tolist()) == [10.0, 30.0]
    assert censored.tolist() == [30.0]


def test_reclaim_times_are_the_nodes_next_transitions() -> None:
    trace = tiny_trace()
    following, first = reclaim_times(trace)
    assert first.tolist() == [50.0, 10.0, 20.0]
    t = np.repeat(trace.times, np.diff(trace.offsets))
    got = {(int(n), float(ti)): f for n, ti, f in zip(trace.nodes, t, following)}
    assert got[(1, 10.0)] == 40.0 and got[(2, 20.0)] == 30.0
    assert np.isinf(got[(1, 70.0)])
