"""The flags that say which runs of a site's own accounting (``sacct``, PBS) hold nodes:
shared by ``malletrain simulate`` and ``malletrain admin what-if``."""

from __future__ import annotations

import argparse
from typing import Any

from ..sim.accounting import AccountingFilter


def _names(text: str) -> list[str]:
    return [t for t in text.split(",") if t.strip()]


def add_filter_arguments(p: Any) -> None:
    """``--partition``, ``--skip-partition``, ``--reservation``, ``--skip-reservation``."""
    g = p.add_argument_group(
        "accounting traces (sacct --json, sacct -P, a PBS accounting log)",
        "a node is idle whenever no kept run holds it; Slurm partitions and PBS queues are "
        "both 'partitions' here; give MalleTrain's own partition or queue to --skip-partition "
        "so its elastic runs count as idle")
    g.add_argument("--partition", type=_names, default=[], metavar="NAMES",
                   help="count only the runs of these partitions/queues (comma-separated)")
    g.add_argument("--skip-partition", type=_names, default=[], metavar="NAMES",
                   help="leave out the runs of these partitions/queues")
    g.add_argument("--reservation", type=_names, default=[], metavar="NAMES",
                   help="count only the runs inside these reservations")
    g.add_argument("--skip-reservation", type=_names, default=[], metavar="NAMES",
                   help="leave out the runs inside these reservations (e.g. maintenance)")


def filter_from(args: argparse.Namespace) -> AccountingFilter:
    return AccountingFilter.of(args.partition, args.skip_partition, args.reservation,
                               args.skip_reservation)
