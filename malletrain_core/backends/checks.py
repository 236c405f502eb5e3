"""What ``malletrain admin check`` reports, shared by every batch system's checks.

A batch system's registry entry (:class:`~.system.BatchSystem`) carries its own checks
(``backends/slurm/checks.py``, ``backends/pbs/checks.py``); they build their verdicts from
this module, and the command prints them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Check:
    """One verdict: ``status`` is OK, WARN (works, with a limit), MISSING or WRONG; ``fix``
    says what to do if not OK."""

    check: str
    status: str
    detail: str
    fix: str = ""

    @property
    def ok(self) -> bool:
        return self.status in ("OK", "WARN")


def ok(check: str, detail: str) -> Check:
    return Check(check, "OK", detail)


def warn(check: str, detail: str, fix: str) -> Check:
    return Check(check, "WARN", detail, fix)


def missing(check: str, detail: str, fix: str) -> Check:
    return Check(check, "MISSING", detail, fix)


def wrong(check: str, detail: str, fix: str) -> Check:
    return Check(check, "WRONG", detail, fix)
