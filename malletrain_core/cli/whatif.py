"""``malletrain admin what-if``: what MalleTrain would harvest on this site, from its own
Slurm or PBS accounting (see :mod:`malletrain_core.sim.whatif`).

Examples::

    sacct -a -X -D -S 2026-10-01 -E 2026-11-01 --json > october.json
    malletrain admin what-if october.json --skip-partition preemptable --out whatif/
    malletrain admin what-if /var/spool/pbs/server_priv/accounting/20261020 --json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..sim.compare import Progress
from ..sim.costs import COST_MODELS
from ..sim.report import to_json
from ..sim.whatif import AUTO, NODE_KINDS, WhatIfOptions, format_report, what_if, write_plots
from .trace_filter import add_filter_arguments, filter_from

DESCRIPTION = ("Read a site's own accounting (sacct --json, sacct -P with its header, or a PBS "
               "accounting log), and answer what MalleTrain would have harvested there: the "
               "idle node-hours in the window, the share of them the engine would have "
               "trained on under the site's own rescale costs (GPU or CPU nodes; --compare: "
               "each cost model), and the training throughput of the profiled workload; with "
               "--out, whatif.json, whatif.md, idle.png and share.png.")


def _names(text: str) -> tuple[str, ...]:
    return tuple(t.strip() for t in text.split(",") if t.strip())


def register_admin(sub: Any) -> None:
    """Add ``what-if`` under ``malletrain admin``."""
    p = sub.add_parser("what-if", help="what MalleTrain would harvest here, from this site's "
                       "sacct or PBS accounting", description=DESCRIPTION,
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog=__doc__.split("Examples::", 1)[1])
    p.add_argument("trace", help="sacct --json or -P output, or a PBS accounting log")
    p.add_argument("--days", type=float, default=None,
                   help="only this many days from the log's start (default: all of it)")
    p.add_argument("--workload", default="imagenet", choices=("imagenet", "hpo"),
                   help="job mix from the measured profiles (default: imagenet)")
    p.add_argument("--jobs", type=int, default=50, help="saturated jobs (default 50)")
    p.add_argument("--seed", type=int, default=0, help="draws the job set (default 0)")
    p.add_argument("--nodes", choices=tuple(NODE_KINDS), default=AUTO,
                   help="the site's nodes: gpu (the in-place costs measured on an H100) or "
                   "cpu; auto (default): gpu when any run of the accounting held GPUs")
    p.add_argument("--compare", action="store_true",
                   help=f"replay every cost model ({', '.join(COST_MODELS)}), not only the "
                   "site's own (about three times as long)")
    p.add_argument("--cost-models", type=_names, default=(),
                   help=f"comma-separated, among {','.join(COST_MODELS)} (default: the "
                   "site's own, see --nodes)")
    p.add_argument("--workers", type=int, default=None,
                   help="replay the cost models in this many processes (default: one per "
                   "cost model, on a machine with at least two cores)")
    p.add_argument("--out", type=Path, default=None,
                   help="write whatif.json, whatif.md, idle.png and share.png here")
    p.add_argument("--json", action="store_true", help="print whatif.json instead of a table")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    add_filter_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.compare and args.cost_models:
        raise ConfigError("give --compare (every cost model) or --cost-models, not both")
    opts = WhatIfOptions(trace=args.trace, accounting=filter_from(args), days=args.days,
                         workload=args.workload, jobs=args.jobs, seed=args.seed,
                         cost_models=tuple(COST_MODELS) if args.compare else args.cost_models,
                         nodes=args.nodes)
    result = what_if(opts, workers=None if args.workers is None else max(1, args.workers),
                     progress=Progress(1, sys.stderr, name="what-if"))
    text = format_report(result.report)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "whatif.json").write_text(to_json(result.report) + "\n")
        (args.out / "whatif.md").write_text(text + "\n")
        if not args.no_plots:
            write_plots(args.out, result)
    if args.json:
        print(to_json(result.report))
    else:
        print(text)
        if args.out is not None:
            print(f"report in {args.out}/whatif.md")
    return 0
