"""Paths shared by the PBS tests (a module of its own: every test folder has a conftest)."""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent
FAKE = HERE / "fakepbs"
FIXTURES = HERE / "fixtures"
GOLDEN = HERE / "golden"
HOOK = HERE.parent.parent / "pbs_hooks" / "malletrain_pbs.py"
