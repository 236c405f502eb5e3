"""``malletrain simulate``: compare allocation policies on an idle-node trace.

Examples::

    malletrain simulate --trace summit --days 2 --jobs 50 \\
        --policies malletrain,freetrain-linear,oracle --out results/
    malletrain simulate --trace swf --workload hpo --jobs 20 --arrivals --json
    malletrain simulate --trace my_cluster.csv.gz --policies all --seeds 5
    malletrain simulate --trace sacct.json --skip-partition preemptable --jobs 10
    malletrain simulate --rescale-cost inplace --policies malletrain,freetrain-exact,oracle
    malletrain simulate --rescale-cost inplace-gpu --policies malletrain,freetrain-exact,oracle
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..model import DEFAULT_LOOKAHEAD_S
from ..sim.compare import Progress, SimOptions, compare
from ..sim.costs import COST_MODELS, DEFAULT_COST_MODEL, INPLACE, INPLACE_GPU, RescaleCosts
from ..sim.perfmodel import PerfParams
from ..sim.policies import POLICIES, parse_policies
from ..sim.report import format_table, to_json, write_plots, write_results
from ..sim.sources import SUMMIT_SKIP_EVENTS, THETA_NODES
from .trace_filter import add_filter_arguments, filter_from


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be ≥ 1")
    return value


def _non_negative(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"{value} must be ≥ 0")
    return value


def _pauses(c: RescaleCosts) -> str:
    return (f"grow pause {c.grow_pause_s:g} s after the joiners' {c.joiner_start_s:g} s start, "
            f"shrink pause {c.shrink_pause_s:g} s or preemption pause {c.preempt_pause_s:g} s "
            f"plus the step in flight")


def rescale_cost_help() -> str:
    """``--rescale-cost``'s help, its figures read from the cost models themselves (so they
    cannot drift from what the simulator charges)."""
    return ("what a grow, shrink or preemption costs a job: 'restart' (every worker restarts "
            "from the disk checkpoint: the job's profiled scale-up / scale-down time, ≈ 18 / "
            f"12 s), '{INPLACE.name}' (survivors keep training: {_pauses(INPLACE)}; measured "
            f"on CPU nodes, gloo) or '{INPLACE_GPU.name}' (the same on GPU nodes, NCCL: "
            f"{_pauses(INPLACE_GPU)}; measured on one H100). Sources: "
            "malletrain_core/sim/costs.py; losing every node still costs a disk restart "
            "(default: %(default)s)")


def register(subparsers: Any) -> None:
    """Add the ``simulate`` sub-command."""
    p = subparsers.add_parser(
        "simulate", help="compare policies on an idle-node trace",
        description="Replay an idle-node trace with the real engine under several policies "
                    "and report net samples, the share of the upper bound UB_oracle, node "
                    "utilisation, rescales, preemption losses and completions.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=f"policies: {', '.join(POLICIES)} (or 'all')")
    p.add_argument("--trace", default="summit",
                   help="summit, swf, synthetic, or a .swf, a site's accounting (sacct "
                        "--json or -P output, a PBS accounting log: each node's own idle "
                        "gaps), an ALCF job-log .csv or a unix_time,node,idle .csv[.gz] file "
                        "(default: summit)")
    p.add_argument("--workload", default="imagenet", choices=("imagenet", "hpo"),
                   help="job mix from the measured profiles (default: imagenet)")
    p.add_argument("--jobs", type=_positive_int, default=50, help="number of jobs (default %(default)s)")
    p.add_argument("--arrivals", action="store_true",
                   help="jobs arrive at their Tsub and finish after Pmax samples (default: "
                        "saturated, all at the start, never finishing)")
    p.add_argument("--days", type=float, default=None,
                   help="replay only this many days of the trace (default: all)")
    p.add_argument("--policies", default="malletrain,freetrain-exact,freetrain-linear,oracle",
                   help="comma-separated policies to compare")
    p.add_argument("--seed", type=int, default=0, help="first seed (default %(default)s)")
    p.add_argument("--seeds", type=_positive_int, default=1,
                   help="number of seeds, seed … seed+K−1 (default %(default)s)")
    p.add_argument("--out", type=Path, default=None,
                   help="write results.json, nodes.png and throughput.png into this folder")
    p.add_argument("--json", action="store_true", help="print results.json instead of a table")
    p.add_argument("--lookahead-s", type=_non_negative, default=DEFAULT_LOOKAHEAD_S,
                   help="the allocator's look-ahead in seconds (default %(default)g)")
    p.add_argument("--node-order", choices=("name", "random"), default="name",
                   help="which free node a growing job takes when nothing else decides: "
                        "lowest name first, or names shuffled by the seed (default: name)")
    p.add_argument("--checkpoint-s", type=_non_negative, default=0.0,
                   help="periodic checkpoint interval; a preemption loses the progress since "
                        "the last one (default %(default)g: continuous, the prototype's cost model)")
    p.add_argument("--rescale-cost", choices=tuple(COST_MODELS), default=DEFAULT_COST_MODEL,
                   help=rescale_cost_help())
    p.add_argument("--noise", type=_non_negative, default=PerfParams().noise,
                   help="σ of the log-normal throughput noise (default %(default)g)")
    p.add_argument("--machine-nodes", type=_positive_int, default=THETA_NODES,
                   help=f"machine size for SWF traces (default {THETA_NODES})")
    p.add_argument("--nodes", type=_positive_int, default=256,
                   help="machine size for synthetic traces (default %(default)s)")
    p.add_argument("--skip-events", type=int, default=None,
                   help="fold this many first event times into the start state (default: "
                        f"{SUMMIT_SKIP_EVENTS} for summit, the first day for SWF, else 0)")
    p.add_argument("--learn-days", type=float, default=None,
                   help="learn reclaim statistics for malletrain-lifetime on the trace's first "
                   "LEARN_DAYS, then replay the --days after them (default: learn from the "
                   "Summit fragment lengths, replay from the start)")
    p.add_argument("--workers", type=_positive_int, default=1,
                   help="replay policies and seeds in this many processes (default %(default)s; the "
                        "results do not depend on it)")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    add_filter_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.skip_events is not None and args.skip_events < 0:
        raise ConfigError(f"--skip-events {args.skip_events}: give a number ≥ 0")
    opts = SimOptions(
        trace=args.trace, workload=args.workload, jobs=args.jobs, arrivals=args.arrivals,
        days=args.days, policies=tuple(parse_policies(args.policies)), seed=args.seed,
        seeds=args.seeds, lookahead_s=args.lookahead_s, node_order=args.node_order,
        machine_nodes=args.machine_nodes, synthetic_nodes=args.nodes,
        skip_events=args.skip_events, learn_days=args.learn_days, accounting=filter_from(args),
        perf=PerfParams(noise=args.noise, checkpoint_interval_s=args.checkpoint_s,
                        rescale_cost=args.rescale_cost))
    n_runs = sum(1 for p in opts.policies if p != "oracle") * opts.seeds
    comparison = compare(opts, Progress(n_runs, sys.stderr), workers=args.workers)
    results = comparison.results
    if args.out is not None:
        write_results(results, args.out)
        if not args.no_plots:
            first = {p: r[0] for p, r in comparison.runs.items() if r}
            write_plots(args.out, comparison.trace, first, comparison.bounds[0])
    if args.json:
        print(to_json(results))
    else:
        print(format_table(results))
        if args.out is not None:
            print(f"results in {args.out}/results.json")
    return 0
