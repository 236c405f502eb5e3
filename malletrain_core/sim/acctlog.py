"""What the accounting readers (:mod:`.sacct`, :mod:`.pbsacct`) produce and share: a job's
run (:class:`JobRun`), the malformed records noted (:class:`Skips`) and one file's result
(:class:`AccountingLog`). :mod:`.accounting` reads any of them into a trace; the readers need
only this module, so that no reader and the dispatcher import each other."""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

MAX_NOTED = 50
"""Malformed records reported one line each; past this many, only counted (a log broken on
every line must not bury the result)."""

Warn = Callable[[str], None]


def _stderr(line: str) -> None:
    print(line, file=sys.stderr)


@dataclass(frozen=True)
class JobRun:
    """One job (or array task) holding ``nodes`` from ``start`` to ``end`` (None: still
    running when the log was taken)."""

    job: str
    start: float
    end: float | None
    nodes: tuple[str, ...]
    partition: str = ""
    reservation: str = ""
    state: str = ""
    gpus: int = 0
    """The GPUs the run held, as the log says (0: none, or the log does not say)."""


GPU_TRES = re.compile(r"(?:^|,)gres/gpu(?::[^=,]*)?=(\d+)")


def gpus_in_tres(text: str) -> int:
    """The GPUs a Slurm TRES string holds (``cpu=4,gres/gpu=2,...``; a typed count such as
    ``gres/gpu:a100=2`` beside the plain one is not counted twice)."""
    plain = [int(n) for n in re.findall(r"(?:^|,)gres/gpu=(\d+)", text)]
    return sum(plain) if plain else sum(int(n) for n in GPU_TRES.findall(text))


@dataclass
class Skips:
    """Malformed or partial records: each reported as one line through ``warn`` (the first
    :data:`MAX_NOTED`), all counted."""

    path: str
    warn: Warn | None = _stderr
    count: int = 0
    lines: list[str] = field(default_factory=list)

    def note(self, where: str, why: str) -> None:
        self.count += 1
        if self.count <= MAX_NOTED:
            line = f"{self.path}:{where}: skipped: {' '.join(why.split())[:160]}"
            self.lines.append(line)
            if self.warn is not None:
                self.warn(line)

    def close(self) -> None:
        """The count line when more were skipped than reported."""
        if self.count > MAX_NOTED and self.warn is not None:
            self.warn(f"{self.path}: {self.count} malformed records skipped in all "
                      f"(the first {MAX_NOTED} named above)")


@dataclass(frozen=True)
class AccountingLog:
    """What a reader got from one file: the runs, how many records it read and skipped."""

    path: str
    kind: str
    runs: list[JobRun]
    records: int
    skipped: int
    not_run: int
    """Records of jobs that never ran (no start, or no node): not errors, hold nothing."""

    @property
    def gpu_runs(self) -> int:
        """The runs that held GPUs (0 also when the log does not say: see each reader)."""
        return sum(1 for r in self.runs if r.gpus > 0)
