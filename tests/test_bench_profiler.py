"""bench/profiler.py: the curve-error arithmetic on a made-up engine state, and the Profiler
section it writes from records (the figures themselves come from running it)."""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest

from malletrain_core.engine import JobPhase
from malletrain_core.model import Curve
from malletrain_core.sim.workloads import SimJob


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return importlib.import_module("bench.profiler")


def test_curve_errors_weigh_jobs_by_their_nodes(bench: ModuleType) -> None:
    true = Curve.of([1, 2, 4], [10.0, 20.0, 40.0])
    jobs = [SimJob(j, "m", true, 1, 4, 18.0, 12.0, None, 0.0) for j in ("a", "b", "q")]
    errors = bench.CurveErrors(jobs)
    errors(0.0)  # no engine yet: nothing sampled
    views = {"a": SimpleNamespace(id="a", phase=JobPhase.RUNNING, nodes=("n1", "n2", "n3", "n4"),
                                  curve=true.scaled(1.1)),  # 10 % high, slope 10 % high
             "b": SimpleNamespace(id="b", phase=JobPhase.PROFILING, nodes=("n5", "n6"),
                                  curve=None),
             "q": SimpleNamespace(id="q", phase=JobPhase.QUEUED, nodes=(), curve=None)}
    errors.engine = SimpleNamespace(jobs=views)
    errors(0.5)
    figures = errors.figures(span_s=3600.0)
    assert figures["level_error"] == pytest.approx(0.1)
    assert figures["slope_error"] == pytest.approx(0.1)
    assert figures["profiling_node_share"] == pytest.approx(2 / 6, abs=1e-5)
    assert figures["queued_job_h"] == pytest.approx(1.0)


def test_the_section_is_rewritten_from_records(bench: ModuleType, tmp_path: Path) -> None:
    seed = {"seed": 0, "malletrain": {"share": 0.975, "rescales": 8000, "level_error": 0.012,
                                      "slope_error": 0.037, "profiling_node_share": 0.0015,
                                      "queued_job_h": 1.5},
            "freetrain-exact": {"share": 0.977, "rescales": 7900}}
    record = {"label": "abc1234", "trace": "summit", "days": 2.0, "seeds": [0],
              "per_seed": [seed], "gap_points": 0.2}
    rec = tmp_path / "rec.json"
    rec.write_text("progress line\n" + json.dumps(record) + "\n")
    notes = tmp_path / "notes.md"
    notes.write_text("What changed.\n")
    md = tmp_path / "B.md"
    md.write_text("# Benchmarks\n\n## Other\n\nkept\n")
    assert bench.main(["--markdown", str(md), "--records", str(rec), "--notes", str(notes)]) == 0
    text = md.read_text()
    assert "kept" in text and "## Profiler" in text and "What changed." in text
    assert "| abc1234 | summit 2 d, seeds 0 | 97.50 % | 97.70 % | **0.20** | 8,000 / 7,900 |" \
        in text
    assert str(tmp_path) not in text  # file names only, not this machine's paths
    bench.main(["--markdown", str(md), "--records", str(rec)])
    assert md.read_text().count(bench.BEGIN) == 1 and "What changed." not in md.read_text()
