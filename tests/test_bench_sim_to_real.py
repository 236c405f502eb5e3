"""bench/sim_to_real.py without a cluster: the costs it reads from slurmctld's log and the
workers' step logs, and the replay of the saved run, which must give the saved comparison."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

s2r = pytest.importorskip("bench.sim_to_real")
costs = pytest.importorskip("bench.sim_to_real_costs")
from test_sim_accounting import utc  # noqa: E402,F401  (sacct -P times are local: UTC here)

SAVED = REPO / "bench" / "results" / "sim_to_real"


LOG = """\
[2026-11-27T02:00:00.000] sched: Allocate JobId=1 NodeList=n01 #CPUs=2 Partition=prod
[2026-11-27T02:00:00.000] sched: Allocate JobId=2 NodeList=n02 #CPUs=2 Partition=prod
[2026-11-27T02:00:10.000] _job_complete: JobId=1 done
[2026-11-27T02:00:10.500] sched/backfill: _start_job: Started JobId=5_0(9) in preemptable on n01
[2026-11-27T02:00:20.000] _job_complete: JobId=2 done
[2026-11-27T02:00:25.000] sched: Allocate JobId=3 NodeList=n02 #CPUs=2 Partition=prod
[2026-11-27T02:00:30.000] _job_complete: JobId=3 done
[2026-11-27T02:00:31.250] sched: Allocate JobId=5_1(10) NodeList=n02 #CPUs=2 Partition=preemptable
"""
T0 = 1795744800.0  # 2026-11-27T02:00:00 UTC


def test_grant_delays_count_only_tasks_started_before_prod_came_back() -> None:
    delays = costs.grant_delays(LOG, (T0, T0 + 60))
    assert sorted(round(d, 3) for d in delays) == [0.5, 1.25]  # n02's 20-25 s hole: none
    assert costs.grant_delays(LOG, (T0 + 15, T0 + 60)) == pytest.approx([1.25])


def test_step_gaps_split_stalls_from_restarts_and_hand_overs() -> None:
    steps = {"n01": [(T0 + 11, T0 + 11.4), (T0 + 11.45, T0 + 11.85), (T0 + 13.85, T0 + 14.25),
                     (T0 + 30, T0 + 30.4)],
             "n02": [(T0 + 1, T0 + 1.4), (T0 + 24.2, T0 + 24.6)]}
    prod = {"n01": [(T0 + 20, T0 + 25)], "n02": [(T0 + 25, T0 + 30)]}
    starts = {"n01": [T0 + 26.0]}
    stalls, handovers = costs.step_gaps(steps, prod, starts, (T0, T0 + 60))
    assert stalls == [2.0, 22.8]  # n01's 2-s pause; n02 idle, no restart: counted
    assert sorted(handovers) == [0.4, 5.75]


def _log(folder: Path, job: str, node: str, lines: list[str]) -> Path:
    path = folder / f"checkpoints-{job}" / "steps" / f"{node}.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines))
    return path


def test_step_logs_tell_kept_steps_from_rolled_back_ones(tmp_path: Path) -> None:
    """Job 7 trains steps 0-2 on two nodes in epoch 0, loses every node and resumes from its
    checkpoint at step 1 in epoch 2: epoch 0's steps 1 and 2 were rolled back. A step kept
    across a lost peer is logged in two pieces and counts once; job 8 is the older format."""
    paths = [_log(tmp_path, "7", "n01", [f"{T0} {T0 + 1} 0 0", f"{T0 + 1} {T0 + 2} 1 0",
                                         f"{T0 + 2} {T0 + 2.5} 2 0", f"{T0 + 2.6} {T0 + 3} 2 0",
                                         f"{T0 + 20} {T0 + 21} 1 2", f"{T0 + 21} {T0 + 22} 2 2",
                                         f"{T0 + 22} {T0 + 23} 3 2", "garbage"]),
             _log(tmp_path, "7", "n02", [f"{T0} {T0 + 1} 0 0", f"{T0 + 1} {T0 + 2} 1 0"]),
             _log(tmp_path, "8", "n03", [f"{T0} {T0 + 1}", f"{T0 + 1} {T0 + 2}"])]
    got = costs.step_samples(paths, (T0, T0 + 60))
    batch = costs.BATCH
    # kept: 7's steps 0 (two nodes) and 1-3 of epoch 2, 8's two steps; rolled back: 7's
    # epoch-0 steps 1 (two nodes) and 2 (one node, two pieces)
    assert got == {"kept": batch * (2 + 3 + 2), "rolled_back": batch * (2 + 1), "resumes": 1}
    assert costs.step_samples(paths, (T0, T0 + 10)) == {"kept": batch * (2 + 2),
                                                        "rolled_back": batch * 3, "resumes": 0}
    assert costs.step_samples(paths, (T0, T0 + 60), until=T0 + 10)["rolled_back"] == 0


@pytest.mark.skipif(not (SAVED / "measured.json").is_file(), reason="no saved run")
def test_the_saved_run_replays_to_its_saved_comparison() -> None:
    measured = json.loads((SAVED / "measured.json").read_text())
    saved = json.loads((SAVED / "comparison.json").read_text())
    got = s2r.predict(SAVED, measured)
    assert got == saved
    assert {"predicted_share", "measured_share", "relative_error"} <= got.keys()
    assert {"predicted", "measured", "relative_error"} <= got["samples"].keys()
    assert got["samples"]["measured_by"] == "step logs"  # kept and rolled back, from the logs
    assert {"predicted", "measured", "relative_error"} <= got["rolled_back"].keys()


def test_the_saved_pbs_run_replays_to_its_saved_comparison() -> None:
    """--batch-system pbs: the server's accounting log of the saved run, the prod queue's runs
    only, replayed; the idle node-seconds come from the same records on both sides."""
    saved_dir = REPO / "bench" / "results" / "sim_to_real_pbs"
    measured = json.loads((saved_dir / "measured.json").read_text())
    saved = json.loads((saved_dir / "comparison.json").read_text())
    got = s2r.predict(saved_dir, measured)
    assert got == saved and got["batch_system"] == "pbs"
    assert abs(got["idle_node_s"]["relative_error"]) < 1e-3
    assert got["elastic_runs"] > 0 and got["prod_runs"] > 0


def test_pbs_spans_keep_one_queue_and_close_open_runs() -> None:
    pbs = pytest.importorskip("bench.sim_to_real_pbs")
    from malletrain_core.sim.accounting import JobRun

    runs = [JobRun("1", 10.0, 20.0, ("n01", "n02"), "prod"),
            JobRun("2[1]", 21.0, None, ("n01",), "mt_preemptable"),
            JobRun("3", 5.0, 8.0, ("n01",), "prod")]
    assert pbs.spans(runs, "prod", (0.0, 50.0)) == {"n01": [(5.0, 8.0), (10.0, 20.0)],
                                                    "n02": [(10.0, 20.0)]}
    assert pbs.spans(runs, "mt_preemptable", (0.0, 50.0)) == {"n01": [(21.0, 50.0)]}


def test_starts_that_never_reached_a_step_are_censored_at_what_they_had() -> None:
    steps = {"n01": [(T0 + 12, T0 + 12.4)], "n02": [(T0 + 1, T0 + 1.4)]}
    prod = {"n01": [(T0, T0 + 10), (T0 + 40, T0 + 50)], "n02": [(T0 + 25, T0 + 30)]}
    starts = {"n01": [T0 + 10.5, T0 + 20.0], "n02": [T0 + 31.25]}
    # n01's first task stepped; its second had until the prod job at 40; n02's until the end
    got = costs.censored_starts(steps, prod, starts, (T0, T0 + 60))
    assert sorted(got) == [20.0, 28.75]


def test_start_quantiles_follow_kaplan_meier() -> None:
    assert costs.start_quantiles([1.0, 2.0, 3.0, 4.0], [], n=4) == (1.0, 2.0, 3.0, 4.0)
    # censored at 5 (above every start seen): half the mass stays there, as a lower bound
    assert costs.start_quantiles([1.0], [5.0], n=4) == (1.0, 1.0, 5.0, 5.0)
    # censored at 0.5 (below): it says nothing about the longer one seen
    assert costs.start_quantiles([1.0], [0.5], n=2) == (1.0, 1.0)
    # 2 seen of 4 at risk at 3: the survivor past 3 is the censored 8
    assert costs.start_quantiles([1.0, 3.0], [2.0, 8.0], n=8) == (
        1.0, 1.0, 3.0, 3.0, 3.0, 8.0, 8.0, 8.0)
    assert costs.start_quantiles([], [3.0]) == ()


def test_the_prediction_is_the_mean_of_the_replays_and_says_their_spread() -> None:
    from types import SimpleNamespace

    runs = [SimpleNamespace(trained_samples=k, rolled_back_samples=b, node_seconds=n,
                            restores=r, rescales=3, preemptions=p)
            for k, b, n, r, p in ((900.0, 100.0, 60.0, 1, 4), (1100.0, 300.0, 80.0, 2, 5))]
    mean = s2r._mean_run(runs)
    assert (mean.trained_samples, mean.rolled_back_samples, mean.node_seconds) == \
        (1000.0, 200.0, 70.0)
    assert (mean.restores, mean.rescales, mean.preemptions) == (2, 3, 4)  # rounded half-even
    spread = s2r._spread(runs, 10.0, 120.0, mean)
    assert spread["count"] == 2 and spread["harvest_node_s_range"] == [100.0, 140.0]
    assert spread["harvest_sd"] == round(20.0 / 120.0, 4)   # node-s: 100 and 140
    assert spread["kept_sd"] == 0.1 and spread["rolled_back_sd"] == 0.5
    assert s2r._mean_run(runs[:1]) is runs[0]
