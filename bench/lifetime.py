"""Lifetime-aware allocation on real traces: learn reclaim statistics, then evaluate.

The Summit trace (after BFTrainer's 1,000 skipped events) is split in two: the idle fragments
of days 1–7 train the survival model; days 8–14 are replayed with saturated job sets under

* ``malletrain`` at a fixed look-ahead of 10, 120 and 600 s (the best of the three is the
  reference: chosen with hindsight, per configuration);
* ``malletrain-lifetime``: idle nodes valued by the learned predictor (updated online);
* ``malletrain-clairvoyant``: idle nodes valued by their true reclaim time (an upper reference);

and each run's net samples are divided by UB_oracle. The same Summit-trained predictor is then
evaluated on a week of the ALCF Theta SWF log (after its first day), to see that it is not
tuned to one trace. Every replay writes one JSON file into ``--results`` (runs already there
are skipped, so an interrupted campaign resumes); ``--markdown`` builds the table from those
files into BENCHMARKS.md between the ``lifetime`` markers.

    python3 -m bench.lifetime --results RESULTS_DIR --workers 2 \\
        --plan summit:imagenet:50:5,summit:hpo:50:3,theta:imagenet:50:3
    python3 -m bench.lifetime --results RESULTS_DIR --markdown BENCHMARKS.md

``--rescale-cost inplace`` replays under the in-place cost model (``malletrain_core/sim/costs.py``);
its files carry an ``-inplace`` suffix, so both cost models share one results folder and the
table shows a row per cost model.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import sys
import time
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

import numpy as np

from malletrain_core.engine import Engine  # noqa: E402, F401  (loaded once, before the workers fork)
from malletrain_core.engine.survival import (  # noqa: E402
    LifetimePredictor,
    SurvivalModel,
    split_trace,
    trace_fragments,
)
from malletrain_core.sim.bounds import BoundJob, compute_bounds  # noqa: E402
from malletrain_core.sim.costs import COST_MODELS, DEFAULT_COST_MODEL  # noqa: E402
from malletrain_core.sim.measured import load_profiles  # noqa: E402
from malletrain_core.sim.perfmodel import PerfParams  # noqa: E402
from malletrain_core.sim.replay import replay  # noqa: E402
from malletrain_core.sim.sources import load_trace  # noqa: E402
from malletrain_core.sim.traces import DAY_S, Trace  # noqa: E402
from malletrain_core.sim.workloads import make_workload  # noqa: E402

LOOKAHEADS = (10.0, 120.0, 600.0)
HORIZON_S = 120.0
MIN_GAP = 0.001
"""A clairvoyant lead below 0.1 pp of UB_oracle is within the seeds' spread: no gap to close."""
LEARN_DAYS = 7.0
EVAL_DAYS = 7.0
BEGIN, END = "<!-- lifetime:begin -->", "<!-- lifetime:end -->"


def traces(learn_days: float, eval_days: float) -> dict[str, Trace]:
    summit = load_trace("summit")
    learn, evaluation = split_trace(summit, learn_days, eval_days)
    return {"summit-learn": learn, "summit": evaluation,
            "theta": load_trace("swf", days=eval_days)}


def learned_model(learn: Trace) -> tuple[SurvivalModel, dict[str, Any]]:
    closed, censored = trace_fragments(learn)
    model = SurvivalModel.from_fragments(closed, censored)
    info = {"fragments": int(len(closed)), "censored": int(len(censored)),
            "median_s": float(np.median(closed)) if len(closed) else None}
    return model, info


Unit = tuple[str, str, int, int, str, float, str]
"""trace, workload, jobs, seed, policy, look-ahead, cost model."""


def units(plan: list[tuple[str, str, int, int]],
          rescale_cost: str = DEFAULT_COST_MODEL) -> list[Unit]:
    out = []
    for trace, workload, jobs, seeds in plan:
        for seed in range(seeds):
            for la in LOOKAHEADS:
                out.append((trace, workload, jobs, seed, "malletrain", la, rescale_cost))
            out.append((trace, workload, jobs, seed, "malletrain-lifetime", HORIZON_S,
                        rescale_cost))
            out.append((trace, workload, jobs, seed, "malletrain-clairvoyant", HORIZON_S,
                        rescale_cost))
    return list(dict.fromkeys(out))


def unit_path(results: Path, unit: Unit) -> Path:
    trace, workload, jobs, seed, policy, la, cost = unit
    suffix = "" if cost == DEFAULT_COST_MODEL else f"-{cost}"
    return results / f"{trace}-{workload}-{jobs}-s{seed}-{policy}-{la:g}{suffix}.json"


_STATE: dict[str, Any] = {}


