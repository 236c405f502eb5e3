"""What a user changes to run an ordinary training script elastically: ``diff -u`` of each
example's before/after pair, counted (target: at most 10 changed lines)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
LIMIT = 10


def changed_lines(before: Path, after: Path) -> list[str]:
    """The removed and added lines of ``diff -u before after`` (headers excluded)."""
    proc = subprocess.run(["diff", "-u", str(before), str(after)], capture_output=True,
                          text=True, check=False)
    assert proc.returncode in (0, 1), proc.stderr
    return [line for line in proc.stdout.splitlines()
            if line[:1] in "+-" and not line.startswith(("+++ ", "--- "))]


@pytest.mark.skipif(shutil.which("diff") is None, reason="diff not installed")
@pytest.mark.parametrize("name", ["torchrun", "lightning", "hf"])
def test_diff_is_at_most_ten_lines(name: str) -> None:
    folder = EXAMPLES / name
    lines = changed_lines(folder / "before.py", folder / "after.py")
    assert 0 < len(lines) <= LIMIT, "\n".join(lines)
    assert any("malletrain_core.worker" in line for line in lines)


def test_the_count_sees_every_changed_line(tmp_path: Path) -> None:
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("x = 1\ny = 2\nz = 3\n")
    b.write_text("x = 1\ny = 20\nz = 3\nw = 4\n")
    assert changed_lines(a, b) == ["-y = 2", "+y = 20", "+w = 4"]


TITLES = {"torchrun": "Plain torchrun + DCP", "lightning": "PyTorch Lightning",
          "hf": "Hugging Face Trainer"}


@pytest.mark.skipif(shutil.which("diff") is None, reason="diff not installed")
@pytest.mark.parametrize("name", sorted(TITLES))
def test_docs_show_the_current_diff_and_its_count(name: str) -> None:
    doc = (EXAMPLES.parent / "docs" / "bring-your-own-loop.md").read_text()
    lines = changed_lines(EXAMPLES / name / "before.py", EXAMPLES / name / "after.py")
    assert f"## {TITLES[name]}: {len(lines)} changed lines" in doc
    for line in lines:
        assert line in doc.splitlines(), f"docs miss {line!r}"
