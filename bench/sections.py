"""Shared by the bench scripts: one section of BENCHMARKS.md, rewritten in place."""

from __future__ import annotations

from pathlib import Path


def replace_section(path: Path, begin: str, end: str, body: str, heading: str) -> None:
    """Put ``body`` (which starts with ``begin`` and ends with ``end``) where the old section
    was, or append it under ``## heading`` when the file has none yet."""
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        text = head + body + rest.split(end, 1)[1]
    else:
        text = text.rstrip("\n") + f"\n\n## {heading}\n\n" + body + "\n"
    path.write_text(text)
