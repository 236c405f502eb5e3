"""Shared fixtures for the test suite."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

# The development tools (devtools/: the local test clusters, the demo) are not installed with
# the package: the tests import them from the checkout.
_REPO = str(Path(__file__).resolve().parents[1])
if _REPO not in sys.path:
    sys.path.insert(0, _REPO)

# The backend contract's scenarios assert outside the test modules: show what they compared.
pytest.register_assert_rewrite("backend_contract", "live_contract")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--slurm-release", default=None, metavar="RELEASE",
                     help="Slurm release of the local test cluster: 22.05 (the host's, the "
                     "default), 24.11 or 25.11 (scripts/setup-slurm-matrix.sh); the same as "
                     "MALLETRAIN_SLURM")


def pytest_configure(config: pytest.Config) -> None:
    name = config.getoption("--slurm-release")
    if name:
        from devtools.localcluster.releases import release
        from malletrain_core.errors import ConfigError
        try:
            release(name)
        except ConfigError as exc:
            raise pytest.UsageError(str(exc).replace("MALLETRAIN_SLURM", "--slurm-release")) from None
        os.environ["MALLETRAIN_SLURM"] = name


_RERUNS: list[tuple[str, str, list[str]]] = []
"""Each failed first try that pytest-rerunfailures ran again: (test, phase, why)."""


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.outcome != "rerun":
        return
    crash = getattr(report.longrepr, "reprcrash", None)
    lines = [f"{crash.path}:{crash.lineno}"] if crash is not None else []
    lines += [line for line in report.longreprtext.splitlines() if line.startswith("E ")][:20]
    _RERUNS.append((report.nodeid, report.when, lines))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """A rerun that passed still says why its first try failed: a scheduling wait that timed
    out under load, or a real fault that happened to pass the second time."""
    if not _RERUNS:
        return
    terminalreporter.section("reruns: why the first try failed")
    for nodeid, when, lines in _RERUNS:
        terminalreporter.line(f"RERUN {nodeid} ({when})")
        for line in lines:
            terminalreporter.line(f"    {line}")


@pytest.fixture
def write_json(tmp_path: Path) -> Callable[[Any, str], str]:
    """Write a JSON document (or raw text, when given a str) to a file and return its path."""

    def write(document: Any, name: str = "problem.json") -> str:
        path = tmp_path / name
        path.write_text(document if isinstance(document, str) else json.dumps(document))
        return str(path)

    return write


@pytest.fixture(autouse=True)
def _root_logging_restored() -> Any:
    """Commands under test (malletraind's main) install their own root log handler on the
    stream of that test; put the root logger back so later tests do not write to it."""
    import logging

    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        if handler not in handlers:
            root.removeHandler(handler)
    for handler in handlers:
        if handler not in root.handlers:
            root.addHandler(handler)
    root.setLevel(level)
