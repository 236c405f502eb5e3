"""How robust is the profiler? Its gap to FreeTrain-with-true-curves over windows it was not
tuned on, and the Profiler sweep section of BENCHMARKS.md.

    python3 -m bench.profiler_sweep --json [--out FILE]          # the sweep (long)
    python3 -m bench.profiler_sweep --quick --json               # two short windows (a test)
    python3 -m bench.profiler_sweep --markdown BENCHMARKS.md --from FILE[,FILE…]

Windows of ``--days`` days are drawn by ``--window-seed`` (uniform start times, not chosen by
hand): ``--theta-windows`` from the Theta 2023 SWF log in the shared data (after its first day,
when the machine fills) and ``--summit-windows`` from the Summit idle trace. Each window is
replayed with ``malletrain`` and ``freetrain-exact`` (50 ImageNet jobs by default, the same
replay as ``malletrain simulate``), for every seed and every cost model named. A row is one
window under one cost model; its gap is ``freetrain-exact`` minus ``malletrain`` in points of
UB_oracle, the mean over the seeds. For the rows where the gap is largest the record says why:
which models' jobs trained less than under ``freetrain-exact`` (net samples, by model), and at
which scales the learned curves were off (the believed throughput at a running job's scale
against the true one, node-weighted over 500 samples of the replay).

Progress goes to stderr, one line per replay. The last line of stdout is one JSON object:
``median_gap_pt``, ``p90_gap_pt``, ``worst_gap_pt`` and ``rows`` (one per window and cost
model).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

if not __package__:  # started as a file: bench/ is a package, run from the repository's root
    sys.exit("run it as a module from the repository's root: python -m bench.profiler_sweep "
             + " ".join(sys.argv[1:]))

import malletrain_core.sim.replay as replay_module  # noqa: E402
from bench.profiler import CurveErrors  # noqa: E402
from bench.sections import host, replace_section  # noqa: E402
from malletrain_core.engine import JobPhase  # noqa: E402
from malletrain_core.sim.bounds import BoundJob, compute_bounds  # noqa: E402
from malletrain_core.sim.measured import load_profiles  # noqa: E402
from malletrain_core.sim.perfmodel import PerfParams  # noqa: E402
from malletrain_core.sim.sources import load_trace  # noqa: E402
from malletrain_core.sim.traces import DAY_S, Trace  # noqa: E402
from malletrain_core.sim.workloads import SimJob, make_workload, model_curves  # noqa: E402

BEGIN, END = "<!-- profiler-sweep:begin -->", "<!-- profiler-sweep:end -->"
POLICIES = ("malletrain", "freetrain-exact")
QUICK = {"theta_windows": 2, "summit_windows": 0, "days": 0.5, "seeds": "0",
         "costs": "inplace", "jobs": 10}
"""What ``--quick`` replays: two half-day Theta windows, one seed, ten jobs (seconds)."""


class ScaleErrors(CurveErrors):
    """:class:`CurveErrors`, also kept per model and scale: where the learned curves were
    off, node-weighted, with the sign (positive: believed faster than true)."""

    def __init__(self, jobs: list[SimJob]) -> None:
        super().__init__(jobs)
        self.model_of = {j.id: j.model for j in jobs}
        self.by_scale: dict[tuple[str, int], list[float]] = defaultdict(lambda: [0.0, 0.0])

    def __call__(self, share: float) -> None:
        super().__call__(share)
        if self.engine is None:
            return
        for view in self.engine.jobs.values():
            k = len(view.nodes)
            true = self.truth.get(view.id)
            if view.phase is not JobPhase.RUNNING or k < 1 or view.curve is None or not true:
                continue
            t_k = true.at(k)
            if t_k > 0:
                cell = self.by_scale[(self.model_of[view.id], k)]
                cell[0] += k * (view.curve.at(k) / t_k - 1.0)
                cell[1] += k

    def worst(self, n: int = 3) -> list[dict[str, Any]]:
        """The ``n`` (model, scale) pairs with the most node-weighted absolute error."""
        total = sum(w for _, w in self.by_scale.values()) or 1.0
        ranked = sorted(self.by_scale.items(), key=lambda kv: -abs(kv[1][0]))[:n]
        return [{"model": m, "nodes": k, "error": round(e / w, 4),
                 "node_share": round(w / total, 4)} for (m, k), (e, w) in ranked if w > 0]


def draw_windows(trace: Trace, count: int, days: float, rng_seed: int) -> list[float]:
    """``count`` window starts (seconds after the trace's start), uniform over the starts
    that leave ``days`` of trace, sorted; one start at 0 when the trace is not longer."""
    import numpy as np

    room = trace.end - trace.start - days * DAY_S
    if count <= 0:
        return []
    if room <= 0:
        return [0.0]
    rng = np.random.default_rng(rng_seed)
    return sorted(round(float(x), 0) for x in rng.uniform(0.0, room, count))


def cut(trace: Trace, offset_s: float, days: float) -> Trace:
    """The ``days`` of ``trace`` from ``offset_s`` after its start (the state before folded in)."""
    import numpy as np

    skip = int(np.searchsorted(trace.times, trace.start + offset_s, side="right"))
    return trace.window(days, skip)


def replay_window(trace: Trace, seed: int, cost: str, jobs_n: int) -> dict[str, Any]:
    """Both policies on one window, one seed, one cost model; the malletrain diagnosis."""
    profiles = load_profiles("imagenet")
    jobs = make_workload("imagenet", jobs_n, seed=seed, start=trace.start, end=trace.end,
                         profiles=profiles)
    catalogue = model_curves(jobs, profiles)
    ub = compute_bounds(trace, [BoundJob(j.curve, j.min_nodes, j.max_nodes)
                                for j in jobs]).ub_oracle
    out: dict[str, Any] = {"seed": seed, "cost": cost}
    by_model: dict[str, dict[str, float]] = {}
    make, backend_cls = replay_module.make_engine, replay_module.SimBackend
    for policy in POLICIES:
        errors = ScaleErrors(jobs)
        held: list[Any] = []

        def hooked(*args: Any, _e: ScaleErrors = errors, **kwargs: Any) -> Any:
            _e.engine = make(*args, **kwargs)
            return _e.engine

        def backend(*args: Any, _h: list[Any] = held, **kwargs: Any) -> Any:
            _h.append(backend_cls(*args, **kwargs))
            return _h[-1]

        replay_module.make_engine, replay_module.SimBackend = hooked, backend  # type: ignore
        try:
            t0 = time.perf_counter()
            result = replay_module.replay(trace, jobs, policy, seed=seed,
                                          params=PerfParams(rescale_cost=cost),
                                          catalogue=catalogue, progress=errors)
        finally:
            replay_module.make_engine, replay_module.SimBackend = make, backend_cls  # type: ignore[misc]
        sums: dict[str, float] = defaultdict(float)
        for m in held[0].models.values():
            sums[m.spec.model] += m.net
        by_model[policy] = dict(sums)
        out[policy] = {"share": round(result.net_samples / ub, 5) if ub > 0 else 0.0,
                       "rescales": result.rescales,
                       "wall_s": round(time.perf_counter() - t0, 1)}
        if policy == "malletrain":
            out[policy].update(errors.figures(trace.span_s))
            out["misfit"] = errors.worst()
    out["gap_pt"] = round(100 * (out["freetrain-exact"]["share"] - out["malletrain"]["share"]),
                          3)
    counts: dict[str, int] = defaultdict(int)
    for j in jobs:
        counts[j.model] += 1
    losses = sorted(((by_model["malletrain"].get(m, 0.0) - fe) / ub * 100, m)
                    for m, fe in by_model["freetrain-exact"].items()) if ub > 0 else []
    out["models_behind"] = [{"model": m, "jobs": counts[m], "pt": round(pt, 3)}
                            for pt, m in losses[:3] if pt < 0]
    return out


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) by linear interpolation between the sorted values."""
    s = sorted(values)
    if not s:
        return 0.0
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    gaps = [r["gap_pt"] for r in rows]
    return {"median_gap_pt": round(statistics.median(gaps), 3) if gaps else None,
            "p90_gap_pt": round(percentile(gaps, 0.9), 3) if gaps else None,
            "worst_gap_pt": round(max(gaps), 3) if gaps else None,
            "worst_seed_gap_pt": round(max((p["gap_pt"] for r in rows for p in r["per_seed"]),
                                           default=0.0), 3)}


def sweep(args: argparse.Namespace) -> dict[str, Any]:
    seeds = [int(s) for s in str(args.seeds).split(",") if s.strip()]
    costs = [c for c in str(args.costs).split(",") if c.strip()]
    plan: list[tuple[str, Trace, float]] = []
    for name, count in (("swf", args.theta_windows), ("summit", args.summit_windows)):
        if count <= 0:
            continue
        whole = load_trace(name)
        for offset in draw_windows(whole, count, args.days, args.window_seed):
            plan.append((name, cut(whole, offset, args.days), offset))
    total = len(plan) * len(costs) * len(seeds)
    rows: list[dict[str, Any]] = []
    done = 0
    t_start = time.perf_counter()
    for name, trace, offset in plan:
        for cost in costs:
            per = []
            for seed in seeds:
                rec = replay_window(trace, seed, cost, args.jobs)
                per.append(rec)
                done += 1
                print(f"[{done}/{total}] {name} day {offset / DAY_S:.1f} seed {seed} {cost}: "
                      f"malletrain {100 * rec['malletrain']['share']:.2f} %, freetrain-exact "
                      f"{100 * rec['freetrain-exact']['share']:.2f} %, gap "
                      f"{rec['gap_pt']:.2f} pt ({time.perf_counter() - t_start:.0f} s)",
                      file=sys.stderr, flush=True)
            rows.append({"trace": name, "start_day": round(offset / DAY_S, 2),
                         "days": round(trace.span_s / DAY_S, 2), "cost": cost,
                         "seeds": seeds,
                         "gap_pt": round(statistics.mean(p["gap_pt"] for p in per), 3),
                         "malletrain": round(statistics.mean(p["malletrain"]["share"]
                                                             for p in per), 5),
                         "freetrain_exact": round(statistics.mean(p["freetrain-exact"]["share"]
                                                                  for p in per), 5),
                         "per_seed": per})
            if args.out:  # the rows so far: a sweep cut short still leaves its record
                write(args.out, record(args, plan, seeds, costs, rows, t_start))
    return record(args, plan, seeds, costs, rows, t_start)


def write(path: Path, rec: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rec) + "\n")


