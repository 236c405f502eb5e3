"""Run several policies over several seeds on one trace and collect the results."""

from __future__ import annotations

import math
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from typing import Any, TextIO

from ..engine.survival import learn_from_trace, split_trace
from ..errors import ConfigError
from ..model import DEFAULT_LOOKAHEAD_S, Curve
from .accounting import AccountingFilter
from .bounds import BoundJob, Bounds, compute_bounds
from .measured import load_profiles
from .perfmodel import PerfParams
from .policies import LIFETIME_POLICIES, RUN_POLICIES
from .replay import RunResult, replay
from .report import aggregate
from .sources import THETA_NODES, load_trace
from .traces import Trace
from .workloads import SimJob, make_workload, model_curves


@dataclass(frozen=True)
class SimOptions:
    """Everything a comparison depends on (the CLI's flags)."""

    trace: str = "summit"
    workload: str = "imagenet"
    jobs: int = 50
    arrivals: bool = False
    days: float | None = None
    policies: tuple[str, ...] = ("malletrain", "freetrain-exact", "oracle")
    seed: int = 0
    seeds: int = 1
    lookahead_s: float = DEFAULT_LOOKAHEAD_S
    node_order: str = "name"
    machine_nodes: int = THETA_NODES
    synthetic_nodes: int = 256
    skip_events: int | None = None
    learn_days: float | None = None
    """Learn reclaim statistics on the first days of the trace, replay the ``days`` after."""
    perf: PerfParams = field(default_factory=PerfParams)
    accounting: AccountingFilter = field(default_factory=AccountingFilter)
    """Which runs of a site's accounting (sacct, PBS) hold nodes."""

    def __post_init__(self) -> None:
        if self.seeds < 1:
            raise ConfigError(f"--seeds {self.seeds}: give at least 1")
        if self.node_order not in ("name", "random"):
            raise ConfigError(f"--node-order {self.node_order!r}: choose name or random")
        if not self.lookahead_s >= 0:
            raise ConfigError(f"--lookahead-s {self.lookahead_s}: give seconds ≥ 0")
        if self.days is not None and not self.days > 0:
            raise ConfigError(f"--days {self.days}: give a number of days > 0")


@dataclass
class Comparison:
    """The trace, per-seed bounds, every run, and results.json's content."""

    trace: Trace
    bounds: list[Bounds | None]
    runs: dict[str, list[RunResult]]
    results: dict[str, Any]


class Progress:
    """A progress bar on a terminal, plain lines every few seconds otherwise."""

    def __init__(self, total_units: int, stream: TextIO | None = None,
                 every_s: float = 10.0, name: str = "simulate") -> None:
        self.name = name
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.total = max(total_units, 1)
        self.every_s = every_s
        self._last = -math.inf
        self._start = time.monotonic()
        self._width = 0
        self._ended = False

    def update(self, units_done: float, label: str) -> None:
        now = time.monotonic()
        share = min(units_done / self.total, 1.0)
        if self.tty:
            bar = "#" * int(share * 30)
            line = f"[{bar:<30}] {share * 100:5.1f}% {label:<34}"
            self._width = max(self._width, len(line))
            self.stream.write("\r" + line)
            self.stream.flush()
        elif now - self._last >= self.every_s or (share >= 1.0 and not self._ended):
            self._last = now
            self._ended = share >= 1.0  # the end is always said, once
            self.stream.write(f"{self.name}: {share * 100:5.1f}% {label} "
                              f"({now - self._start:.0f} s)\n")
            self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\r" + " " * self._width + "\r")
            self.stream.flush()


