"""Fault-injection results → the faults section of BENCHMARKS.md.

``tests/slurm/test_faults.py`` and ``tests/slurm/test_faults_site.py`` inject each fault into a
real malletraind on the real local Slurm cluster and, with ``MALLETRAIN_FAULTS_RESULTS=FILE``
set, append one JSON record per scenario that passed (scenario, outcome, samples lost beyond
the last checkpoint, notes, the path the training jobs took, and in place the daemon's epoch
history). This script runs those test modules (``--run``) once per path (``restart``, then
``inplace`` with ``MALLETRAIN_FAULTS_PATH=inplace``, where only the scenarios that change an
epoch under the fault run; ``--paths`` picks), or reads such a file (``--results FILE``), and
prints the markdown table (samples lost on each path side by side), or replaces the section
between ``<!-- faults:begin -->`` and ``<!-- faults:end -->`` in BENCHMARKS.md (``--write``;
appended when the markers are absent).

    python -m bench.faults --run --write
    python -m bench.faults --run --paths inplace --keep --results FILE --write  # one path again
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


PATHS = ("restart", "inplace")


def run_tests(results: Path, extra: list[str],
              path: str = "restart") -> tuple[int, float, str, list[str]]:
    """Run the fault tests on ``path`` with the results file set (the rows are appended to
    it); returns (exit code, seconds, summary, the tests that failed)."""
    env = dict(os.environ, MALLETRAIN_FAULTS_RESULTS=str(results), MALLETRAIN_LONG_FAULTS="1",
               MALLETRAIN_FAULTS_PATH=path)
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "pytest", *TESTS, "-q", "-p",
                           "no:cacheprovider", *extra], cwd=REPO, env=env, capture_output=True, text=True,
                          check=False)
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    failed = [ln.split("::")[-1].split(" ")[0] for ln in lines if ln.startswith("FAILED ")]
    summary = lines[-1] if lines else "(no output)"
    if failed:
        summary = f"{summary.strip('= ')}; failed: {', '.join(failed)}"
    return proc.returncode, time.monotonic() - t0, summary, failed


def load(path: Path) -> list[dict[str, Any]]:
    try:
        rows = json.loads(path.read_text())
    except FileNotFoundError:
        raise SystemExit(f"faults: {path} does not exist: run the fault tests with "
                         f"MALLETRAIN_FAULTS_RESULTS={path}, or give --run") from None
    except json.JSONDecodeError as exc:
        raise SystemExit(f"faults: {path} is not JSON ({exc}); rerun the fault tests") from None
    if not isinstance(rows, list) or not all(isinstance(r, dict) and (
            "scenario" in r or "not_run" in r or "pass" in r) for r in rows):
        raise SystemExit(f"faults: {path} is not a list of scenario records; rerun the tests")
    return rows


def lost_cell(value: Any) -> str:
    if value is None:
        return "no training (stand-in workers)"
    return f"{int(value):,}"


def history_cell(epochs: list[list[Any]]) -> str:
    """The daemon's epoch history in short: ``3:disk/2 4:inplace/3 5:inplace/2 (abandon)``."""
    return " ".join(f"{e}:{p}/{w}" + (" (abandon)" if a else "") for e, w, p, a in epochs)


def inplace_cell(row: dict[str, Any] | None) -> str:
    if row is None:
        return "— (not run)"
    if "not_run" in row:
        return f"— ({row['not_run']})"
    return lost_cell(row.get("samples_lost"))


