"""The replay's exact shortcuts give the full computation's answers: the DP's reuse of its last
answer (a property test against the plain DP, and cases where it must not apply), and a small
replay run in the checked mode, where every shortcut taken is compared with the full answer."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_allocator_dp import plain_solve, tables

from malletrain_core import shortcuts
from malletrain_core.allocator import dp
from malletrain_core.model import Curve, Job, Problem
from malletrain_core.sim.replay import RunResult, replay
from malletrain_core.sim.sources import load_trace
from malletrain_core.sim.workloads import make_workload


@settings(max_examples=200, deadline=None)
@given(st.lists(tables(), min_size=1, max_size=6), st.integers(0, 40), st.integers(0, 40))
def test_a_reused_answer_is_the_plain_dp_answer(ts: list[np.ndarray], old: int,
                                                new: int) -> None:
    first = plain_solve(ts, old)
    if first[1] == -np.inf:
        return
    if dp.reusable(ts, old, first[0], new):
        assert plain_solve(ts, new) == first


def test_reuse_only_where_the_capacity_cannot_move_the_answer() -> None:
    rising = np.array([0.0, 10.0, 19.0, 27.0, 34.0])  # useful top 4
    ts = [rising, rising.copy()]
    counts, _ = dp.solve_counts(ts, 4)
    assert counts == [2, 2]
    assert dp.reusable(ts, 4, counts, 4) and dp.reusable(ts, 4, counts, 3) is False
    assert not dp.reusable(ts, 4, counts, 6)  # more nodes: both jobs grow
    assert dp.solve_counts(ts, 6) != (counts, _)
    full, _ = dp.solve_counts(ts, 8)  # every job at its top: any larger capacity keeps it
    assert full == [4, 4] and dp.reusable(ts, 8, full, 50)


def test_solve_reuses_the_last_answer_for_the_same_jobs_and_checks_it() -> None:
    curve = Curve((1, 2, 4), (1.0, 1.9, 3.5))
    jobs = tuple(Job(f"r{i}", max_nodes=4, curve=curve) for i in range(3))
    shortcuts.CHECKED, shortcuts.counts = True, shortcuts.counts.__class__()
    try:
        first = dp.solve(Problem(40, jobs))
        again = dp.solve(Problem(30, jobs))  # every job at its top on 40: 30 still holds 12
        other = dp.solve(Problem(40, tuple(Job(j.id, 4, curve=curve) for j in jobs)))
    finally:
        shortcuts.CHECKED = False
    assert first == again == other and shortcuts.counts["dp.reuse"] == 1


def test_a_small_replay_takes_the_shortcuts_and_the_checks_pass() -> None:
    """The checked mode raises ShortcutMismatch at the first difference; the counts show that
    the shortcuts were taken (and so compared) many times."""
    trace = load_trace("synthetic", days=0.5, synthetic_nodes=128, seed=3)
    jobs = make_workload("imagenet", 6, seed=1, start=trace.start, end=trace.end)
    shortcuts.CHECKED, shortcuts.counts = True, shortcuts.counts.__class__()
    try:
        checked = replay(trace, jobs, "malletrain", seed=1)
    finally:
        shortcuts.CHECKED = False
    taken = dict(shortcuts.counts)
    plain = replay(trace, jobs, "malletrain", seed=1)
    assert taken.get("learning.unchanged", 0) > 100 and taken.get("dp.bound", 0) > 10
    assert (checked.net_samples, checked.rescales, checked.node_seconds) == \
        (plain.net_samples, plain.rescales, plain.node_seconds)


def test_a_mismatch_is_refused_by_name() -> None:
    with pytest.raises(shortcuts.ShortcutMismatch, match="dp.reuse"):
        shortcuts.check("dp.reuse", ([1], 2.0), ([0], 2.0))


@pytest.mark.slow
@pytest.mark.parametrize("cost", ["restart", "inplace"])
def test_a_summit_day_decides_the_same_with_every_shortcut_checked(cost: str) -> None:
    """A real trace window (the Summit idle-node trace, its first day after BFTrainer's
    skipped events; MALLETRAIN_SHARED must point at the shared data): every shortcut the replay
    takes is compared with the full computation, and the run's figures are those of the
    replay without the checks."""
    from malletrain_core.sim.perfmodel import PerfParams

    trace = load_trace("summit", days=1.0)
    jobs = make_workload("imagenet", 50, seed=0, start=trace.start, end=trace.end)
    params = PerfParams(rescale_cost=cost)
    shortcuts.CHECKED, shortcuts.counts = True, shortcuts.counts.__class__()
    try:
        checked = replay(trace, jobs, "malletrain", seed=0, params=params)
    finally:
        shortcuts.CHECKED = False
    taken = dict(shortcuts.counts)
    plain = replay(trace, jobs, "malletrain", seed=0, params=params)
    assert taken.get("learning.unchanged", 0) > 1000 and taken.get("curves.agree", 0) > 100
    def counters(run: RunResult) -> dict[str, object]:  # the solver's milliseconds vary
        return {k: v for k, v in run.engine.items() if k != "solve_ms"}

    assert (checked.net_samples, checked.rescales, checked.node_seconds, counters(checked)) == \
        (plain.net_samples, plain.rescales, plain.node_seconds, counters(plain))
