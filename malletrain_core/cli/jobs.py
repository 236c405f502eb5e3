"""``malletrain jobs``: the elastic jobs malletraind knows, one line each (like squeue)."""

from __future__ import annotations

import argparse

from . import client
from .output import (
    Column,
    Table,
    add_output_args,
    exit_one,
    fmt_number,
    fmt_time,
    print_json,
    print_table,
)

HELP = "list the elastic jobs and their scales, like squeue"
PHASES = ("queued", "profiling", "running", "done")
"""The engine's job phases (``malletrain_core.engine.config.JobPhase``), without importing it."""

TABLE = Table([
    Column("job", "JOBID", lambda r: str(r["job"])),
    Column("state", "STATE", lambda r: str(r["state"]).upper()),
    Column("user", "USER", lambda r: r["owner"] or "-"),
    Column("model", "MODEL", lambda r: r["model"] or "-"),
    Column("trainer", "TRAINER", lambda r: r.get("trainer") or "-"),
    Column("nodes", "NODES", lambda r: str(r["nodes"]), right=True),
    Column("min", "MIN", lambda r: str(r["min_nodes"]), right=True),
    Column("max", "MAX", lambda r: str(r["max_nodes"]), right=True),
    Column("throughput", "SAMPLES/S", lambda r: fmt_number(r["throughput"]), right=True),
    Column("scale_up", "UP_S", lambda r: fmt_number(r["scale_up_s"]), right=True),
    Column("scale_down", "DOWN_S", lambda r: fmt_number(r["scale_down_s"]), right=True),
    Column("submitted", "SUBMIT_TIME", lambda r: fmt_time(r["submitted"])),
    Column("nodelist", "NODELIST", lambda r: r["node_list"] or "-"),
], default=["job", "state", "user", "model", "nodes", "min", "max", "throughput", "nodelist"])


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``jobs`` sub-command."""
    parser = subparsers.add_parser("jobs", help=HELP, description=HELP + ". A user sees their "
                                   "own jobs; root and the SlurmUser see every job.")
    parser.add_argument("--state", "-t", choices=PHASES, help="only jobs in this state")
    parser.add_argument("--user", "-u", help="only this user's jobs")
    client.add_connection_args(parser)
    add_output_args(parser, TABLE)
    parser.set_defaults(func=run)


@exit_one
def run(args: argparse.Namespace) -> int:
    """Ask the daemon, print."""
    filters = {k: v for k, v in (("state", args.state), ("user", args.user)) if v}
    answer = client.call(args, "jobs", **filters)
    if args.json:
        print_json(answer["jobs"])
    else:
        print_table(args, TABLE, answer["jobs"])
    return 0
