#!/usr/bin/env python3
"""Allocator benchmark: DP, count MILP and per-node MILP on the measured ImageNet curves.

Instances (nodes × jobs): 64×8, 460×50 (10 % of Summit), 1000×200 and 4734×500 (all of
Summit), jobs drawn from ``load_profiles("imagenet")`` with varied current sizes so that
rescale costs matter (fixed seed). The solvers run interleaved within each size, so their
ratios are taken side by side under the same machine noise. The per-node MILP runs only at
64×8 and 460×50, with a time limit (default 120 s), and reports its final gap. A last row per
large size times the count MILP with side constraints (per-user caps and a running-job cap).

    python3 -m bench.allocator                  # table
    python3 -m bench.allocator --json           # one JSON record per (size, solver)
    python3 -m bench.allocator --quick          # no per-node MILP above 64×8; < 30 s
    python3 -m bench.allocator --markdown BENCHMARKS.md   # rewrite its "## Allocator" section
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import sys
import time
from datetime import datetime, timezone
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np

from malletrain_core.allocator import pernode, solve  # noqa: E402
from malletrain_core.model import Constraints, Job, Problem  # noqa: E402
from malletrain_core.sim.measured import load_profiles  # noqa: E402

SIZES = ((64, 8), (460, 50), (1000, 200), (4734, 500))
PERNODE_SIZES = ((64, 8), (460, 50))
REPS = {"dp": 20, "milp": 5, "milp+constraints": 5}
PERNODE_REPS = {(64, 8): 3, (460, 50): 1}
USERS = 5
BEGIN, END = "<!-- allocator:begin -->", "<!-- allocator:end -->"


def instance(nodes: int, jobs: int, seed: int = 2021, constrained: bool = False) -> Problem:
    """Jobs with measured curves; about half the nodes held, in uneven shares, 20 % idle jobs."""
    rng = np.random.default_rng(seed + nodes * 1000 + jobs)
    profiles = load_profiles("imagenet")
    picks = rng.choice(len(profiles), size=jobs, replace=False)
    shares = rng.dirichlet(np.full(jobs, 0.7)) * (nodes // 2)
    chosen = []
    for i, p in enumerate(profiles[int(x)] for x in picks):
        current = 0 if rng.random() < 0.2 else int(min(shares[i], p.max_nodes))
        chosen.append(Job(p.name, p.max_nodes, p.min_nodes, p.curve, p.scale_up_s,
                          p.scale_down_s, current, owner=f"user{i % USERS}", model=p.model))
    cons = Constraints()
    if constrained:
        cons = Constraints(user_max_nodes={f"user{u}": int(0.15 * nodes) for u in range(USERS)},
                           max_running_jobs=jobs // 2)
    return Problem(nodes, tuple(chosen), 120.0, constraints=cons)


def run(quick: bool, pernode_limit_s: float, progress: bool) -> list[dict[str, Any]]:
    records = []
    for nodes, jobs in SIZES:
        problems = {"dp": instance(nodes, jobs), "milp": instance(nodes, jobs)}
        reps = {"dp": REPS["dp"], "milp": REPS["milp"]}
        if nodes >= 460:
            problems["milp+constraints"] = instance(nodes, jobs, constrained=True)
            reps["milp+constraints"] = REPS["milp+constraints"]
        if (nodes, jobs) in PERNODE_SIZES and not (quick and nodes > 64):
            problems["pernode"] = instance(nodes, jobs)
            reps["pernode"] = PERNODE_REPS[(nodes, jobs)]
        times: dict[str, list[float]] = {name: [] for name in problems}
        last: dict[str, Any] = {}
        for rep in range(max(reps.values())):
            for name, problem in problems.items():
                if rep >= reps[name]:
                    continue
                solver = "milp" if name.startswith("milp") else name
                limit = pernode_limit_s if solver == "pernode" else None
                start = time.perf_counter()
                last[name] = solve(problem, solver, limit)
                times[name].append((time.perf_counter() - start) * 1e3)
        reference = last["dp"].objective
        for name, problem in problems.items():
            sol = last[name]
            ms = np.array(times[name])
            record: dict[str, Any] = {
                "nodes": nodes, "jobs": jobs, "solver": name, "reps": len(ms),
                "median_ms": round(float(np.median(ms)), 2),
                "p99_ms": round(float(np.percentile(ms, 99)), 2),
                "objective": sol.objective, "status": sol.status, "gap": sol.gap}
            if name != "milp+constraints":
                record["rel_diff_vs_dp"] = abs(sol.objective - reference) / abs(reference)
            if name == "pernode":
                model = pernode.build(problem)
                record.update(binaries=model.num_binaries, rows=model.num_rows,
                              time_limit_s=pernode_limit_s)
            records.append(record)
            if progress:
                print(f"  {nodes}×{jobs} {name}: median {record['median_ms']} ms",
                      file=sys.stderr, flush=True)
    return records


def table(records: list[dict[str, Any]], markdown: bool = False) -> str:
    heads = ("nodes × jobs", "solver", "reps", "median ms", "p99 ms", "objective",
             "vs DP", "status", "gap")
    rows = []
    for r in records:
        diff = r.get("rel_diff_vs_dp")
        note = r["status"]
        if "binaries" in r:
            note += f" ({r['binaries']:,} binaries, {r['rows']:,} rows)"
        rows.append((f"{r['nodes']:,} × {r['jobs']}", r["solver"], str(r["reps"]),
                     f"{r['median_ms']:,.1f}", f"{r['p99_ms']:,.1f}", f"{r['objective']:.6e}",
                     "—" if diff is None else f"{diff:.1e}", note, f"{r['gap']:.2%}"))
    if markdown:
        lines = ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
        return "\n".join(lines)
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(heads)]
    out = ["  ".join(h.ljust(w) for h, w in zip(heads, widths))]
    out += ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in rows]
    return "\n".join(out)


def machine() -> str:
    cpu = platform.processor() or "unknown CPU"
    try:
        text = Path("/proc/cpuinfo").read_text()
        match = re.search(r"^model name\s*:\s*(.+)$", text, re.M)
        cpu = match.group(1).strip() if match else cpu
    except OSError:
        pass
    try:
        load = Path("/proc/loadavg").read_text().split()[0]
    except OSError:
        load = "n/a"
    return (f"{cpu}, {os.cpu_count()} cores (1-min load {load} at the end of the run), "
            f"Python {platform.python_version()}, highspy {version('highspy')}, "
            f"numpy {np.__version__}")


def section(records: list[dict[str, Any]], command: str) -> str:
    date = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return "\n".join([
        BEGIN,
        f"Measured {date} on {machine()}, with `{command}`.",
        "",
        table(records, markdown=True),
        "",
        "Instances: jobs drawn from the measured ImageNet curves (min 1, max 64 nodes), about "
        "half the nodes held in uneven shares, 20 % of jobs idle, look-ahead 120 s, fixed seed. "
        "Times are wall-clock per `allocator.solve` call, model building included; the solvers "
        "of one size run interleaved. `milp+constraints` is a separate instance with 5 owners "
        "capped at 15 % of the nodes each and at most jobs/2 running (no DP reference). "
        "`vs DP` is the relative objective difference from the DP's optimum; the per-node MILP "
        "row gives its status within the time limit and the final relative gap.",
        END])


def write_markdown(path: Path, body: str) -> None:
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        text = head + body + rest.split(END, 1)[1]
    elif "## Allocator" in text:
        text = text.replace("## Allocator", "## Allocator\n\n" + body, 1)
    else:
        text = text.rstrip("\n") + "\n\n## Allocator\n\n" + body + "\n"
    path.write_text(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="skip the per-node MILP above 64×8 (ends in well under 30 s)")
    parser.add_argument("--json", action="store_true", help="print JSON lines, not a table")
    parser.add_argument("--markdown", metavar="FILE", type=Path,
                        help="rewrite the '## Allocator' section of FILE (e.g. BENCHMARKS.md)")
    parser.add_argument("--pernode-limit", type=float, default=120.0, metavar="SECONDS",
                        help="time limit of the per-node MILP (default %(default)s)")
    args = parser.parse_args(argv)
    records = run(args.quick, args.pernode_limit, progress=not args.json)
    if args.json:
        for record in records:
            print(json.dumps(record))
    else:
        print(table(records))
    if args.markdown:
        shown = ["python3", "-m", "bench.allocator", *(sys.argv[1:] if argv is None else argv)]
        write_markdown(args.markdown, section(records, " ".join(shown)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
