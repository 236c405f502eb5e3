"""The JSON objects a worker prints one a line among its other output (step records, re-forms,
first-step times): one reader for the tests that assert on them and the benches that time them.
A line cut short by a kill, or any line that is not such an object, is skipped."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any


def json_line(line: str, prefix: str = "{") -> dict[str, Any] | None:
    """``line`` as a dict when it starts with ``prefix`` and parses as a JSON object, else
    None."""
    if not line.startswith(prefix):
        return None
    try:
        rec = json.loads(line)
    except ValueError:
        return None
    return rec if isinstance(rec, dict) else None


def json_lines(lines: Iterable[str], prefix: str = "{") -> list[dict[str, Any]]:
    """Every JSON object of ``lines`` whose line starts with ``prefix``, in order."""
    return [rec for line in lines if (rec := json_line(line, prefix)) is not None]


def read_json_lines(*paths: Path, prefix: str = "{") -> list[dict[str, Any]]:
    """:func:`json_lines` of the files ``paths`` one after the other (one missing: none)."""
    return [rec for path in paths if path.exists()
            for rec in json_lines(path.read_text(errors="replace").splitlines(), prefix)]
