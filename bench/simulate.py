"""Time the simulator: the whole Summit trace, a saturated ImageNet job set, one policy.

Prints one JSON record per policy (wall time, share of UB_oracle, what was replayed and on
which machine). The target is ≤ 60 s per policy for the full 14-day trace with 50 jobs.

    python3 bench/simulate.py                         # malletrain, 14 days, 50 jobs
    python3 bench/simulate.py --policies freetrain-exact,greedy --days 2
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from malletrain_core.sim.compare import SimOptions, compare  # noqa: E402
from malletrain_core.sim.policies import parse_policies  # noqa: E402
from malletrain_core.sim.sources import load_trace  # noqa: E402

TARGET_S = 60.0


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default="summit")
    ap.add_argument("--days", type=float, default=None, help="default: the whole trace")
    ap.add_argument("--jobs", type=int, default=50)
    ap.add_argument("--policies", default="malletrain")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    t0 = time.perf_counter()
    load_trace(args.trace, days=args.days)  # parse once (and fill the cache) outside the timing
    load_s = time.perf_counter() - t0
    for policy in parse_policies(args.policies):
        if policy == "oracle":
            continue
        opts = SimOptions(trace=args.trace, days=args.days, jobs=args.jobs, seed=args.seed,
                          policies=(policy, "oracle"))
        t0 = time.perf_counter()
        result = compare(opts).results
        wall = time.perf_counter() - t0
        p = result["policies"][policy]
        print(json.dumps({
            "bench": "simulate", "trace": args.trace, "days": round(result["trace"]["days"], 3),
            "steps": result["trace"]["steps"], "jobs": args.jobs, "policy": policy,
            "seed": args.seed, "wall_s": round(wall, 2), "replay_s": round(p["wall_s"], 2),
            "target_s": TARGET_S, "within_target": wall <= TARGET_S,
            "ub_oracle_share": p["ub_oracle_share"], "rescales": p["rescales"],
            "trace_load_s": round(load_s, 2), "cpu": _cpu(), "cores": os.cpu_count(),
            "python": platform.python_version()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
