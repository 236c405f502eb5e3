"""bench.profiler_sweep: its windows, its statistics and a --quick sweep end to end (two
half-day Theta windows, both policies replayed), and the section it writes."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from malletrain_core.sim.traces import DAY_S, Trace


@pytest.fixture(scope="module")
def sweep() -> ModuleType:
    import bench.profiler_sweep

    return bench.profiler_sweep


def _trace(days: float) -> Trace:
    times = np.arange(1, int(days * 24)) * 3600.0
    return Trace("t", ("n1", "n2"), 0.0, days * DAY_S, np.array([0], np.int32), times,
                 np.arange(len(times) + 1, dtype=np.int64), np.zeros(len(times), np.int32),
                 np.ones(len(times), bool))


def test_windows_are_drawn_by_the_seed_inside_the_trace(sweep: ModuleType) -> None:
    trace = _trace(60.0)
    a = sweep.draw_windows(trace, 5, 14.0, 3)
    assert a == sweep.draw_windows(trace, 5, 14.0, 3) != sweep.draw_windows(trace, 5, 14.0, 4)
    assert a == sorted(a) and all(0 <= x <= 46 * DAY_S for x in a)
    assert sweep.draw_windows(_trace(14.0), 3, 14.0, 0) == [0.0]  # no room: the whole trace
    cut = sweep.cut(trace, a[0], 14.0)
    assert cut.span_s == pytest.approx(14 * DAY_S) and cut.start >= a[0] - 3600.0


def test_statistics_over_rows(sweep: ModuleType) -> None:
    rows = [{"gap_pt": g, "per_seed": [{"gap_pt": g - 0.1}, {"gap_pt": g + 0.2}]}
            for g in (0.1, 0.3, 0.2, 0.9, 0.0)]
    got = sweep.summarize(rows)
    assert got["median_gap_pt"] == 0.2 and got["worst_gap_pt"] == 0.9
    assert got["p90_gap_pt"] == pytest.approx(0.3 + 0.6 * 0.6)
    assert got["worst_seed_gap_pt"] == pytest.approx(1.1)


def test_quick_sweep_replays_both_policies_and_writes_its_section(
        sweep: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sweep.json"
    assert sweep.main(["--quick", "--json", "--out", str(out)]) == 0
    captured = capsys.readouterr()
    rec = json.loads(captured.out.strip().splitlines()[-1])
    assert rec == json.loads(out.read_text())
    assert "[2/2] swf day" in captured.err  # one progress line per replay
    assert rec["windows"] == 2 and len(rec["rows"]) == 2 and rec["days"] == 0.5
    for row in rec["rows"]:
        (seed,) = row["per_seed"]
        assert row["gap_pt"] == pytest.approx(
            100 * (seed["freetrain-exact"]["share"] - seed["malletrain"]["share"]), abs=2e-3)
        assert 0.5 < seed["malletrain"]["share"] <= 1.0 and seed["misfit"]
    gaps = sorted(r["gap_pt"] for r in rec["rows"])
    assert rec["worst_gap_pt"] == gaps[-1] and rec["median_gap_pt"] == pytest.approx(
        sum(gaps) / 2, abs=1e-3)
    md = tmp_path / "B.md"
    md.write_text("# Benchmarks\n")
    assert sweep.main(["--markdown", str(md), "--from", str(out)]) == 0
    text = md.read_text()
    assert sweep.BEGIN in text and f"worst {rec['worst_gap_pt']:.2f} pt" in text
    assert text.count("| swf |") == 2 and "Where it is worst" in text


def test_parts_of_a_sweep_merge_by_window_and_cost(sweep: ModuleType) -> None:
    def part(seed: int, gap: float) -> dict[str, object]:
        per = {"seed": seed, "gap_pt": gap, "malletrain": {"share": 0.99 - gap / 100},
               "freetrain-exact": {"share": 0.99}}
        return {"window_seed": 0, "days": 14.0, "jobs": 50, "wall_s": 10.0,
                "rows": [{"trace": "swf", "start_day": 3.0, "cost": "inplace", "gap_pt": gap,
                          "per_seed": [per]},
                         {"trace": "swf", "start_day": 9.0, "cost": "inplace", "gap_pt": 0.0,
                          "per_seed": [{**per, "gap_pt": 0.0}]}]}

    got = sweep.merge([part(0, 0.2), part(1, 0.6), part(1, 0.6)])  # a part given twice: once
    row = next(r for r in got["rows"] if r["start_day"] == 3.0)
    assert row["seeds"] == [0, 1] and row["gap_pt"] == pytest.approx(0.4)
    assert got["windows"] == 2 and got["worst_gap_pt"] == pytest.approx(0.4)
    assert got["wall_s"] == 30.0
    with pytest.raises(ValueError):
        sweep.merge([part(0, 0.2), {**part(1, 0.1), "days": 7.0}])
