"""How long ``malletrain admin what-if`` takes on a month of a 4,000-node machine.

No site's month-long accounting is at hand, so this writes one: ``sacct -P`` output of a
synthetic machine (``--nodes`` nodes named ``nid0000``…, ``--days`` days) whose jobs arrive
at random (Poisson, sized for ``--load`` of the machine), ask for 1 to 1,024 nodes (log-uniform)
for a log-normal run time (median 1 h), and each take the nodes that free up first, starting
once all of them are free: the gaps a real machine leaves while a wide job waits. Then it
times reading that file into a trace, and the what-if replays (one per cost model) with the
real engine (in one process per cost model on two cores or more, unless ``--workers``),
with each replay's CPU seconds beside its wall time (the cores may be shared), and where one
replay's time goes (the restart model over ``--profile-days`` under cProfile). The what-if
shows its progress on stderr as the CLI's does; where it replays in this process and there
are two cores or more, the file's parse alone (a row of the table) and the profile run in
another process meanwhile, so the bench takes about the what-if's time. It prints one
JSON object (last line); ``--markdown`` rewrites the section of BENCHMARKS.md.

``--verify`` then replays the same month again in the checked mode
(:mod:`malletrain_core.shortcuts`: at every exact shortcut taken, the full computation too,
refused at the first difference) and fails unless the report's figures are the same as the
timed run's; it prints how many shortcuts were checked.

    python3 -m bench.whatif [--nodes 4000] [--days 30] [--jobs 50] [--workers N] [--compare]
                            [--profile-days 5] [--markdown] [--verify] [--split]

``--split`` also replays the restart model over the whole month in this process with the CPU
time of the engine's re-plans, the rest of its event handling and the simulated batch system
counted apart (``split`` in the JSON): what is left of a replay if a re-plan cost nothing.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]

if __name__ == "__main__" and not __package__:  # started as a file; bench/ is a package
    sys.exit("run it as a module from the repository's root: python -m bench.whatif "
             + " ".join(sys.argv[1:]))
from bench.sections import host, replace_section  # noqa: E402
from malletrain_core.hostlist import fold  # noqa: E402
from malletrain_core.sim import whatif as whatif_module  # noqa: E402
from malletrain_core.sim.accounting import read_accounting  # noqa: E402
from malletrain_core.sim.compare import Progress  # noqa: E402
from malletrain_core.sim.costs import COST_MODELS  # noqa: E402
from malletrain_core.sim.whatif import (  # noqa: E402
    WhatIfOptions,
    default_workers,
    format_report,
    what_if,
)

BEGIN, END = "<!-- whatif:begin -->", "<!-- whatif:end -->"
START = 1790812800.0  # 2026-10-01 00:00 UTC


def write_sacct(path: Path, nodes: int, days: float, load: float, seed: int) -> int:
    """A synthetic month of ``sacct -P`` output (see the module doc); returns its job count."""
    rng = np.random.default_rng(seed)
    span = days * 86400.0
    sizes_mean = np.mean(np.exp(rng.uniform(0, np.log(1024), 100000)).astype(int).clip(1))
    runs_mean = np.exp(np.log(3600.0) + 1.0 ** 2 / 2)
    rate = load * nodes / (sizes_mean * runs_mean)
    free = np.zeros(nodes)  # when each node frees up, seconds from START
    names = [f"nid{i:04d}" for i in range(nodes)]
    hostlist = _fold_nids if nodes <= 10000 else lambda pick: fold(names[i] for i in pick)
    t = 0.0
    count = 0
    with open(path, "w") as fh:
        fh.write("JobID|Partition|Reservation|State|NodeList|Start|End\n")
        while True:
            t += rng.exponential(1 / rate)
            if t >= span:
                break
            k = int(min(nodes, max(1, np.exp(rng.uniform(0, np.log(1024))))))
            run = float(np.clip(rng.lognormal(np.log(3600.0), 1.0), 60, 2 * 86400))
            pick = np.argpartition(free, k - 1)[:k]
            start = max(t, float(free[pick].max()))
            if start >= span:
                continue
            free[pick] = start + run
            count += 1
            fh.write(f"{count}|batch||COMPLETED|{hostlist(sorted(pick.tolist()))}|"
                     f"{_stamp(START + start)}|{_stamp(START + start + run)}\n")
    return count


def _fold_nids(indices: list[int]) -> str:
    """The hostlist of ``nid0000``… nodes at sorted ``indices``, as :func:`fold` writes it
    (``nid[0001-0003,0007]``, a lone node without brackets), without building a ClusterShell
    NodeSet per job: ``fold`` was nine tenths of writing the month (12 of 13 s). Four digits
    only; ``tests/test_bench_whatif.py`` compares the two."""
    if len(indices) == 1:
        return f"nid{indices[0]:04d}"
    ranges = []
    first = prev = indices[0]
    for i in indices[1:]:
        if i != prev + 1:
            ranges.append(f"{first:04d}" if first == prev else f"{first:04d}-{prev:04d}")
            first = i
        prev = i
    ranges.append(f"{first:04d}" if first == prev else f"{first:04d}-{prev:04d}")
    return f"nid[{','.join(ranges)}]"


PROFILED = {  # label -> (file, function): where a replay's time goes (cumulative, overlapping)
    "engine, all events (Engine.handle_many)": ("engine/engine.py", "handle_many"),
    "re-plans (Engine._replan)": ("engine/engine.py", "_replan"),
    "believed curves (corrected_curve)": ("engine/curves.py", "corrected_curve"),
    "allocator solve (allocator.dp.solve)": ("allocator/dp.py", "solve"),
    "store-learning check per report and re-plan (StoreLearning._new_points)":
        ("engine/learning.py", "_new_points"),
    "throughput estimates (Monitor.report)": ("engine/monitor.py", "report"),
    "simulated batch system (SimBackend.poll + execute)": ("sim/backend.py", "poll|execute"),
}


def profile_shares(path: Path, days: float, jobs: int, seed: int, cost: str) -> dict[str, Any]:
    """One cost model's replay of the first ``days`` under cProfile (the replay only, not the
    reading of the trace): the share of its time inside each of :data:`PROFILED`
    (cumulative, so they overlap; cProfile's own overhead weighs on the many small calls)."""
    import cProfile
    import pstats

    prof = cProfile.Profile()
    inner = whatif_module.replay

    def profiled(*a: Any, **k: Any) -> Any:  # the replay only: its share is what is asked
        prof.enable()
        try:
            return inner(*a, **k)
        finally:
            prof.disable()

    whatif_module.replay = profiled
    try:
        what_if(WhatIfOptions(trace=str(path), jobs=jobs, seed=seed, days=days,
                              cost_models=(cost,)), workers=1)
    finally:
        whatif_module.replay = inner
    stats: Any = pstats.Stats(prof)
    total = max((ct for (_, _, fn), (_, _, _, ct, _) in stats.stats.items()
                 if fn == "replay"), default=0.0)
    shares = {}
    for label, (file, names) in PROFILED.items():
        ct = sum(v[3] for (f, _, fn), v in stats.stats.items()
                 if f.endswith(file) and fn in names.split("|"))
        shares[label] = round(ct / total, 3) if total else None
    return {"cost_model": cost, "days": days, "replay_s_under_cprofile": round(total, 1),
            "shares": shares}


def split_cpu(path: Path, jobs: int, seed: int, cost: str) -> dict[str, Any]:
    """One cost model's replay of the whole trace in this process, its CPU seconds split into
    the engine's re-plans (``Engine._replan``), the engine's other event handling (the rest
    of ``Engine.handle_many``), the simulated batch system (``SimBackend.poll`` and
    ``execute``) and the rest (reading the trace, the replay's own loop)."""
    from malletrain_core.engine.engine import Engine
    from malletrain_core.sim.backend import SimBackend

    spent = dict.fromkeys(("replan", "handle", "backend"), 0.0)
    saved = []

    def count(cls: Any, name: str, key: str) -> None:
        inner = getattr(cls, name)
        saved.append((cls, name, inner))

        def counted(*a: Any, **k: Any) -> Any:
            t = time.process_time()
            try:
                return inner(*a, **k)
            finally:
                spent[key] += time.process_time() - t
        setattr(cls, name, counted)

    count(Engine, "_replan", "replan")
    count(Engine, "handle_many", "handle")
    count(SimBackend, "poll", "backend")
    count(SimBackend, "execute", "backend")
    t = time.process_time()
    try:
        what_if(WhatIfOptions(trace=str(path), jobs=jobs, seed=seed, cost_models=(cost,)),
                workers=1)
    finally:
        for cls, name, inner in saved:
            setattr(cls, name, inner)
    total = time.process_time() - t
    return {"cost_model": cost, "total_cpu_s": round(total, 3),
            "replans_cpu_s": round(spent["replan"], 3),
            "engine_other_cpu_s": round(spent["handle"] - spent["replan"], 3),
            "sim_backend_cpu_s": round(spent["backend"], 3),
            "rest_cpu_s": round(total - spent["handle"] - spent["backend"], 3)}


def side_work(path: Path, profile_days: float, jobs: int, seed: int
              ) -> tuple[float, int, dict[str, Any] | None]:
    """What the bench measures beside the timed what-if: the wall seconds of parsing the file
    alone, its run count, and the profile (:func:`profile_shares`, none for 0 days)."""
    t0 = time.perf_counter()
    runs = len(read_accounting(path).runs)
    parse_s = time.perf_counter() - t0
    profile = profile_shares(path, profile_days, jobs, seed, "restart") \
        if profile_days > 0 else None
    return parse_s, runs, profile


def makespan(cpu_s: list[float], workers: int, cores: int | None = None) -> float:
    """Wall seconds of replays taking ``cpu_s`` each in ``workers`` processes on ``cores`` idle
    cores (all of them when ``None``), handed out in order to the first free process (as the
    process pool does); more processes than cores share the cores evenly."""
    cores = cores or os.cpu_count() or 1
    loads = [0.0] * max(1, workers)
    for c in cpu_s:
        loads[loads.index(min(loads))] += c
    if workers <= cores:
        return max(loads)
    return max(max(loads), sum(loads) / cores)


def figures(report: dict[str, Any]) -> dict[str, Any]:
    """The report without its timings: what must not change with the code's speed."""
    return {k: v for k, v in report.items() if k != "timing_s"} | {
        "cost_models": {c: {k: v for k, v in m.items()
                            if k not in ("replay_wall_s", "replay_cpu_s", "shortcuts_checked")}
                        for c, m in report["cost_models"].items()}}


def _took(cpus: list[float], workers: int, beside: bool) -> str:
    """The replays' CPU seconds and the wall time they need on idle cores, in words;
    ``beside``: the parse and the profile ran in another process meanwhile."""
    cores = os.cpu_count() or 1
    idle = f"{cores} idle core{'s' if cores != 1 else ''}"
    same = "(wall time above that is other processes on the same cores)"
    text = (f"it took {cpus[0]:.0f} CPU seconds here {same}, so about {cpus[0]:.0f} s on {idle}"
            if len(cpus) == 1 else
            f"they took {min(cpus):.0f}–{max(cpus):.0f} CPU seconds each here {same}, so "
            f"{len(cpus)} cost models in {workers} process{'es' if workers != 1 else ''} need "
            f"about {makespan(cpus, workers):.0f} s on {idle}")
    return text + ("; the parse alone and the profile below ran in another process meanwhile."
                   if beside else ".")


def _stamp(t: float) -> str:
    return datetime.fromtimestamp(round(t), timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=4000)
    p.add_argument("--days", type=float, default=30.0)
    p.add_argument("--load", type=float, default=0.9, help="offered load (default 0.9)")
    p.add_argument("--jobs", type=int, default=50, help="saturated training jobs (default 50)")
    p.add_argument("--workers", type=int, default=None,
                   help="processes for the replays (default: one per cost model on two "
                   "cores or more)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--compare", action="store_true",
                   help="replay every cost model, as `what-if --compare` (default: the "
                   "site's own only, as `what-if` without it: inplace, the synthetic log "
                   "holding no GPU)")
    p.add_argument("--markdown", action="store_true", help="rewrite BENCHMARKS.md's section")
    p.add_argument("--profile-days", type=float, default=5.0,
                   help="also replay this many days of the restart model under cProfile, for "
                   "where the time goes (0: skip; default 5)")
    p.add_argument("--verify", action="store_true",
                   help="replay again with every exact shortcut checked against the full "
                   "computation, and fail unless the figures are the same")
    p.add_argument("--split", action="store_true",
                   help="also replay the restart model in this process with its re-plans, "
                   "other event handling and simulated batch system timed apart")
    args = p.parse_args()
    os.environ["TZ"] = "UTC"  # the file's times are UTC
    time.tzset()
    models = tuple(COST_MODELS) if args.compare else ()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "sacct.txt"
        t0 = time.perf_counter()
        jobs = write_sacct(path, args.nodes, args.days, args.load, args.seed)
        gen_s = time.perf_counter() - t0
        side_args = (path, args.profile_days, args.jobs, args.seed)
        # The parse alone and the profile run in another process beside the what-if where
        # that leaves a core idle: the what-if's replays in this process, two cores or more.
        replays = len(models) or 1
        in_process = replays == 1 or (args.workers if args.workers is not None
                                      else default_workers(replays)) == 1
        aside = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context()) \
            if in_process and (os.cpu_count() or 1) >= 2 else None
        try:
            side = aside.submit(side_work, *side_args) if aside is not None else None
            result = what_if(WhatIfOptions(trace=str(path), jobs=args.jobs, seed=args.seed,
                                           cost_models=models), workers=args.workers,
                             progress=Progress(1, sys.stderr, name="what-if"))
            parse_s, runs, profile = side.result() if side is not None else \
                side_work(*side_args)
        finally:
            if aside is not None:
                aside.shutdown()
        size_mb = path.stat().st_size / 1e6
        split = split_cpu(path, args.jobs, args.seed, "restart") if args.split else None
        if split is not None:
            print(f"split: {split}", file=sys.stderr)
        verified = None
        if args.verify:
            checked = what_if(WhatIfOptions(trace=str(path), jobs=args.jobs, seed=args.seed,
                                       cost_models=models),
                              workers=args.workers, checked=True).report
            same = figures(checked) == figures(result.report)
            verified = {"same_figures": same,
                        "shortcuts_checked": {c: m["shortcuts_checked"]
                                              for c, m in checked["cost_models"].items()}}
            print(f"verify: figures {'the same' if same else 'DIFFER'}; shortcuts checked "
                  f"{verified['shortcuts_checked']}", file=sys.stderr)
    report = result.report
    out = {"nodes": args.nodes, "days": args.days, "load": args.load, "sacct_jobs": jobs,
           "sacct_mb": round(size_mb, 1), "generate_s": round(gen_s, 1),
           "parse_s": round(parse_s, 2), "runs": runs,
           "trace_steps": result.trace.steps, "read_s": round(report["timing_s"]["read"], 2),
           "replays_s": round(report["timing_s"]["replays"], 1),
           "total_s": round(report["timing_s"]["total"], 1),
           "workers": report["timing_s"]["workers"],
           "replays_on_idle_cores_s": round(makespan(
               [m["replay_cpu_s"] for m in report["cost_models"].values()],
               report["timing_s"]["workers"]), 1),
           "idle_node_hours": round(report["idle_node_hours"]),
           "idle_share_of_machine": round(report["idle_share_of_machine"], 4),
           "cost_models": {c: {"harvested_share": round(m["harvested_share"], 4),
                               "samples_per_s": round(m["samples_per_s"]),
                               "ub_oracle_share": round(m["ub_oracle_share"], 4),
                               "replay_wall_s": round(m["replay_wall_s"], 1),
                               "replay_cpu_s": round(m["replay_cpu_s"], 1),
                               "replans": m["replans"]}
                           for c, m in report["cost_models"].items()},
           "profile": profile, "verify": verified, "split": split}
    print(format_report(report), file=sys.stderr)
    if args.markdown:
        models = report["cost_models"]
        cpus = [m["replay_cpu_s"] for m in models.values()]
        workers = report["timing_s"]["workers"]
        body = "\n".join([
            BEGIN,
            f"`python3 -m bench.whatif --nodes {args.nodes} --days {args.days:g} --jobs "
            f"{args.jobs}{' --compare' if args.compare else ''}` on {host()}: a synthetic "
            "`sacct -P` month "
            f"({jobs:,} jobs, {size_mb:.1f} MB; Poisson arrivals at {args.load:g} offered "
            "load, 1–1,024 nodes, log-normal run times with a 1-h median, each job on the "
            "nodes that free up first) read and replayed by `malletrain admin what-if"
            + (" --compare`, the " if args.compare else "` (its default: the site's own cost "
               "model only, `inplace` here as no run held a GPU), the ")
            + (f"cost models in {workers} process{'es' if workers != 1 else ''} "
               + ("(the default: one per cost model on two cores or more)."
                  if args.workers is None else f"(`--workers {args.workers}`).")
               if len(models) > 1 else "replay in this process."),
            "",
            "| step | wall s | CPU s |",
            "| --- | ---: | ---: |",
            f"| parse sacct -P ({runs:,} runs) | {parse_s:.2f} | |",
            f"| read into a trace, parse included ({result.trace.steps:,} event times) | "
            f"{report['timing_s']['read']:.2f} | |",
            *(f"| replay, {c} cost model ({m['replans']:,} re-plans) | "
              f"{m['replay_wall_s']:.1f} | {m['replay_cpu_s']:.1f} |" for c, m in models.items()),
            f"| total | {report['timing_s']['total']:.1f} | |",
            "",
            f"Each replay is the production engine taking every event of the month (the "
            f"backend's node changes, the jobs' progress reports every 300 s, a re-plan "
            f"wherever the engine calls for one); {_took(cpus, workers, aside is not None)} "
            "The engine's work per event is the daemon's own, so the shares below are where a "
            "faster month has to come from: above all the allocator's solve at each re-plan.",
            *([] if profile is None else [
                "",
                f"Where a replay's time goes (the restart model over the first "
                f"{profile['days']:g} days under cProfile, "
                f"{profile['replay_s_under_cprofile']:.0f} s; cumulative shares, so nested "
                "ones overlap):",
                "",
                "| inside | share |",
                "| --- | ---: |",
                *(f"| {label} | {100 * share:.0f} % |"
                  for label, share in profile["shares"].items() if share is not None)]),
            "",
            format_report(report).split("\n\n")[1],
            END])
        replace_section(REPO / "BENCHMARKS.md", BEGIN, END, body,
                        "What-if on a site's accounting")
    print(json.dumps(out))
    return 1 if verified is not None and not verified["same_figures"] else 0


if __name__ == "__main__":
    sys.exit(main())