def render(rows: list[dict[str, Any]], summary: str = "",
           failed: dict[str, set[str]] | None = None) -> str:
    """The section's markdown (between the markers, markers excluded): one row per scenario
    of the restart pass, with the in-place pass's samples lost beside it (``failed``: the
    tests that failed on each path)."""
    failed = failed or {}
    passes = [f"{r['pass']}: {r['summary']}" for r in rows if "pass" in r]
    summary = "; ".join(passes) or summary
    rows = [r for r in rows if "pass" not in r]
    inplace = {r["test"]: r for r in rows if r.get("path") == "inplace" and "test" in r}
    extra = [r for r in rows if r.get("path") == "inplace" and "scenario" in r
             and not any(s.get("test") == r.get("test") for s in rows
                         if s.get("path", "restart") == "restart")]
    rows = [r for r in rows if r.get("path", "restart") == "restart"]
    ran, rows = sum(1 for r in inplace.values() if "scenario" in r), rows + extra
    restart_ran = len(rows) - len(extra)
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    head = (f"Measured {when} on {platform.processor() or platform.machine()}, "
            f"{os.cpu_count()} cores, with `python -m bench.faults --run --write` "
            f"({' and '.join(TESTS)} on an 8-node local Slurm cluster, the storm on a "
            "32-node one of its own, a real malletraind"
            + (f"; pytest: {summary}" if summary else "") + "). "
            f"{restart_ran} scenarios survived on the restart path, {ran} on the in-place path "
            "(`malletrain-run --inplace`, the same script; `MALLETRAIN_FAULTS_PATH=inplace`, "
            "only the scenarios that change an epoch under the fault). Progress lost is the samples trained beyond "
            "the last checkpoint: the largest step any rank logged before the fault minus the "
            "step the next epoch resumed from, times the global batch (16 per rank × ranks); "
            "the training scenarios run examples/train_elastic.py with a checkpoint every 6 s "
            "(0.1 s per step). Every scenario ends with Slurm's view and the daemon's equal; "
            "those of the second file also with a one-node prod job that must start within "
            "10 s of its sbatch (on a full cluster it preempts an elastic task; its delay is "
            "in the notes). In place every change that a member survives re-forms in memory "
            "and goes on from the step in flight; only a job that lost every node restarts "
            "from disk. The in-place notes give the daemon's epoch history as it logged it "
            "(`epoch:path/world`, `abandon` where a member was lost).")
    table = ["| scenario | outcome | samples lost, restart | samples lost, in place | notes |",
             "| --- | --- | --- | --- | --- |"]
    for r in rows:
        mine = inplace.get(r.get("test", ""))
        cell = ("— (failed in place)" if r.get("test") in failed.get("inplace", set())
                else inplace_cell(mine))
        note = r.get("note", "")
        if mine is not None and "scenario" in mine:
            told = f"in place: {mine.get('outcome', '')}; epochs {history_cell(mine.get('epochs', []))}"
            if mine.get("note") and mine.get("note") != note:
                told += f"; {mine['note']}"
            note = f"{note}; {told}" if note else told
        restart = (lost_cell(r.get("samples_lost")) if r.get("path", "restart") == "restart"
                   else "— (failed)" if r.get("test") in failed.get("restart", set())
                   else "— (not run)")
        table.append(f"| {r['scenario']} | {r.get('outcome', '')} | {restart} | {cell} | "
                     f"{note} |")
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
    parser.add_argument("--paths", default=",".join(PATHS), help="the paths to run, "
                        "comma-separated (with --run; default: restart,inplace)")
    parser.add_argument("--keep", action="store_true", help="with --run and --results: keep "
                        "that file's rows of the paths not run now (rerun one path only)")
    args = parser.parse_args(argv)
    paths = [p.strip() for p in args.paths.split(",") if p.strip()]
    if not paths or any(p not in PATHS for p in paths):
        parser.error(f"--paths {args.paths!r}: give restart, inplace or restart,inplace")
    summary, failed = "", {}
    with tempfile.TemporaryDirectory() as tmp:
        results = args.results or (Path(tmp) / "faults.json" if args.run else None)
        if results is None:
            env = os.environ.get("MALLETRAIN_FAULTS_RESULTS")
            if not env:
                parser.error("give --run, --results FILE or MALLETRAIN_FAULTS_RESULTS")
            results = Path(env)
        if args.run:
            kept = [r for r in load(results) if r.get("path", r.get("pass")) not in paths] \
                if args.keep and results.exists() else []
            results.write_text(json.dumps(kept, indent=1) + "\n")  # the tests append to it
            told = []
            for path in paths:
                code, took, said, bad = run_tests(results, ["-k", args.select] if args.select
                                                  else [], path)
                said = f"{said.strip('= ')}, {took:.0f} s"
                print(f"faults: {path}: {said}", file=sys.stderr)
                told.append(f"{path}: {said}")
                failed[path] = set(bad)
                rows = load(results)
                results.write_text(json.dumps(rows + [{"pass": path, "summary": said}],
                                              indent=1) + "\n")
                if code not in (0, 1):
                    print(f"faults: pytest exited with {code}", file=sys.stderr)
                    return code
            summary = "; ".join(told)
        section = render(load(results), summary, failed)
    if args.write:
        write(section, REPO / "BENCHMARKS.md")
        print("faults: BENCHMARKS.md updated", file=sys.stderr)
    else:
        print(section)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
