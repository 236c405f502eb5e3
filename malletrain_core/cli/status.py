"""``malletrain status``: the daemon at a glance (nodes, jobs, its cycle and the engine's work)."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

from . import client
from .output import add_output_args, exit_one, fmt_duration, fmt_number, fmt_time, print_json

HELP = "show what malletraind is doing: nodes, jobs, cycles, rescales"


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``status`` sub-command."""
    parser = subparsers.add_parser("status", help=HELP, description=HELP + ".")
    client.add_connection_args(parser)
    add_output_args(parser, None)
    parser.set_defaults(func=run)


def format_status(s: Mapping[str, Any]) -> str:
    """The status as a few labelled lines."""
    nodes, jobs, d, e = s["nodes"], s["jobs"], s["daemon"], s["engine"]
    actions = " ".join(f"{k.lower()}={v}" for k, v in d["actions"].items()) or "none"
    held_s = float(e.get("held_node_s", 0.0))
    harvested = f"{held_s:.0f} node-s" if held_s < 3600 else f"{held_s / 3600:.1f} node-h"
    lines = [
        f"malletraind {s['version']} ({s['backend']} backend), up "
        f"{fmt_duration(s['now'] - s['started'])}",
        f"nodes    {nodes['held']} held, {nodes['free']} free",
        "jobs     " + ", ".join(f"{n} {phase}" for phase, n in jobs.items()),
        f"cycles   {d['cycles']} (last {fmt_number(d['last_cycle_ms'])} ms, last poll "
        f"{fmt_time(d['last_poll_time'])}), {d['events']} events, "
        f"{d['command_failures']} command failures",
        f"actions  {actions}",
        f"engine   {e.get('replans', 0)} re-plans, {e.get('grows', 0)} grows, "
        f"{e.get('shrinks', 0)} shrinks, {e.get('preemptions', 0)} preemptions, "
        f"{e.get('solves', 0)} solves in {fmt_number(e.get('solve_ms', 0.0))} ms, "
        f"{harvested} harvested",
    ]
    if s.get("drain", {}).get("drained"):
        lines.insert(1, f"DRAINED  since {fmt_time(s['drain']['since'])} (malletrain admin "
                        "drain): no node is given to any job; malletrain admin resume ends it")
    return "\n".join(lines)


@exit_one
def run(args: argparse.Namespace) -> int:
    """Ask the daemon, print."""
    status = client.call(args, "status")
    if args.json:
        print_json(status)
    else:
        print(format_status(status))
    return 0
