"""docs/extending.md shows the code that is in the repository, and its counts are right."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from malletrain_core.allocator import POLICIES
from malletrain_core.backends.registry import BATCH_SYSTEMS
from malletrain_core.backends.toy import ToyBackend, ToyCluster

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "extending.md").read_text()
NEW = re.findall(r"\*\*New file `([^`]+)`:\*\*\n\n```python\n(.*?)```", DOC, re.S)
EDITS = re.findall(r"\*\*In `([^`]+)`[^\n]*:\*\*\n\n```python\n(.*?)```", DOC, re.S)


def test_the_doc_names_its_examples_and_they_are_registered() -> None:
    assert {p for p, _ in NEW} == {"malletrain_core/backends/toy/__init__.py",
                                   "tests/world_toy.py", "malletrain_core/allocator/fifo.py",
                                   "tests/test_allocator_fifo.py"}
    assert len(EDITS) == 3
    assert "toy" in BATCH_SYSTEMS and "fifo" in POLICIES


@pytest.mark.parametrize("path", [p for p, _ in NEW])
def test_new_files_are_shown_whole(path: str) -> None:
    assert (ROOT / path).read_text() == dict(NEW)[path], f"docs/extending.md differs from {path}"


@pytest.mark.parametrize("path", [p for p, _ in EDITS])
def test_edits_are_in_the_files_in_order(path: str) -> None:
    lines = (ROOT / path).read_text().splitlines()
    at = 0
    for line in dict(EDITS)[path].splitlines():
        if line == "...":
            continue
        assert line in lines[at:], f"{path}: {line!r} is not where docs/extending.md says"
        at = lines.index(line, at) + 1


def test_line_counts_in_the_table() -> None:
    counts = re.findall(r"`([^`]+)` \(new, (\d+) lines\)", DOC)
    assert len(counts) == 4
    for short, n in counts:
        path = ROOT / short if (ROOT / short).exists() else ROOT / "malletrain_core" / short
        assert len(path.read_text().splitlines()) == int(n), short


def test_the_playing_snippet_runs(tmp_path: Path) -> None:
    (snippet,) = re.findall(r"## Playing with the toy.*?```python\n(.*?)```", DOC, re.S)
    state = tmp_path / "toy-cluster.json"
    exec(snippet.replace('"/var/lib/malletrain/toy-cluster.json"', repr(str(state))), {})
    cluster = ToyCluster(state)
    assert cluster.nodes == {"n1": "free", "n2": "taken", "n3": "free"}
    assert [job.end for job in cluster.jobs.values()] == ["completed"]
    assert ToyBackend(cluster).poll(0.0)  # the nodes are offered to a daemon reading it


def test_a_batch_systems_settings_take_the_lines_the_doc_shows() -> None:
    """Each batch system with settings is named on two lines of backends/sections.py, the import
    of its options class and its field, as the doc's PBS example shows; config.py names none."""
    (shown,) = re.findall(r"`malletrain_core/backends/sections\.py` takes.*?```python\n(.*?)```",
                          DOC, re.S)
    source = (ROOT / "malletrain_core" / "backends" / "sections.py").read_text().splitlines()
    for line in shown.splitlines():
        assert line == "..." or line in source, f"backends/sections.py has no line {line!r}"
    config_py = (ROOT / "malletrain_core" / "config.py").read_text()
    for entry in BATCH_SYSTEMS.values():
        if entry.options is None:
            continue
        name = entry.options.__name__
        assert not re.search(rf"\b{name}\b", config_py), f"config.py names {name}"
        naming = [ln.strip() for ln in source if re.search(rf"\b{name}\b", ln)]
        assert naming == [f"from .{entry.section}.options import {name}",
                          f"{entry.section}: {name} = field(default_factory={name})"], naming
