"""The demo's live view: one compact block redrawn in place on a terminal, plain lines
otherwise. Built from the same squeue/sinfo samples the summary uses."""

from __future__ import annotations

import string
import sys
from collections.abc import Sequence
from typing import TextIO

from .summary import Sample

_MARKS = string.ascii_lowercase


class LiveView:
    """Renders samples; ``out`` defaults to stdout, redrawn in place when it is a terminal."""

    def __init__(self, nodes: Sequence[str], out: TextIO | None = None,
                 tty: bool | None = None) -> None:
        self.nodes = list(nodes)
        self.out = out if out is not None else sys.stdout
        self.tty = self.out.isatty() if tty is None else tty
        self._drawn = 0
        self._marks: dict[str, str] = {}

    def mark(self, job: str) -> str:
        """A letter per elastic job, in order of first appearance."""
        if job not in self._marks:
            self._marks[job] = _MARKS[len(self._marks) % len(_MARKS)]
        return self._marks[job]

    def strip(self, sample: Sample) -> str:
        """One character per node: P prod, a letter = harvested by that job, . idle, x down."""
        chars = []
        for n in self.nodes:
            if n in sample.prod:
                chars.append("P")
            elif n in sample.down:
                chars.append("x")
            elif n in sample.harvested:
                chars.append(self.mark(sample.harvested[n]))
            else:
                chars.append(".")
        return "".join(chars)

    def lines(self, elapsed_s: float, sample: Sample, rescales: int, preemptions: int,
              note: str = "") -> list[str]:
        idle = len(self.nodes) - len(sample.prod | sample.down)
        jobs = " ".join(f"{self.mark(j)}={j}:{k}" for j, k in sorted(
            sample.jobs.items(), key=lambda jk: (len(jk[0]), jk[0])))
        head = (f"[{elapsed_s:6.1f}s] prod {len(sample.prod):2d}  idle {idle:2d}  harvested "
                f"{len(sample.harvested):2d}  prod pending {sample.pending_prod}  rescales "
                f"{rescales}  preemptions {preemptions}")
        if not self.tty:
            return [f"{head}  jobs {jobs or '-'}" + (f"  {note}" if note else "")]
        return [head, f"  nodes {self.strip(sample)}   (P prod, letter = elastic job, . idle)",
                f"  jobs  {jobs or '-'}   (job:running tasks)"] + ([f"  {note}"] if note else [])

    def show(self, elapsed_s: float, sample: Sample, rescales: int, preemptions: int,
             note: str = "") -> None:
        lines = self.lines(elapsed_s, sample, rescales, preemptions, note)
        if self.tty and self._drawn:
            self.out.write(f"\x1b[{self._drawn}F")
        for line in lines:
            self.out.write(("\x1b[2K" if self.tty else "") + line + "\n")
        self._drawn = len(lines) if self.tty else 0
        self.out.flush()

    def message(self, text: str) -> None:
        """A line that stays above the live block."""
        if self.tty and self._drawn:
            self.out.write(f"\x1b[{self._drawn}F\x1b[J")
            self._drawn = 0
        self.out.write(text + "\n")
        self.out.flush()
