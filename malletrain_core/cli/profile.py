"""``malletrain profile JOB``: a job's believed scalability curve and what was measured."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

from . import client
from .output import (
    Column,
    Table,
    add_output_args,
    exit_one,
    fmt_number,
    print_json,
    print_table,
)

HELP = "show a job's measured scalability curve (throughput per node count)"

TABLE = Table([
    Column("nodes", "NODES", lambda r: str(r["nodes"]), right=True),
    Column("throughput", "SAMPLES/S", lambda r: fmt_number(r["throughput"]), right=True),
    Column("measured", "MEASURED", lambda r: fmt_number(r["measured"]), right=True),
    Column("speedup", "SPEEDUP", lambda r: fmt_number(r["speedup"], 2), right=True),
    Column("efficiency", "EFFICIENCY", lambda r: fmt_number(r["efficiency"], 2), right=True),
    Column("current", "NOW", lambda r: "*" if r["current"] else ""),
], default=["nodes", "throughput", "measured", "speedup", "efficiency", "current"])


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``profile`` sub-command."""
    parser = subparsers.add_parser(
        "profile", help=HELP, description=HELP + ". SAMPLES/S is the curve the allocator "
        "believes (measurements where there are some, interpolated between them), MEASURED "
        "the Job Monitor's window averages.")
    parser.add_argument("job", metavar="JOB", help="job id, as `malletrain jobs` shows it")
    parser.add_argument("--all", action="store_true", dest="all_scales",
                        help="every node count up to the job's maximum, not only the measured "
                             "and the curve's points")
    client.add_connection_args(parser)
    add_output_args(parser, TABLE)
    parser.set_defaults(func=run)


def rows(profile: Mapping[str, Any], all_scales: bool = False) -> list[dict[str, Any]]:
    """One row per node count: the curve's points, the measured scales and the current one
    (``all_scales``: every count up to the maximum)."""
    table = {int(k): float(v) for k, v in profile["table"]}
    measured = {int(k): float(v) for k, v in profile["measured"]}
    curve = profile["curve"] or {"nodes": []}
    if all_scales:
        scales = set(table)
    else:
        scales = set(curve["nodes"]) | set(measured)
        if profile["nodes"]:
            scales.add(int(profile["nodes"]))
    base = table.get(1)
    out = []
    for k in sorted(scales):
        p = table.get(k, measured.get(k))
        speedup = p / base if p is not None and base else None
        out.append({"nodes": k, "throughput": p, "measured": measured.get(k),
                    "speedup": speedup, "efficiency": None if speedup is None else speedup / k,
                    "current": k == profile["nodes"]})
    return out


def summary(p: Mapping[str, Any]) -> str:
    where = f"on {p['nodes']} node{'s' if p['nodes'] != 1 else ''}" if p["nodes"] else "idle"
    return (f"job {p['job']} ({p['model'] or 'no model'}, {p['owner'] or 'unknown user'}): "
            f"{p['state']} {where}, {p['min_nodes']}-{p['max_nodes']} nodes; scale-up "
            f"{fmt_number(p['scale_up_s'])} s, scale-down {fmt_number(p['scale_down_s'])} s"
            + ("" if p["curve"] else "; no curve yet (nothing measured)"))


@exit_one
def run(args: argparse.Namespace) -> int:
    """Ask the daemon, print."""
    profile = client.call(args, "profile", job=args.job)
    if args.json:
        print_json(profile)
        return 0
    if not args.noheader:
        print(summary(profile))
    print_table(args, TABLE, rows(profile, args.all_scales))
    return 0
