"""Shared by the bench scripts: the progress line, and one section of BENCHMARKS.md rewritten
in place."""

from __future__ import annotations

import os
import platform
import re
import sys
import time
from pathlib import Path


def host(extra: str = "") -> str:
    """The CPU, its cores, the load at the end, ``extra`` (the cluster benches name Slurm's
    version) and Python's version, for a section's first line."""
    cpu = platform.processor() or platform.machine()
    try:
        m = re.search(r"^model name\s*:\s*(.+)$", Path("/proc/cpuinfo").read_text(), re.M)
        cpu = m.group(1).strip() if m else cpu
        load = Path("/proc/loadavg").read_text().split()[0]
    except OSError:
        load = "n/a"
    extra = f"{extra}, " if extra else ""
    return (f"{cpu}, {os.cpu_count()} cores (1-min load {load} at the end), {extra}"
            f"Python {platform.python_version()}")


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


def say(msg: str) -> None:
    """One progress line on stderr, with the time of day (stdout carries the result)."""
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)
