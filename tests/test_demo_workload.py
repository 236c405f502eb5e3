"""The demo's main-queue workload: gaps drawn from the Summit fragments, big jobs that wait."""

from __future__ import annotations

import numpy as np
import pytest

from devtools.demo import workload
from malletrain_core.errors import ConfigError

NODES = [f"n{i:02d}" for i in range(1, 17)]


@pytest.fixture(scope="module")
def fragments():
    return workload.load_fragments()


@pytest.fixture(scope="module")
def long_plan(fragments):
    return workload.plan(NODES, 4000.0, seed=3, fragments=fragments)


def test_gaps_follow_the_compressed_fragment_quantiles(long_plan, fragments):
    gaps = long_plan.all_gaps()
    assert len(gaps) > 500
    source = np.minimum(fragments / workload.DEFAULT_COMPRESS, 2000.0)
    for q in (25, 50, 75, 90):
        want, got = np.percentile(source, q), np.percentile(gaps, q)
        assert got == pytest.approx(want, rel=0.2), f"p{q}: {got:.1f} s vs source {want:.1f} s"


def test_the_schedule_realises_exactly_the_recorded_gaps(long_plan):
    realised = workload.schedule_gaps(long_plan.jobs)
    for node in NODES:
        assert sorted(realised.get(node, [])) == pytest.approx(sorted(long_plan.gaps[node]),
                                                               abs=2e-3)


def test_no_node_runs_two_jobs_at_once(long_plan):
    for node in NODES:
        spans = sorted((j.start_s, j.end_s) for j in long_plan.jobs if node in j.nodes)
        assert spans[0][0] == 0.0
        assert all(b[0] >= a[1] - 2e-3 for a, b in zip(spans, spans[1:]))


def test_big_jobs_wait_for_running_jobs_and_leave_planned_holes(long_plan):
    bigs = [j for j in long_plan.jobs if j.kind == "big"]
    fills = [j for j in long_plan.jobs if j.kind == "fill"]
    assert len(bigs) > 40 and all(3 <= len(j.nodes) <= 6 for j in bigs)
    holes = 0
    for big in bigs:
        assert big.submit_s < big.start_s
        before = {n: max(f.end_s for f in fills if f.nodes[0] == n and f.end_s <= big.start_s
                         + 2e-3) for n in big.nodes}
        # At submission some node is still busy: the job waits for it ...
        assert max(before.values()) > big.submit_s
        # ... and the node released last goes straight into it (no idle fragment there).
        assert max(before.values()) == pytest.approx(big.start_s, abs=2e-3)
        holes += sum(big.start_s - e > 0.01 for e in before.values())
        # every fill on these nodes has started by the time the big job is submitted
        assert all(f.start_s < big.submit_s for f in fills if f.nodes[0] in big.nodes
                   and f.end_s <= big.start_s + 2e-3 and f.end_s > big.submit_s)
    assert holes >= len(bigs) * 2


def test_about_the_target_share_of_nodes_is_busy(long_plan):
    t = np.arange(0.0, long_plan.horizon_s, 1.0)
    busy = np.zeros_like(t)
    for j in long_plan.jobs:
        busy[(t >= j.start_s) & (t < j.end_s)] += len(j.nodes)
    assert 0.55 * len(NODES) < busy.mean() < 0.8 * len(NODES)


def test_deterministic_by_seed(fragments):
    a = workload.plan(NODES, 150.0, seed=7, fragments=fragments)
    b = workload.plan(NODES, 150.0, seed=7, fragments=fragments)
    c = workload.plan(NODES, 150.0, seed=8, fragments=fragments)
    assert a.jobs == b.jobs and a.jobs != c.jobs
    assert [j.submit_s for j in a.jobs] == sorted(j.submit_s for j in a.jobs)
    assert len({j.name for j in a.jobs}) == len(a.jobs)


def test_compression_scales_the_gaps(fragments):
    slow = workload.plan(NODES, 3000.0, seed=1, fragments=fragments, compress=30.0)
    fast = workload.plan(NODES, 3000.0, seed=1, fragments=fragments, compress=120.0)
    ratio = np.median(slow.all_gaps()) / np.median(fast.all_gaps())
    assert 3.0 < ratio < 5.5


def test_sbatch_arguments_pin_nodes_with_a_covering_time_limit():
    job = workload.ProdJob("prod-big-001", "big", ("n03", "n04"), 1.0, 5.0, 61.25)
    args = job.sbatch_args()
    assert args[:2] == ["-p", "prod"]
    assert args[args.index("-w") + 1] == "n03,n04" and args[args.index("-N") + 1] == "2"
    assert args[args.index("-t") + 1] == "2" and args[-1] == "sleep 61.2"
    assert workload.ProdJob("x", "fill", ("n01",), 0, 0, 4.0).time_limit_min == 1


def test_bad_settings_and_files_say_what_to_fix(tmp_path, fragments):
    with pytest.raises(ConfigError, match="big_nodes"):
        workload.plan(NODES[:4], 100.0, fragments=fragments, big_nodes=(3, 6))
    with pytest.raises(ConfigError, match="horizon_s"):
        workload.plan(NODES, -1.0, fragments=fragments)
    bad = tmp_path / "frag.npy"
    bad.write_text("not numpy")
    with pytest.raises(workload.InputFileError, match="MALLETRAIN_SHARED"):
        workload.load_fragments(bad)