def _init(learn_days: float, eval_days: float) -> None:
    _STATE["traces"] = traces(learn_days, eval_days)
    _STATE["model"], _STATE["learn"] = learned_model(_STATE["traces"]["summit-learn"])


def run_unit(unit: Unit, out: str) -> str:
    trace_name, workload, n_jobs, seed, policy, la, cost = unit
    trace = _STATE["traces"][trace_name]
    jobs = make_workload(workload, n_jobs, seed=seed, start=trace.start, end=trace.end,
                         profiles=load_profiles(workload))
    ub = compute_bounds(trace, [BoundJob(j.curve, j.min_nodes, j.max_nodes) for j in jobs])
    options: dict[str, Any] = {}
    if policy == "malletrain-lifetime":
        options["lifetime"] = LifetimePredictor(_STATE["model"], la)
    elif policy == "malletrain-clairvoyant":
        options["lifetime"] = LifetimePredictor(None, la, learn_online=False)
    r = replay(trace, jobs, policy, seed=seed, lookahead_s=la, engine_options=options,
               params=PerfParams(rescale_cost=cost))
    record = {"trace": trace_name, "workload": workload, "jobs": n_jobs, "seed": seed,
              "rescale_cost": cost,
              "policy": policy, "lookahead_s": la, "net_samples": r.net_samples,
              "ub_oracle": ub.ub_oracle, "share": r.net_samples / ub.ub_oracle,
              "rescales": r.rescales, "rescale_loss": r.rescale_loss,
              "preemptions": r.preemptions, "preemption_loss": r.preemption_loss,
              "wall_s": r.wall_s, "days": trace.span_s / DAY_S, "learn": _STATE["learn"]}
    path = Path(out)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record))
    os.replace(tmp, path)
    return path.name


