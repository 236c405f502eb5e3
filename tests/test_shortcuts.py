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
    for name in ("dp.tops", "placement.moves", "curves.in_range", "monitor.followed"):
        assert taken.get(name, 0) > 10, (name, taken)
    assert (checked.net_samples, checked.rescales, checked.node_seconds) == \
        (plain.net_samples, plain.rescales, plain.node_seconds)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0.0, 100.0), min_size=1, max_size=8),
       st.dictionaries(st.integers(1, 80), st.floats(0.0, 200.0), max_size=6),
       st.floats(0.5, 2.0), st.booleans())
def test_a_prior_scaled_in_its_own_order_is_the_general_scaling(
        values: list[float], measured: dict[int, float], factor: float, spread: bool) -> None:
    """corrected_curve's usual case (every measured scale inside the prior's range, the
    prior's scales increasing) builds the curve in the prior's order: the same curve as the
    general scaling by a dict of points, sorted."""
    from malletrain_core.engine.curves import _increasing, _scaled

    nodes = tuple((3 if spread else 1) * (i + 1) for i in range(len(values)))
    prior = Curve(nodes, tuple(values))
    ks = sorted(measured)
    inside = [k for k in ks if nodes[0] <= k <= nodes[-1]]
    assert _increasing(prior)
    fast = Curve(prior.nodes, tuple([max(0.0, float(p * factor)) for p in prior.throughput]))
    if len(inside) == len(ks):
        assert _scaled(prior, factor, measured, ks, inside) == fast
    assert not _increasing(Curve((2, 1), (1.0, 2.0)))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 6), st.integers(0, 8)), min_size=1, max_size=5),
       st.integers(0, 10), st.integers(0, 3))
def test_placing_the_moving_jobs_only_is_placing_them_among_all(
        jobs: list[tuple[int, int]], idle: int, groups: int) -> None:
    """place_moves (the jobs whose count changes) gives those jobs the nodes place gives them
    with every job, and the other jobs keep their nodes there."""
    from malletrain_core.allocator.placement import place, place_moves
    from malletrain_core.model import Node

    holding: dict[str, set[str]] = {}
    known: dict[str, Node] = {}
    counts: dict[str, int] = {}
    n = 0
    for i, (held, want) in enumerate(jobs):
        names = {f"n{n + k:03d}" for k in range(held)}
        n += held
        holding[f"j{i}"] = names
        known.update((m, Node(m, f"g{int(m[1:]) % (groups + 1)}", float(int(m[1:]) % 7)))
                     for m in names)
        counts[f"j{i}"] = want
    free = [Node(f"n{n + k:03d}", f"g{k % (groups + 1)}", None if k % 3 else 5.0)
            for k in range(idle)]
    need = sum(max(0, counts[j] - len(holding[j])) for j in counts)
    spare = idle + sum(max(0, len(holding[j]) - counts[j]) for j in counts)
    if need > spare:
        return
    full = place(counts, {j: tuple(v) for j, v in holding.items()}, free, known)
    moved = place_moves(counts, holding, free, known)
    assert moved == {j: v for j, v in full.items() if counts[j] != len(holding[j])}
    assert all(set(full.get(j, ())) == holding[j] for j in counts
               if counts[j] == len(holding[j]))


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
