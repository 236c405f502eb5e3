"""bench/e2e_pbs_paths.py without a complex: its section from a run's JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

m = pytest.importorskip("bench.e2e_pbs_paths")
RESULT = Path(__file__).resolve().parents[1] / "bench" / "results" / "e2e_pbs_paths.json"


def test_section_from_a_run():
    r = json.loads(RESULT.read_text())
    text = m.section(r, "python -m bench.e2e_pbs_paths")
    assert text.startswith(m.BEGIN) and text.endswith(m.END)
    p = r["inplace"]
    assert f"| {p['preempt_pause_s']:.3f} s |" in text
    assert f"| {p['shrink_pause_s']:.3f} s |" in text
    assert text.count("\n| ") == 4  # the header and one row per kind of change
    assert "subjobs lost for good: 0." in text


def test_markdown_replaces_the_section(tmp_path):
    r = json.loads(RESULT.read_text())
    doc = tmp_path / "B.md"
    doc.write_text(f"# B\n\n{m.BEGIN}\nold\n{m.END}\n\nafter\n")
    m.replace_section(doc, m.BEGIN, m.END, m.section(r, "cmd"), "x")
    text = doc.read_text()
    assert "old" not in text and text.endswith("after\n") and "`cmd`" in text
