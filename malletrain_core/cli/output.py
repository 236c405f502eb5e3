"""Output shared by the read-only sub-commands: squeue-shaped tables and JSON.

``--format job,state,nodes`` picks and orders the columns (names are listed by ``--help``),
``--noheader`` drops the title line, ``--json`` prints the daemon's answer as JSON instead.
Output is plain text when standard output is not a terminal; on a terminal the header is
bold unless ``NO_COLOR`` is set or ``TERM=dumb``.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any

from ..errors import MalleTrainError

Row = Mapping[str, Any]


class CliError(MalleTrainError):
    """A failure of a read-only sub-command (exit code 1)."""

    exit_code = 1


def exit_one(func: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Make every MalleTrain error of ``func`` a one-line error with exit code 1 (argparse
    usage errors keep their exit code 2)."""
    @functools.wraps(func)
    def wrapper(args: argparse.Namespace) -> int:
        try:
            return func(args)
        except CliError:
            raise
        except MalleTrainError as err:
            raise CliError(str(err)) from err
    return wrapper


@dataclass(frozen=True)
class Column:
    """One ``--format`` field: its name, its title and how to print it from a row."""

    name: str
    title: str
    value: Callable[[Row], str]
    right: bool = False
    help: str = ""


class Table:
    """The columns a sub-command can show, and the ones it shows by default."""

    def __init__(self, columns: Sequence[Column], default: Sequence[str]) -> None:
        self.columns = {c.name: c for c in columns}
        self.default = [self.columns[name] for name in default]

    def parse_format(self, text: str) -> list[Column]:
        """``"job,state,nodes"`` → those columns (an argparse ``type``: bad names are usage
        errors naming the valid ones)."""
        names = [n.strip().lower() for n in text.split(",") if n.strip()]
        bad = [n for n in names if n not in self.columns]
        if bad or not names:
            raise argparse.ArgumentTypeError(
                f"unknown field(s) {', '.join(bad) or '(none given)'}; valid fields: "
                f"{','.join(self.columns)}")
        return [self.columns[n] for n in names]

    def render(self, rows: Sequence[Row], columns: Sequence[Column] | None = None,
               header: bool = True, bold: bool = False) -> str:
        """Aligned text: the first column left-aligned, numbers right-aligned."""
        cols = list(columns or self.default)
        cells = [[c.value(row) for c in cols] for row in rows]
        widths = [max([len(c.title) if header else 0] + [len(r[i]) for r in cells])
                  for i, c in enumerate(cols)]

        def line(values: Sequence[str]) -> str:
            parts = [v.rjust(w) if c.right else v.ljust(w)
                     for v, w, c in zip(values, widths, cols)]
            return "  ".join(parts).rstrip()

        out = [line(r) for r in cells]
        if header:
            title = line([c.title for c in cols])
            out.insert(0, f"\033[1m{title}\033[0m" if bold else title)
        return "\n".join(out)

    def fields_help(self) -> str:
        return ("comma-separated fields to show, in order (default: "
                f"{','.join(c.name for c in self.default)}); fields: {','.join(self.columns)}")


def add_output_args(parser: argparse.ArgumentParser, table: Table | None) -> None:
    """``--json``, and for tables ``--format`` and ``--noheader``."""
    parser.add_argument("--json", action="store_true",
                        help="print the daemon's answer as JSON (every field)")
    if table is not None:
        parser.add_argument("--format", "-o", type=table.parse_format, metavar="FIELDS",
                            help=table.fields_help())
        parser.add_argument("--noheader", action="store_true",
                            help="omit the header line")


def styled(stream: IO[str]) -> bool:
    """Whether to decorate output: a terminal, colour allowed."""
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty()) and "NO_COLOR" not in os.environ \
        and os.environ.get("TERM", "") != "dumb"


def print_json(document: Any, stream: IO[str] | None = None) -> None:
    out = stream if stream is not None else sys.stdout
    json.dump(document, out, indent=2, sort_keys=True)
    out.write("\n")


def print_table(args: argparse.Namespace, table: Table, rows: Sequence[Row],
                stream: IO[str] | None = None) -> None:
    out = stream if stream is not None else sys.stdout
    text = table.render(rows, args.format, header=not args.noheader, bold=styled(out))
    if text:
        out.write(text + "\n")


# -- value formatting (Slurm's conventions) -----------------------------------------------
def fmt_time(epoch: float | None) -> str:
    """Local time as Slurm prints it (``2026-01-01T12:00:00``); ``-`` when unknown."""
    if epoch is None or not math.isfinite(epoch) or epoch <= 0:
        return "-"
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(epoch))


def fmt_duration(seconds: float | None) -> str:
    """``[D-]HH:MM:SS`` or ``M:SS`` as squeue's TIME column; ``-`` when unknown."""
    if seconds is None or not math.isfinite(seconds):
        return "-"
    s = max(0, int(seconds))
    days, s = divmod(s, 86400)
    hours, s = divmod(s, 3600)
    minutes, s = divmod(s, 60)
    if days:
        return f"{days}-{hours:02d}:{minutes:02d}:{s:02d}"
    if hours:
        return f"{hours}:{minutes:02d}:{s:02d}"
    return f"{minutes}:{s:02d}"


def fmt_number(value: float | None, digits: int = 1) -> str:
    """A rate or cost with fixed decimals; ``-`` when unknown."""
    if value is None or not math.isfinite(value):
        return "-"
    return f"{value:.{digits}f}"
