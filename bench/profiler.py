"""Where MalleTrain's gap to FreeTrain-with-true-curves comes from, and the Profiler section of
BENCHMARKS.md.

    python3 -m bench.profiler --trace summit --days 2 --seeds 0 --label NAME --out FILE
    python3 -m bench.profiler --markdown BENCHMARKS.md --records FILE[,FILE…]

The first form replays ``malletrain`` and ``freetrain-exact`` with the real Engine (the same
replay as ``malletrain simulate``, in-place cost model unless ``--rescale-cost`` says
otherwise) and prints one JSON record (the last line): each policy's share of UB_oracle and
rescales, and for ``malletrain`` what the learning costs, sampled 500 times over the trace:

* ``level_error``: the believed throughput at each running job's current scale against the
  true one, |b(k)/t(k) − 1|, node-weighted mean over jobs and samples;
* ``slope_error``: the same for the rate gained over the doubling below the current scale,
  |(b(k) − b(k/2)) / (t(k) − t(k/2)) − 1|: what the allocator trades nodes by;
* ``profiling_node_share``: share of the held node-seconds held by jobs being profiled;
* ``queued_job_h``: job-hours spent queued, not yet admitted (waiting for nodes to profile on,
  or for the model's profile).

The package imported is the one first on ``PYTHONPATH``, so an earlier commit's tree (e.g.
``git archive``'d to a folder) can be measured by the same script; ``--label`` names it. The
second form rebuilds the section between ``<!-- profiler:begin -->`` and
``<!-- profiler:end -->`` from such records, in the order given.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

if __name__ == "__main__" and not __package__:  # started as a file; bench/ is a package
    sys.exit("run it as a module from the repository's root: python -m bench.profiler "
             + " ".join(sys.argv[1:]))
import malletrain_core.sim.replay as replay_module  # noqa: E402
from bench.sections import host, replace_section  # noqa: E402
from malletrain_core.engine import JobPhase  # noqa: E402
from malletrain_core.sim.bounds import BoundJob, compute_bounds  # noqa: E402
from malletrain_core.sim.measured import load_profiles  # noqa: E402
from malletrain_core.sim.perfmodel import PerfParams  # noqa: E402
from malletrain_core.sim.sources import load_trace  # noqa: E402
from malletrain_core.sim.workloads import SimJob, make_workload, model_curves  # noqa: E402

BEGIN, END = "<!-- profiler:begin -->", "<!-- profiler:end -->"


class CurveErrors:
    """Samples the engine's believed curves against the true ones (the progress callback)."""

    def __init__(self, jobs: list[SimJob]) -> None:
        self.truth = {j.id: j.curve for j in jobs}
        self.engine: Any = None
        self.level = self.slope = self.weight = self.slope_weight = 0.0
        self.profiling_nodes = self.held_nodes = 0.0
        self.queued = 0
        self.samples = 0

    def __call__(self, _share: float) -> None:
        if self.engine is None:
            return
        self.samples += 1
        for view in self.engine.jobs.values():
            k = len(view.nodes)
            if view.phase is JobPhase.QUEUED:
                self.queued += 1
            if view.phase is JobPhase.PROFILING:
                self.profiling_nodes += k
            self.held_nodes += k
            true = self.truth.get(view.id)
            if view.phase is not JobPhase.RUNNING or k < 1 or view.curve is None or true is None:
                continue
            t_k = true.at(k)
            if t_k > 0:
                self.level += k * abs(view.curve.at(k) / t_k - 1.0)
                self.weight += k
            h = max(1, k // 2)
            gain = t_k - true.at(h)
            if k >= 2 and gain > 0:
                self.slope += k * abs((view.curve.at(k) - view.curve.at(h)) / gain - 1.0)
                self.slope_weight += k

    def figures(self, span_s: float) -> dict[str, float]:
        dt_h = span_s / 3600 / max(1, self.samples)
        return {"level_error": round(self.level / max(self.weight, 1e-9), 4),
                "slope_error": round(self.slope / max(self.slope_weight, 1e-9), 4),
                "profiling_node_share": round(self.profiling_nodes / max(self.held_nodes, 1e-9),
                                              5),
                "queued_job_h": round(self.queued * dt_h, 2)}


def run(trace_name: str, days: float, seed: int, cost: str) -> dict[str, Any]:
    """One seed: both policies and the malletrain learning figures."""
    trace = load_trace(trace_name, days=days)
    profiles = load_profiles("imagenet")
    jobs = make_workload("imagenet", 50, seed=seed, start=trace.start, end=trace.end,
                         profiles=profiles)
    catalogue = model_curves(jobs, profiles)
    ub = compute_bounds(trace, [BoundJob(j.curve, j.min_nodes, j.max_nodes)
                                for j in jobs]).ub_oracle
    params = PerfParams(rescale_cost=cost)
    out: dict[str, Any] = {"seed": seed}
    make = replay_module.make_engine
    for policy in ("malletrain", "freetrain-exact"):
        errors = CurveErrors(jobs)

        def hooked(*args: Any, _e: CurveErrors = errors, **kwargs: Any) -> Any:
            _e.engine = make(*args, **kwargs)
            return _e.engine

        replay_module.make_engine = hooked
        try:
            t0 = time.perf_counter()
            result = replay_module.replay(trace, jobs, policy, seed=seed, params=params,
                                          catalogue=catalogue, progress=errors)
        finally:
            replay_module.make_engine = make
        out[policy] = {"share": round(result.net_samples / ub, 5), "rescales": result.rescales,
                       "rescale_loss_share": round(result.rescale_loss / ub, 5),
                       "wall_s": round(time.perf_counter() - t0, 1),
                       **(errors.figures(trace.span_s) if policy == "malletrain" else {}),
                       "profiled": int(result.engine.get("profiled", 0)),
                       "extensions": int(result.engine.get("profile_extensions", 0))}
    out["gap_points"] = round(100 * (out["freetrain-exact"]["share"]
                                     - out["malletrain"]["share"]), 3)
    return out


def measure(args: argparse.Namespace) -> dict[str, Any]:
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    per = [run(args.trace, args.days, s, args.rescale_cost) for s in seeds]
    mean = {key: round(sum(p[key] for p in per) / len(per), 3) for key in ("gap_points",)}
    return {"bench": "profiler", "label": args.label, "trace": args.trace, "days": args.days,
            "rescale_cost": args.rescale_cost, "seeds": seeds, "per_seed": per, **mean,
            "machine": host()}


def _row(rec: dict[str, Any]) -> str:
    per = rec["per_seed"]

    def avg(policy: str, key: str) -> float:
        return sum(float(p[policy][key]) for p in per) / len(per)

    return (f"| {rec['label']} | {rec['trace']} {rec['days']:g} d, seeds "
            f"{','.join(map(str, rec['seeds']))} | {100 * avg('malletrain', 'share'):.2f} % | "
            f"{100 * avg('freetrain-exact', 'share'):.2f} % | **{rec['gap_points']:.2f}** | "
            f"{avg('malletrain', 'rescales'):,.0f} / {avg('freetrain-exact', 'rescales'):,.0f} | "
            f"{100 * avg('malletrain', 'level_error'):.2f} % | "
            f"{100 * avg('malletrain', 'slope_error'):.1f} % | "
            f"{100 * avg('malletrain', 'profiling_node_share'):.2f} % | "
            f"{avg('malletrain', 'queued_job_h'):.1f} |")


def section(records: list[dict[str, Any]], command: str, notes: str) -> str:
    date = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [BEGIN, f"Section written {date} by `{command}` on {host()}.", "",
             "Each row is the tree after one change (the label names its commit; the first "
             "is the tree before them), measured by "
             "`python3 -m bench.profiler --trace T --days D --seeds S --label L --out FILE` "
             "(50 ImageNet jobs, in-place cost model). Gap: `freetrain-exact` minus "
             "`malletrain`, points of UB_oracle. Rescales: malletrain / freetrain-exact. "
             "Level and slope error: the believed curve against the true one at each running "
             "job's scale, and over the doubling below it (node-weighted, 500 samples over "
             "the trace). Profiling: share of held node-seconds held by jobs being profiled. "
             "Queued: job-hours jobs spent queued, not yet admitted (waiting for nodes to "
             "profile on, or for their model's profile; from the same coarse samples).", "",
             "| tree | replay | malletrain | freetrain-exact | gap (points) | rescales | "
             "level error | slope error | profiling | queued (job-h) |",
             "|---|---|---|---|---|---|---|---|---|---|",
             *(_row(r) for r in records), ""]
    if notes:
        lines += [notes, ""]
    return "\n".join(lines + [END])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--trace", default="summit")
    ap.add_argument("--days", type=float, default=2.0)
    ap.add_argument("--seeds", default="0", help="comma-separated seeds")
    ap.add_argument("--rescale-cost", default="inplace")
    ap.add_argument("--label", default="this tree")
    ap.add_argument("--out", type=Path, help="also write the record to this file")
    ap.add_argument("--markdown", type=Path, metavar="FILE",
                    help="rewrite the profiler section of FILE from --records")
    ap.add_argument("--records", default="", help="records written by --out, comma-separated")
    ap.add_argument("--notes", type=Path, help="a text file put below the table")
    args = ap.parse_args(argv)
    if args.markdown:
        paths = [Path(p) for p in args.records.split(",") if p]
        if not paths:
            ap.error("--markdown needs --records FILE[,FILE…]")
        try:
            records = [json.loads(p.read_text().strip().splitlines()[-1]) for p in paths]
            notes = args.notes.read_text().strip() if args.notes else ""
        except (OSError, ValueError, IndexError) as exc:
            ap.error(f"cannot read a record or the notes: {exc}")
        shown = ["python3", "-m", "bench.profiler", "--markdown", args.markdown.name,
                 "--records", ",".join(p.name for p in paths),
                 *(["--notes", args.notes.name] if args.notes else [])]
        replace_section(args.markdown, BEGIN, END, section(records, " ".join(shown), notes),
                        "Profiler")
        return 0
    record = measure(args)
    line = json.dumps(record)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(line + "\n")
    print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
