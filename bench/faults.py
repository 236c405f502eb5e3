"""Fault-injection results → the faults section of BENCHMARKS.md.

``tests/slurm/test_faults.py`` and ``tests/slurm/test_faults_site.py`` inject each fault into a
real malletraind on the real local Slurm cluster and, with ``MALLETRAIN_FAULTS_RESULTS=FILE``
set, append one JSON record per scenario that passed (scenario, outcome, samples lost beyond
the last checkpoint, notes). This script runs those test modules (``--run``) or reads such a file (``--results FILE``) and prints the
markdown table, or replaces the section between ``<!-- faults:begin -->`` and
``<!-- faults:end -->`` in BENCHMARKS.md (``--write``; appended when the markers are absent).

    python bench/faults.py --run --write
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- faults:begin -->", "<!-- faults:end -->"
TESTS = ("tests/slurm/test_faults.py", "tests/slurm/test_faults_site.py")


def run_tests(results: Path, extra: list[str]) -> tuple[int, float, str]:
    """Run the fault tests with the results file set; returns (exit code, seconds, summary)."""
    env = dict(os.environ, MALLETRAIN_FAULTS_RESULTS=str(results), MALLETRAIN_LONG_FAULTS="1")
    results.unlink(missing_ok=True)  # the test modules append to it
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "pytest", *TESTS, "-q", "-p",
                           "no:cacheprovider", *extra], cwd=REPO, env=env, capture_output=True, text=True,
                          check=False)
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    failed = [ln.split("::")[-1].split(" ")[0] for ln in lines if ln.startswith("FAILED ")]
    summary = lines[-1] if lines else "(no output)"
    if failed:
        summary = f"{summary.strip('= ')}; failed: {', '.join(failed)}"
    return proc.returncode, time.monotonic() - t0, summary


def load(path: Path) -> list[dict[str, Any]]:
    try:
        rows = json.loads(path.read_text())
    except FileNotFoundError:
        raise SystemExit(f"faults: {path} does not exist: run the fault tests with "
                         f"MALLETRAIN_FAULTS_RESULTS={path}, or give --run") from None
    except json.JSONDecodeError as exc:
        raise SystemExit(f"faults: {path} is not JSON ({exc}); rerun the fault tests") from None
    if not isinstance(rows, list) or not all(isinstance(r, dict) and "scenario" in r
                                             for r in rows):
        raise SystemExit(f"faults: {path} is not a list of scenario records; rerun the tests")
    return rows


def lost_cell(value: Any) -> str:
    if value is None:
        return "no training (stand-in workers)"
    return f"{int(value):,}"


def render(rows: list[dict[str, Any]], summary: str = "") -> str:
    """The section's markdown (between the markers, markers excluded)."""
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    head = (f"Measured {when} on {platform.processor() or platform.machine()}, "
            f"{os.cpu_count()} cores, with `python bench/faults.py --run --write` "
            f"({' and '.join(TESTS)} on an 8-node local Slurm cluster, the storm on a "
            "32-node one of its own, a real malletraind"
            + (f"; pytest: {summary}" if summary else "") + "). "
            f"{len(rows)} scenarios survived. Progress lost is the samples trained beyond "
            "the last checkpoint: the largest step any rank logged before the fault minus the "
            "step the next epoch resumed from, times the global batch (16 per rank × ranks); "
            "the training scenarios run examples/train_elastic.py with a checkpoint every 6 s "
            "(0.1 s per step). Every scenario ends with Slurm's view and the daemon's equal; "
            "those of the second file also with a one-node prod job that must start within "
            "10 s of its sbatch (on a full cluster it preempts an elastic task; its delay is "
            "in the notes).")
    table = ["| scenario | outcome | samples lost | notes |", "| --- | --- | --- | --- |"]
    for r in rows:
        table.append(f"| {r['scenario']} | {r.get('outcome', '')} | "
                     f"{lost_cell(r.get('samples_lost'))} | {r.get('note', '')} |")
    return head + "\n\n" + "\n".join(table) + "\n"


def write(section: str, path: Path) -> None:
    text = path.read_text() if path.exists() else ""
    block = f"{BEGIN}\n{section}{END}"
    if BEGIN in text and END in text:
        start = text.index(BEGIN)
        end = text.index(END) + len(END)
        text = text[:start] + block + text[end:]
    else:
        text = text.rstrip("\n") + "\n\n## Faults on a local Slurm cluster\n\n" + block + "\n"
    path.write_text(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--run", action="store_true", help=f"run {' and '.join(TESTS)} first")
    parser.add_argument("--results", type=Path, help="a results JSON file (default: a "
                        "temporary one with --run, else $MALLETRAIN_FAULTS_RESULTS)")
    parser.add_argument("--write", action="store_true", help="update BENCHMARKS.md")
    parser.add_argument("-k", dest="select", help="pytest -k selection (with --run)")
    args = parser.parse_args(argv)
    summary = ""
    with tempfile.TemporaryDirectory() as tmp:
        results = args.results or (Path(tmp) / "faults.json" if args.run else None)
        if results is None:
            env = os.environ.get("MALLETRAIN_FAULTS_RESULTS")
            if not env:
                parser.error("give --run, --results FILE or MALLETRAIN_FAULTS_RESULTS")
            results = Path(env)
        if args.run:
            code, took, summary = run_tests(results, ["-k", args.select] if args.select else [])
            summary = f"{summary.strip('= ')}, {took:.0f} s"
            print(f"faults: {summary}", file=sys.stderr)
            if code not in (0, 1):
                print(f"faults: pytest exited with {code}", file=sys.stderr)
                return code
        section = render(load(results), summary)
    if args.write:
        write(section, REPO / "BENCHMARKS.md")
        print("faults: BENCHMARKS.md updated", file=sys.stderr)
    else:
        print(section)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