def record(args: argparse.Namespace, plan: list[Any], seeds: list[int], costs: list[str],
           rows: list[dict[str, Any]], t_start: float) -> dict[str, Any]:
    return {"bench": "profiler_sweep", "window_seed": args.window_seed, "days": args.days,
            "jobs": args.jobs, "seeds": seeds, "costs": costs,
            "windows": len(plan), **summarize(rows), "rows": rows,
            "wall_s": round(time.perf_counter() - t_start, 1), "machine": host()}


def merge(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Records of the same windows run in parts (other seeds, other cost models) as one: each
    window and cost model's seeds together, the means and the statistics made again."""
    first = records[0]
    rows: dict[tuple[str, float, str], dict[str, Any]] = {}
    for rec in records:
        if (rec["window_seed"], rec["days"], rec["jobs"]) != (first["window_seed"],
                                                              first["days"], first["jobs"]):
            raise ValueError("records of different windows or workloads cannot be merged")
        for r in rec["rows"]:
            key = (r["trace"], r["start_day"], r["cost"])
            row = rows.setdefault(key, {**r, "per_seed": []})
            row["per_seed"] += [p for p in r["per_seed"]
                                if p["seed"] not in {q["seed"] for q in row["per_seed"]}]
    for row in rows.values():
        per = sorted(row["per_seed"], key=lambda p: p["seed"])
        row.update(per_seed=per, seeds=[p["seed"] for p in per],
                   gap_pt=round(statistics.mean(p["gap_pt"] for p in per), 3),
                   malletrain=round(statistics.mean(p["malletrain"]["share"] for p in per), 5),
                   freetrain_exact=round(statistics.mean(p["freetrain-exact"]["share"]
                                                         for p in per), 5))
    merged = list(rows.values())
    return {**first, "seeds": sorted({s for r in merged for s in r["seeds"]}),
            "costs": sorted({r["cost"] for r in merged}),
            "windows": len({(r["trace"], r["start_day"]) for r in merged}),
            **summarize(merged), "rows": merged,
            "wall_s": round(sum(r["wall_s"] for r in records), 1)}


def _coverage(rec: dict[str, Any]) -> str:
    """A sentence when some rows lack some seeds (a sweep cut short)."""
    full = sum(len(r["per_seed"]) == len(rec["seeds"]) for r in rec["rows"])
    if full == len(rec["rows"]):
        return ""
    return (f" Only {full} of the {len(rec['rows'])} rows have every seed; the others are the "
            "mean of the seeds shown beside them.")


def _why(row: dict[str, Any]) -> str:
    worst = max(row["per_seed"], key=lambda p: p["gap_pt"])
    behind = ", ".join(f"{b['model']} ({b['jobs']} jobs) {b['pt']:+.2f} pt"
                       for b in worst["models_behind"]) or "none"
    misfit = ", ".join(f"{m['model']} at {m['nodes']} nodes {100 * m['error']:+.1f} %"
                       for m in worst["misfit"]) or "none"
    return (f"seed {worst['seed']} ({worst['gap_pt']:.2f} pt): behind freetrain-exact "
            f"{behind}; learned curves off most at {misfit}")


def section(rec: dict[str, Any], command: str, notes: str) -> str:
    date = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    rows = sorted(rec["rows"], key=lambda r: (r["trace"], r["start_day"], r["cost"]))
    lines = [BEGIN, f"Section written {date} by `{command}` from a sweep run on "
             f"{rec['machine']} ({rec['wall_s']:.0f} s).", "",
             f"{rec['windows']} windows of {rec['days']:g} days drawn with window seed "
             f"{rec['window_seed']}, {rec['jobs']} ImageNet jobs, seeds "
             f"{','.join(map(str, rec['seeds']))}, cost models {', '.join(rec['costs'])}. "
             "Gap: `freetrain-exact` minus `malletrain` in points of UB_oracle, the mean over "
             f"the seeds. **Median {rec['median_gap_pt']:.2f} pt, p90 "
             f"{rec['p90_gap_pt']:.2f} pt, worst {rec['worst_gap_pt']:.2f} pt** (worst single "
             f"seed {rec['worst_seed_gap_pt']:.2f} pt)." + _coverage(rec), "",
             "| trace | start day | cost model | malletrain | freetrain-exact | gap (pt) | "
             "per seed (pt) |", "|---|---:|---|---:|---:|---:|---|"]
    for r in rows:
        lines.append(f"| {r['trace']} | {r['start_day']:.1f} | {r['cost']} | "
                     f"{100 * r['malletrain']:.2f} % | {100 * r['freetrain_exact']:.2f} % | "
                     f"**{r['gap_pt']:.2f}** | "
                     f"{' / '.join(format(p['gap_pt'], '.2f') for p in r['per_seed'])} |")
    lines += ["", "Where it is worst (the three largest rows; the seed with the largest gap):",
              ""]
    for r in sorted(rec["rows"], key=lambda r: -r["gap_pt"])[:3]:
        lines.append(f"* {r['trace']} day {r['start_day']:.1f}, {r['cost']}: {_why(r)}.")
    if notes:
        lines += ["", notes]
    return "\n".join(lines + ["", END])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--theta-windows", type=int, default=11)
    ap.add_argument("--summit-windows", type=int, default=1,
                    help="the Summit trace is 14.08 days long: one 14-day window")
    ap.add_argument("--days", type=float, default=14.0)
    ap.add_argument("--seeds", default="0,1,2", help="comma-separated seeds")
    ap.add_argument("--costs", default="inplace,inplace-gpu", help="comma-separated")
    ap.add_argument("--jobs", type=int, default=50)
    ap.add_argument("--window-seed", type=int, default=0, help="draws the windows")
    ap.add_argument("--quick", action="store_true",
                    help="two half-day Theta windows, one seed, 10 jobs (for tests)")
    ap.add_argument("--json", action="store_true", help="only the JSON record on stdout")
    ap.add_argument("--out", type=Path, help="also write the record to this file")
    ap.add_argument("--markdown", type=Path, metavar="FILE",
                    help="rewrite the sweep section of FILE from the record --from names")
    ap.add_argument("--from", dest="source", default="",
                    help="records written by --out, comma-separated (parts of one sweep, "
                    "e.g. other seeds: merged)")
    ap.add_argument("--notes", type=Path, help="a text file put below the section's table")
    args = ap.parse_args(argv)
    if args.markdown:
        paths = [Path(p) for p in args.source.split(",") if p]
        if not paths:
            ap.error("--markdown needs --from FILE[,FILE…] (records written by --out)")
        try:
            rec = merge([json.loads(p.read_text().strip().splitlines()[-1]) for p in paths])
            notes = args.notes.read_text().strip() if args.notes else ""
        except (OSError, ValueError, IndexError, KeyError) as exc:
            ap.error(f"cannot read or merge the records or read the notes: {exc}")
        shown = ["python3", "-m", "bench.profiler_sweep", "--markdown", args.markdown.name,
                 "--from", ",".join(p.name for p in paths),
                 *(["--notes", args.notes.name] if args.notes else [])]
        replace_section(args.markdown, BEGIN, END, section(rec, " ".join(shown), notes),
                        "Profiler")
        return 0
    if args.quick:
        for key, value in QUICK.items():
            setattr(args, key, value)
    if args.days <= 0 or args.jobs < 1 or args.theta_windows < 0 or args.summit_windows < 0:
        ap.error("give --days > 0, --jobs >= 1 and window counts >= 0")
    rec = sweep(args)
    if args.out:
        write(args.out, rec)
    if not args.json:
        print(section(rec, "python3 -m bench.profiler_sweep", ""), file=sys.stderr)
    print(json.dumps(rec))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