def speed(reps: int = 20, seed: int = 0) -> dict[str, Any]:
    """Median solve times of the lifetime DP and the fixed look-ahead DP at Summit scale: all
    4,734 nodes idle, 50 ImageNet jobs (max 64 nodes) holding about half of them, node lives
    from the survival model of the whole fragment set at random idle ages."""
    from malletrain_core.allocator import dp as fixed_dp
    from malletrain_core.allocator import lifetime as lt
    from malletrain_core.model import Job, Problem
    from malletrain_core.sim.sources import FRAGMENTS_FILE, _shared_file

    rng = np.random.default_rng(seed)
    predictor = LifetimePredictor(SurvivalModel.from_fragments(np.load(_shared_file(
        FRAGMENTS_FILE))), HORIZON_S)
    profiles = load_profiles("imagenet")
    nodes = 4734
    jobs, held = [], {}
    for i, k in enumerate(rng.choice(len(profiles), 50, replace=False)):
        p = profiles[int(k)]
        cur = min(int(rng.integers(0, nodes // 50)), p.max_nodes)
        jobs.append(Job(f"j{i}", p.max_nodes, p.min_nodes, p.curve, p.scale_up_s,
                        p.scale_down_s, cur))
    ages = rng.exponential(1200.0, nodes)
    life, risk = predictor.predict(ages, [None] * nodes)
    lives = list(zip(life.tolist(), risk.tolist()))
    at = 0
    for job in jobs:
        held[job.id] = lives[at:at + job.current_nodes]
        at += job.current_nodes
    free = lives[at:]
    problem = Problem(nodes, tuple(jobs), HORIZON_S)
    times: dict[str, list[float]] = {"lifetime": [], "fixed": []}
    for _ in range(reps):
        t0 = time.perf_counter()
        lt.solve(problem, held, free)
        times["lifetime"].append((time.perf_counter() - t0) * 1e3)
        t0 = time.perf_counter()
        fixed_dp.solve(problem)
        times["fixed"].append((time.perf_counter() - t0) * 1e3)
    return {"nodes": nodes, "jobs": len(jobs), "held": at, "reps": reps,
            "lifetime_ms": float(np.median(times["lifetime"])),
            "fixed_ms": float(np.median(times["fixed"]))}


def parse_plan(text: str) -> list[tuple[str, str, int, int]]:
    plan = []
    for item in text.split(","):
        try:
            trace, workload, jobs, seeds = item.split(":")
            plan.append((trace, workload, int(jobs), int(seeds)))
        except ValueError:
            raise SystemExit(f"--plan {item!r}: give TRACE:WORKLOAD:JOBS:SEEDS, e.g. "
                             "summit:imagenet:50:5") from None
        if trace not in ("summit", "theta"):
            raise SystemExit(f"--plan {item!r}: the trace is summit or theta")
    return plan


def campaign(plan: list[tuple[str, str, int, int]], results: Path, workers: int,
             learn_days: float, eval_days: float,
             rescale_cost: str = DEFAULT_COST_MODEL) -> None:
    results.mkdir(parents=True, exist_ok=True)
    todo = [u for u in units(plan, rescale_cost) if not unit_path(results, u).exists()]
    print(f"lifetime: {len(todo)} replays to run", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    if workers <= 1:  # one process: no pool beside this one
        _init(learn_days, eval_days)
        for i, u in enumerate(todo, 1):
            name = run_unit(u, str(unit_path(results, u)))
            print(f"lifetime: {i}/{len(todo)} {name} ({time.perf_counter() - t0:.0f} s)",
                  file=sys.stderr, flush=True)
        return
    with ProcessPoolExecutor(max_workers=workers, initializer=_init,
                             initargs=(learn_days, eval_days)) as pool:
        futures = {pool.submit(run_unit, u, str(unit_path(results, u))): u for u in todo}
        for i, future in enumerate(as_completed(futures), 1):
            print(f"lifetime: {i}/{len(todo)} {future.result()} "
                  f"({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def table(results: Path, timing: dict[str, Any] | None = None) -> str:
    """The BENCHMARKS.md section from the JSON files in ``results`` (and a solver timing)."""
    recs = [json.loads(p.read_text()) for p in sorted(results.glob("*.json"))]
    groups: dict[tuple[str, str, int, str], dict[int, dict[str, float]]] = defaultdict(
        lambda: defaultdict(dict))
    span: dict[str, float] = {}
    walls: dict[str, list[float]] = defaultdict(list)
    for r in recs:
        name = r["policy"] if r["policy"] != "malletrain" else f"malletrain@{r['lookahead_s']:g}"
        groups[_key(r)][r["seed"]][name] = r["share"]
        walls[r["policy"]].append(r["wall_s"])
        span[r["trace"]] = r["days"]
    learn = recs[0]["learn"] if recs else {}
    verdicts: list[str] = []
    lines = [
        "| trace (eval days) | workload | jobs | rescale cost | seeds | fixed 10 s | fixed 120 s "
        "| fixed 600 s | best fixed | lifetime | clairvoyant | gap closed | lifetime − best fixed, "
        "per seed |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for (trace, workload, jobs, cost), seeds in sorted(groups.items(), key=lambda kv: (
            kv[0][0] != "summit", kv[0][1], -kv[0][2], kv[0][3] != DEFAULT_COST_MODEL)):
        full = {s: v for s, v in seeds.items() if len(v) == len(LOOKAHEADS) + 2}
        if not full:
            continue

        def mean(key: str, full: dict[int, dict[str, float]] = full) -> float:
            return float(np.mean([v[key] for v in full.values()]))

        fixed = {la: mean(f"malletrain@{la:g}") for la in LOOKAHEADS}
        best_la = max(fixed, key=lambda la: fixed[la])
        best = fixed[best_la]
        life, clair = mean("malletrain-lifetime"), mean("malletrain-clairvoyant")
        closed = (life - best) / (clair - best) if clair - best >= MIN_GAP else float("nan")
        cells = " | ".join(f"{100 * fixed[la]:.2f} %" for la in LOOKAHEADS)
        days = span[trace]
        label = f"Summit ({days:.1f} d after the learning days)" if trace == "summit" else \
            f"Theta SWF ({days:.1f} d after its first day)"
        per_seed = " ".join(f"{100 * (v['malletrain-lifetime'] - v[f'malletrain@{best_la:g}']):+.2f}"
                            for _, v in sorted(full.items()))
        lines.append(f"| {label} | {workload} | {jobs} | {cost} | {len(full)} | {cells} | "
                     f"{100 * best:.2f} % ({best_la:g} s) | {100 * life:.2f} % | "
                     f"{100 * clair:.2f} % | {_closed(closed, clair - best)} | {per_seed} pp |")
        if clair - best < MIN_GAP:
            verdict = "not met: the clairvoyant policy is not better than the best fixed " \
                f"look-ahead by {100 * MIN_GAP:.1f} pp or more, so there is no gap to close"
        else:
            verdict = "met" if closed >= 0.5 else "not met"
        verdicts.append(f"* {trace} {workload} {jobs} jobs, {cost}: lifetime − best fixed "
                        f"{100 * (life - best):+.2f} pp, clairvoyant − best fixed "
                        f"{100 * (clair - best):+.2f} pp; goal (close half the gap) {verdict}.")
    lines.extend(["", *verdicts])
    lines.extend(["", "Where the samples go (means over the same seeds; losses in % of UB_oracle):",
                  "", "| trace | workload | jobs | rescale cost | policy | rescales | rescale loss "
                  "| preemptions | preemption loss |", "|---|---|---|---|---|---|---|---|---|"])
    per: dict[tuple[str, str, int, str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in recs:
        name = r["policy"] if r["policy"] != "malletrain" else f"malletrain@{r['lookahead_s']:g}"
        per[(*_key(r), name)].append(r)
    for (trace, workload, jobs, cost, name), rs in sorted(per.items(), key=lambda kv: (
            kv[0][0] != "summit", kv[0][1], -kv[0][2], kv[0][3] != DEFAULT_COST_MODEL,
            kv[0][4])):
        done = [r for r in rs if len(groups[(trace, workload, jobs, cost)][r["seed"]]) ==
                len(LOOKAHEADS) + 2]
        if not done:
            continue
        lines.append(
            f"| {trace} | {workload} | {jobs} | {cost} | {name} | "
            f"{np.mean([r['rescales'] for r in done]):,.0f} | "
            f"{100 * np.mean([r['rescale_loss'] / r['ub_oracle'] for r in done]):.2f} % | "
            f"{np.mean([r['preemptions'] for r in done]):,.0f} | "
            f"{100 * np.mean([r['preemption_loss'] / r['ub_oracle'] for r in done]):.2f} % |")
    wall = ", ".join(f"{p} {np.median(w):.0f} s" for p, w in sorted(walls.items()))
    load = os.getloadavg()[0]
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    return "\n".join([
        f"Built {stamp} from {len(recs)} replays on {_cpu()}, {os.cpu_count()} cores "
        f"(1-min load {load:.2f}), Python {platform.python_version()}, with "
        "`python3 -m bench.lifetime --results DIR --workers 2 --plan …` (restart cost model), "
        "`python3 -m bench.lifetime --results DIR --workers 2 --rescale-cost inplace --plan …`"
        " (in-place cost model, malletrain_core/sim/costs.py) then "
        "`python3 -m bench.lifetime --results DIR --markdown BENCHMARKS.md`.",
        "",
        f"Survival model learned from Summit days 1–7: {learn.get('fragments', 0):,} complete "
        f"idle fragments (median {learn.get('median_s') or 0:.0f} s) and "
        f"{learn.get('censored', 0):,} still idle at day 7 (censored); horizon H = "
        f"{HORIZON_S:g} s for both lifetime policies. Shares are mean net samples / "
        "UB_oracle over the seeds; 'gap closed' = (lifetime − best fixed) / (clairvoyant − "
        "best fixed). Median replay wall time: " + wall + ".",
        "",
        *lines,
        *([] if timing is None else [
            "",
            f"Solver time at Summit scale ({timing['nodes']:,} idle nodes, {timing['jobs']} "
            f"ImageNet jobs holding {timing['held']:,} of them, median of {timing['reps']}): "
            f"lifetime DP {timing['lifetime_ms']:.0f} ms (value tables and the hand-out check included), fixed "
            f"look-ahead DP {timing['fixed_ms']:.0f} ms, on the same shared machine."])])


def _key(r: dict[str, Any]) -> tuple[str, str, int, str]:
    """A replay's group: trace, workload, jobs and cost model (files from before the cost
    models were named ran under ``restart``)."""
    return r["trace"], r["workload"], r["jobs"], r.get("rescale_cost", DEFAULT_COST_MODEL)


def _closed(x: float, gap: float) -> str:
    if x != x:
        return f"n/a (gap {100 * gap:+.2f} pp)"
    return f"{100 * x:.0f} %"


def write_markdown(path: Path, body: str) -> None:
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    section = f"{BEGIN}\n{body}\n{END}"
    if BEGIN in text and END in text:
        text = re.sub(re.escape(BEGIN) + ".*?" + re.escape(END), lambda _m: section, text,
                      flags=re.S)
    else:
        text = text.rstrip("\n") + "\n\n## Lifetime-aware allocation\n\n" + section + "\n"
    path.write_text(text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", type=Path, required=True, help="folder of per-replay JSON")
    ap.add_argument("--plan", default="", help="TRACE:WORKLOAD:JOBS:SEEDS,… to run")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--learn-days", type=float, default=LEARN_DAYS)
    ap.add_argument("--eval-days", type=float, default=EVAL_DAYS)
    ap.add_argument("--markdown", type=Path, help="write the table into this BENCHMARKS.md")
    ap.add_argument("--rescale-cost", choices=tuple(COST_MODELS), default=DEFAULT_COST_MODEL,
                    help="the cost model --plan replays under (default %(default)s)")
    args = ap.parse_args(argv)
    if args.plan:
        campaign(parse_plan(args.plan), args.results, args.workers, args.learn_days,
                 args.eval_days, args.rescale_cost)
    if args.markdown:
        write_markdown(args.markdown, table(args.results, speed()))
    elif not args.plan:
        print(table(args.results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
