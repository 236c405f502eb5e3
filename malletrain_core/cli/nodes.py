"""``malletrain nodes``: the idle nodes offered to MalleTrain, free or held, and their holes."""

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
    fmt_duration,
    fmt_time,
    print_json,
    print_table,
)

HELP = "list the idle nodes MalleTrain may use, which job holds each and for how long"


def _remaining(row: Mapping[str, Any]) -> str:
    end = row["hole_end"]
    return "UNLIMITED" if end is None else fmt_duration(end - row["now"])


TABLE = Table([
    Column("node", "NODE", lambda r: r["node"]),
    Column("state", "STATE", lambda r: r["state"]),
    Column("job", "JOBID", lambda r: r["job"] or "-"),
    Column("trainer", "TRAINER", lambda r: r.get("trainer") or "-"),
    Column("remaining", "IDLE_LEFT", _remaining, right=True),
    Column("end", "HOLE_END", lambda r: "-" if r["hole_end"] is None else fmt_time(r["hole_end"])),
], default=["node", "state", "job", "remaining", "end"])


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``nodes`` sub-command."""
    parser = subparsers.add_parser("nodes", help=HELP, description=HELP + " (IDLE_LEFT: "
                                   "until the batch system plans to use the node again).")
    parser.add_argument("--state", "-t", choices=("free", "held"), help="only these nodes")
    client.add_connection_args(parser)
    add_output_args(parser, TABLE)
    parser.set_defaults(func=run)


@exit_one
def run(args: argparse.Namespace) -> int:
    """Ask the daemon, print."""
    answer = client.call(args, "nodes")
    rows = [dict(r, now=answer["now"]) for r in answer["nodes"]
            if args.state is None or r["state"] == args.state]
    if args.json:
        print_json([{k: v for k, v in r.items() if k != "now"} for r in rows])
    else:
        print_table(args, TABLE, rows)
    return 0