def compare(opts: SimOptions, progress: Progress | None = None, workers: int = 1) -> Comparison:
    """Replay every policy of ``opts`` on every seed and aggregate the figures; ``workers`` > 1
    runs the replays in that many processes (results do not depend on it)."""
    trace = load_trace(opts.trace, days=None if opts.learn_days else opts.days, seed=opts.seed,
                       machine_nodes=opts.machine_nodes, synthetic_nodes=opts.synthetic_nodes,
                       skip_events=opts.skip_events, accounting=opts.accounting)
    lifetime_options: dict[str, dict[str, Any]] = {}
    if opts.learn_days is not None:
        learn, trace = split_trace(trace, opts.learn_days, opts.days)
        predictor = learn_from_trace(learn, opts.lookahead_s)
        lifetime_options = {p: {"lifetime": predictor} for p in LIFETIME_POLICIES}
    if opts.node_order == "random":
        trace = trace.renamed(opts.seed)
    profiles = load_profiles(opts.workload)
    extra = load_profiles("imagenet") if opts.workload != "imagenet" else profiles
    run_policies = [p for p in opts.policies if p in RUN_POLICIES]
    with_oracle = "oracle" in opts.policies
    seeds = [opts.seed + i for i in range(opts.seeds)]
    bounds: list[Bounds | None] = []
    oracle_wall = 0.0
    units: list[tuple[str, int, list[SimJob], dict[str, Curve]]] = []
    for seed in seeds:
        jobs = make_workload(opts.workload, opts.jobs, arrivals=opts.arrivals, seed=seed,
                             start=trace.start, end=trace.end, profiles=profiles)
        t0 = time.perf_counter()
        bounds.append(None if opts.arrivals else compute_bounds(
            trace, [BoundJob(j.curve, j.min_nodes, j.max_nodes) for j in jobs]))
        oracle_wall += time.perf_counter() - t0
        catalogue = model_curves(jobs, extra)
        units.extend((policy, seed, jobs, catalogue) for policy in run_policies)
    done: list[RunResult] = []
    if workers > 1 and len(units) > 1:
        done = _run_parallel(trace, opts, units, workers, progress, lifetime_options)
    else:
        for i, (policy, seed, jobs, catalogue) in enumerate(units):
            def note(share: float, _u: int = i, _p: str = policy, _s: int = seed) -> None:
                if progress is not None:
                    progress.update(_u + share, f"{_p} seed {_s}")
            done.append(replay(trace, jobs, policy, seed=seed, lookahead_s=opts.lookahead_s,
                               engine_options=lifetime_options.get(policy),
                               params=opts.perf, catalogue=catalogue, progress=note))
    runs: dict[str, list[RunResult]] = {p: [] for p in run_policies}
    for result in done:
        runs[result.policy].append(result)
    if progress is not None:
        progress.close()
    meta = {
        "trace": {"name": trace.name, "nodes": len(trace.node_names), "start": trace.start,
                  "end": trace.end, "days": trace.span_s / 86400.0, "steps": trace.steps},
        "workload": {"name": opts.workload, "jobs": opts.jobs, "arrivals": opts.arrivals},
        "seeds": seeds,
        "lookahead_s": opts.lookahead_s,
        "learn_days": opts.learn_days,
        "node_order": opts.node_order,
        "perf_model": asdict(opts.perf),
    }
    results = aggregate(meta, runs, bounds, trace.idle_node_seconds(),
                        oracle_wall_s=oracle_wall / len(seeds), with_oracle=with_oracle)
    if with_oracle and opts.arrivals:
        results["notes"] = ["UB_oracle is defined for saturated workloads only; with arrivals "
                            "compare completed jobs and completion times"]
    return Comparison(trace=trace, bounds=bounds, runs=runs, results=results)


def _run_unit(trace: Trace, opts: SimOptions, unit: tuple[str, int, list[SimJob],
              dict[str, Curve]], lifetime_options: dict[str, dict[str, Any]]) -> RunResult:
    policy, seed, jobs, catalogue = unit
    return replay(trace, jobs, policy, seed=seed, lookahead_s=opts.lookahead_s,
                  engine_options=lifetime_options.get(policy),
                  params=opts.perf, catalogue=catalogue)


def _run_parallel(trace: Trace, opts: SimOptions,
                  units: list[tuple[str, int, list[SimJob], dict[str, Curve]]], workers: int,
                  progress: Progress | None,
                  lifetime_options: dict[str, dict[str, Any]]) -> list[RunResult]:
    results: list[RunResult | None] = [None] * len(units)
    with ProcessPoolExecutor(max_workers=workers) as pool:
        futures = {pool.submit(_run_unit, trace, opts, unit, lifetime_options): i
                   for i, unit in enumerate(units)}
        finished = 0
        for future in as_completed(futures):
            i = futures[future]
            results[i] = future.result()
            finished += 1
            if progress is not None:
                progress.update(finished, f"{units[i][0]} seed {units[i][1]} done")
    return [r for r in results if r is not None]
