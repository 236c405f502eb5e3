"""Time the simulator and write the Simulator section of BENCHMARKS.md.

Three modes:

    python3 -m bench.simulate --policies malletrain,freetrain-exact   # share + wall per policy
    python3 -m bench.simulate --timing --out timing.json
    python3 -m bench.simulate --markdown BENCHMARKS.md --headline DIR[,DIR…] \\
        --arrivals DIR[,DIR…] --timing-file FILE[,FILE…] [--headline-inplace DIR[,DIR…]]

``--timing`` replays the whole Summit trace (14.08 days) with 50 ImageNet jobs under one
policy and prints one JSON record: wall and CPU seconds, re-plans, solver calls and the
median allocator time per re-plan; the target is ≤ 60 s. ``--markdown`` rebuilds the section
between ``<!-- simulator:begin -->`` and ``<!-- simulator:end -->`` from ``results.json`` files
written by ``malletrain simulate --out DIR`` and from ``--timing`` records; several headline
directories are merged when they replayed the same setup (one policy set per directory).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

if __name__ == "__main__" and not __package__:  # started as a file; bench/ is a package
    sys.exit("run it as a module from the repository's root: python -m bench.simulate "
             + " ".join(sys.argv[1:]))
from bench.simulator_section import machine, merged, read_results, section, write_markdown  # noqa: E402
from malletrain_core import allocator  # noqa: E402
from malletrain_core.sim.compare import SimOptions, compare  # noqa: E402
from malletrain_core.sim.measured import load_profiles  # noqa: E402
from malletrain_core.sim.policies import parse_policies  # noqa: E402
from malletrain_core.sim.replay import replay  # noqa: E402
from malletrain_core.sim.sources import load_trace  # noqa: E402
from malletrain_core.sim.workloads import make_workload, model_curves  # noqa: E402

TARGET_S = 60.0


def _load() -> float:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return float("nan")


# ------------------------------------------------------------------ measuring
def shares(args: argparse.Namespace) -> int:
    """One JSON record per policy: wall time and share of UB_oracle."""
    load_trace(args.trace, days=args.days)  # parse once (fills the cache) outside the timing
    for policy in parse_policies(args.policies):
        if policy == "oracle":
            continue
        opts = SimOptions(trace=args.trace, days=args.days, jobs=args.jobs, seed=args.seed,
                          policies=(policy, "oracle"))
        t0 = time.perf_counter()
        result = compare(opts).results
        p = result["policies"][policy]
        print(json.dumps({
            "bench": "simulate", "trace": args.trace, "days": round(result["trace"]["days"], 3),
            "steps": result["trace"]["steps"], "jobs": args.jobs, "policy": policy,
            "seed": args.seed, "wall_s": round(time.perf_counter() - t0, 2),
            "replay_s": round(p["wall_s"], 2), "ub_oracle_share": p["ub_oracle_share"],
            "rescales": p["rescales"], "machine": machine(), "load_1m": _load()}))
    return 0


def timing(args: argparse.Namespace) -> dict[str, Any]:
    """Replay the trace under one policy and time it, solver calls included."""
    trace = load_trace(args.trace, days=args.days)
    profiles = load_profiles("imagenet")
    jobs = make_workload("imagenet", args.jobs, seed=args.seed, start=trace.start,
                         end=trace.end, profiles=profiles)
    solve_ms: list[float] = []
    solve = allocator.solve

    def timed(problem: Any, solver: str = "auto", time_limit_s: float | None = None) -> Any:
        solution = solve(problem, solver, time_limit_s)
        solve_ms.append(solution.solve_ms)
        return solution

    allocator.solve = timed  # the engine binds allocator.solve when it is built
    load_before = _load()
    try:
        wall0, cpu0 = time.perf_counter(), time.process_time()
        run = replay(trace, jobs, args.policy, seed=args.seed,
                     catalogue=model_curves(jobs, profiles))
        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    finally:
        allocator.solve = solve
    ms = np.array(solve_ms) if solve_ms else np.zeros(1)
    return {
        "bench": "simulate-timing", "trace": trace.name, "days": round(trace.span_s / 86400, 2),
        "steps": trace.steps, "policy": args.policy, "jobs": args.jobs, "seed": args.seed,
        "wall_s": round(wall, 1), "cpu_s": round(cpu, 1),
        "replans": int(run.engine.get("replans", 0)), "solves": len(solve_ms),
        "dp_ms_median": round(float(np.median(ms)), 3),
        "dp_ms_p90": round(float(np.percentile(ms, 90)), 3),
        "dp_s_total": round(float(ms.sum()) / 1000, 1),
        "net_samples": run.net_samples, "target_s": TARGET_S,
        "within_target": wall <= TARGET_S, "load_1m_before": load_before,
        "load_1m_after": _load(), "machine": machine(),
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--trace", default="summit")
    ap.add_argument("--days", type=float, default=None, help="default: the whole trace")
    ap.add_argument("--jobs", type=int, default=50)
    ap.add_argument("--policies", default="malletrain")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timing", action="store_true", help="time one full replay (JSON)")
    ap.add_argument("--policy", default="malletrain", help="the policy --timing replays")
    ap.add_argument("--out", type=Path, help="--timing: also write the record to this file")
    ap.add_argument("--markdown", type=Path, metavar="FILE",
                    help="rewrite the simulator section of FILE (e.g. BENCHMARKS.md)")
    ap.add_argument("--headline", default="", help="results.json directories, comma-separated")
    ap.add_argument("--arrivals", default="",
                    help="results.json directories of arrivals runs, comma-separated")
    ap.add_argument("--timing-file", default="", help="--timing records, comma-separated")
    ap.add_argument("--hpo", default="", help="results.json directories of an HPO-workload run "
                    "(one setup), comma-separated")
    ap.add_argument("--headline-inplace", default="",
                    help="results.json directories of the headline setup replayed with "
                         "--rescale-cost inplace, comma-separated")
    args = ap.parse_args(argv)
    if args.markdown:
        if not args.headline:
            ap.error("--markdown needs --headline DIR[,DIR…]")
        head = merged([Path(p) for p in args.headline.split(",") if p])
        arrivals = [read_results(Path(p)) for p in args.arrivals.split(",") if p]
        timings = [json.loads(Path(p).read_text()) for p in args.timing_file.split(",") if p]
        given = sys.argv[1:] if argv is None else argv
        # Result files live outside the repository: show their names, not this machine's paths.
        shown = ["python3", "-m", "bench.simulate",
                 *(",".join(Path(p).name for p in a.split(",")) if "/" in a else a
                   for a in given)]
        hpo = merged([Path(p) for p in args.hpo.split(",") if p]) if args.hpo else None
        inplace = merged([Path(p) for p in args.headline_inplace.split(",") if p]) \
            if args.headline_inplace else None
        write_markdown(args.markdown, section(head, arrivals, timings, " ".join(shown), hpo,
                                              inplace))
        return 0
    if args.timing:
        record = timing(args)
        print(json.dumps(record))
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(record) + "\n")
        return 0
    return shares(args)


if __name__ == "__main__":
    raise SystemExit(main())
