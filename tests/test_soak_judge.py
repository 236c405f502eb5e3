"""bench/soak.py's judgement, on made-up samples: flat series pass, growing ones fail, the
journal's compaction sawtooth is judged by its peaks, and every target follows its figure."""

from __future__ import annotations

import math
from types import ModuleType
from typing import Any

import pytest
from script_module import load_script


@pytest.fixture(scope="module")
def soak() -> ModuleType:
    return load_script("bench/soak.py", "soak_bench")


def result(rss: Any, rows: Any, db: Any, p99: float = 0.5, lost: int = 0) -> dict[str, Any]:
    samples = [{"t": float(t), "rss_mib": rss(t), "fds": 40, "threads": 30, "children": 0,
                "journal_rows": rows(t), "db_bytes": db(t)} for t in range(0, 3600, 10)]
    return {"window_s": [1500.0, 3000.0], "samples": samples,
            "settings": {"journal_max_events": 5000},
            "prod": {"p99_s": p99},
            "jobs": {"lost": [], "revived": []},
            "reports": {"lost": lost}}


def flat(t: float) -> float:
    return 50.0


def sawtooth(t: float) -> float:
    return 100 + 4900 * ((t % 300) / 300)  # compacted every 300 s


def test_flat_memory_and_a_bounded_sawtooth_journal_pass(soak: ModuleType) -> None:
    r = result(lambda t: 50 + 0.3 * math.sin(t / 50), sawtooth, lambda t: 1e6 + 400 * sawtooth(t))
    j = soak.judge(r)
    assert j["rss_flat"] and j["journal_flat"] and j["fds_threads_flat"]
    assert all(j["targets"].values()), j["targets"]


def test_a_descriptor_peak_passes_a_descriptor_leak_fails(soak: ModuleType) -> None:
    r = result(flat, sawtooth, lambda t: 1e6 + 400 * sawtooth(t))
    for s in r["samples"]:  # launchers come and go: 45-52, one peak of 57 late in the window
        s["fds"] = 57 if s["t"] == 2900 else 45 + int(s["t"] / 10) % 8
    assert soak.judge(r)["fds_threads_flat"]
    for s in r["samples"]:  # one descriptor more every 5 minutes: 5 over the window
        s["fds"] = 45 + int(s["t"] / 300)
    assert not soak.judge(r)["fds_threads_flat"]


def test_growing_memory_fails(soak: ModuleType) -> None:
    # +1 MiB every 5 minutes: 5 MiB over the 25-minute window, 10 % of ~52 MiB.
    j = soak.judge(result(lambda t: 40 + t / 300, sawtooth, lambda t: 1e6 + 400 * sawtooth(t)))
    assert not j["rss_flat"] and not j["targets"]["memory_and_journal_flat"]
    assert j["rss_mib"]["fit_growth"] == pytest.approx(1490 / 300, rel=0.01)


def test_an_unbounded_journal_or_a_growing_database_fails(soak: ModuleType) -> None:
    assert not soak.judge(result(flat, lambda t: 2 * t, lambda t: 1e6 + 400 * t))["journal_flat"]
    # The rows stay bounded, but each peak of the database is larger (a snapshot that grows).
    growing = soak.judge(result(flat, sawtooth, lambda t: 1e6 + 400 * sawtooth(t) + 2000 * t))
    assert not growing["journal_flat"]


def test_targets_follow_prod_delays_and_lost_reports(soak: ModuleType) -> None:
    j = soak.judge(result(flat, sawtooth, lambda t: 2e6, p99=1.6, lost=3))
    assert j["journal_flat"] and j["rss_flat"]
    assert not j["targets"]["prod_p99_within_1_5_s"]
    assert not j["targets"]["no_lost_reports"]


def test_quantile_and_fit(soak: ModuleType) -> None:
    xs = [float(i) for i in range(1, 101)]
    assert soak.pct(xs, 0.5) == 50.0 and soak.pct(xs, 0.99) == 99.0
    assert soak.fit_growth([0.0, 10.0, 20.0], [1.0, 2.0, 3.0]) == pytest.approx(2.0)
    assert soak.fit_growth([5.0], [1.0]) == 0.0


def test_reports_are_balanced_over_the_run_not_per_life(soak: ModuleType) -> None:
    """A report sent during a restart and received by the next daemon is not lost: the per
    life figures (1, -1) cancel; one that nobody received beyond the restart windows is."""
    lives = [{"sent_at_start": 0, "sent_at_end": 100, "received": 99, "dropped": {}},
             {"sent_at_start": 103, "sent_at_end": 200, "received": 98, "dropped": {}}]
    log = ("x final intake counts: reports received 99, dropped {}\n"
           "y final intake counts: reports received 100, dropped {\"bad signature\":1}\n")
    finals = soak.final_counts(log)
    assert finals == [(99, {}), (100, {"bad signature": 1})]
    r = soak.report_balance(lives, finals)
    assert r["counts_final"] and r["unaccounted_per_life"] == [1, -4]
    assert (r["sent"], r["received"], r["not_received"], r["sent_while_restarting"]) == (
        200, 199, 0, 3)
    assert r["lost"] == 0
    r = soak.report_balance(lives, finals[:1])  # a life killed: its last status counts
    assert not r["counts_final"] and r["not_received"] == 3 and r["lost"] == 0
    lives[1]["received"] = 90
    assert soak.report_balance(lives, finals[:1])["lost"] == 8
