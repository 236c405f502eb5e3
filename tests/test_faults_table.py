"""bench/faults.py's table on made-up rows: samples lost on the restart and the in-place path
side by side, "—" with the reason where a scenario did not run in place or failed there, the
daemon's epoch history in the notes; and bad paths refused with one line."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from script_module import load_script


@pytest.fixture(scope="module")
def faults() -> ModuleType:
    return load_script("bench/faults.py", "faults_bench")


ROWS: list[dict[str, Any]] = [
    {"scenario": "node failure", "outcome": "recovered", "samples_lost": 240, "note": "",
     "test": "test_node", "path": "restart"},
    {"scenario": "storm", "outcome": "ran", "samples_lost": None, "note": "64 events",
     "test": "test_storm", "path": "restart"},
    {"scenario": "killed mid-shrink", "outcome": "recovered", "samples_lost": 48,
     "note": "prod 0.1 s", "test": "test_kill[shrink]", "path": "restart"},
    {"scenario": "old row without a path", "outcome": "ok", "samples_lost": 0, "note": ""},
    {"scenario": "node failure", "outcome": "recovered in place", "samples_lost": 0,
     "note": "", "test": "test_node", "path": "inplace",
     "epochs": [[0, 3, "disk", False], [1, 2, "inplace", True], [2, 3, "inplace", False]]},
    {"test": "test_storm", "path": "inplace", "not_run": "stand-in workers"},
    {"scenario": "only in place", "outcome": "ok", "samples_lost": 16, "note": "",
     "test": "test_new", "path": "inplace", "epochs": [[0, 2, "disk", False]]},
    {"pass": "restart", "summary": "4 passed, 900 s"},
    {"pass": "inplace", "summary": "2 passed, 1 failed, 200 s"},
]


def cells(section: str, scenario: str) -> list[str]:
    line = next(ln for ln in section.splitlines() if ln.startswith(f"| {scenario} |"))
    return [c.strip() for c in line.strip("|").split("|")]


def test_both_paths_side_by_side(faults: ModuleType) -> None:
    section = faults.render(ROWS, "restart: 4 passed", {"inplace": {"test_kill[shrink]"}})
    assert "| samples lost, restart | samples lost, in place |" in section
    assert "pytest: restart: 4 passed, 900 s; inplace: 2 passed, 1 failed, 200 s" in section
    assert "4 scenarios survived on the restart path, 2 on the in-place path" in section
    node = cells(section, "node failure")
    assert node[2:4] == ["240", "0"]
    assert "epochs 0:disk/3 1:inplace/2 (abandon) 2:inplace/3" in node[4]
    assert cells(section, "storm")[2:4] == ["no training (stand-in workers)",
                                            "— (stand-in workers)"]
    assert cells(section, "killed mid-shrink")[2:] == ["48", "— (failed in place)",
                                                       "prod 0.1 s"]
    assert cells(section, "old row without a path")[2:4] == ["0", "— (not run)"]
    assert cells(section, "only in place")[2:4] == ["— (not run)", "16"]


def test_keep_reruns_one_path_only(faults: ModuleType, tmp_path: Path,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    results = tmp_path / "faults.json"
    results.write_text(json.dumps(ROWS))
    seen: list[list[dict[str, Any]]] = []

    def run_tests(path_: Path, extra: list[str], path: str) -> tuple[int, float, str, list[str]]:
        seen.append(json.loads(path_.read_text()))
        rows = seen[-1] + [{"scenario": "node failure", "outcome": "again", "samples_lost": 8,
                            "note": "", "test": "test_node", "path": "inplace"}]
        path_.write_text(json.dumps(rows))
        return 0, 1.0, "1 passed", []

    monkeypatch.setattr(faults, "run_tests", run_tests)
    assert faults.main(["--run", "--paths", "inplace", "--keep", "--results",
                        str(results)]) == 0
    assert {r.get("path", r.get("pass")) for r in seen[0]} == {"restart", None}
    rows = json.loads(results.read_text())
    assert [r["summary"] for r in rows if "pass" in r] == ["4 passed, 900 s", "1 passed, 1 s"]
    assert [r["samples_lost"] for r in rows if r.get("path") == "inplace"] == [8]


def test_bad_paths_are_refused(faults: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        faults.main(["--run", "--paths", "inplace,disk"])
    assert "give restart, inplace or restart,inplace" in capsys.readouterr().err
