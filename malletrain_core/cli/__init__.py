"""The ``malletrain`` command: one sub-command per module, squeue-shaped output.

Errors a user can cause print one line to stderr and exit non-zero; tracebacks only with
``--debug``.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

from .. import __version__
from ..errors import MalleTrainError

# Each module defines ``register(subparsers)``, which adds its sub-command and sets ``func``.
SUBCOMMANDS = (
    "allocate",
    "simulate",
    "status",
    "jobs",
    "nodes",
    "profile",
    "admin",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="malletrain",
        description="Elastic DNN training on the idle nodes of a Slurm or PBS cluster.")
    parser.add_argument("--version", action="version", version=f"malletrain {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMANDS:
        importlib.import_module(f".{name}", __name__).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.debug else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(args.func(args) or 0)
    except MalleTrainError as err:
        if args.debug:
            raise
        print(f"malletrain: error: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print("malletrain: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
