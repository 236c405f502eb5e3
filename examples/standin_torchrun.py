#!/usr/bin/env python3
"""A stand-in for ``torchrun`` in load tests: no torch, no rendezvous, one process per node.

``malletrain-run --torchrun "python examples/standin_torchrun.py"`` passes the flags it gives
torchrun (``--nnodes=W --node-rank=R --master-addr=A --master-port=P ... --no-python CMD``);
this reads them, sets what torchrun would set for a one-process node (RANK, WORLD_SIZE,
LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT) and replaces itself by ``CMD``. It
lets hundreds of elastic tasks run on a small machine; it is not a training launcher.
"""

from __future__ import annotations

import os
import sys


def parse(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    """The ``--key=value`` flags before the command, and the command."""
    flags: dict[str, str] = {}
    for i, arg in enumerate(argv):
        if arg == "--no-python" or not arg.startswith("--"):
            rest = argv[i + 1:] if arg == "--no-python" else argv[i:]
            return flags, rest
        key, _, value = arg[2:].partition("=")
        flags[key.replace("_", "-")] = value
    return flags, []


def main(argv: list[str]) -> int:
    flags, command = parse(argv)
    if not command:
        print("standin_torchrun: no command after the flags", file=sys.stderr)
        return 2
    if int(flags.get("nproc-per-node", "1") or 1) != 1:
        print("standin_torchrun: only --nproc-per-node=1 is supported", file=sys.stderr)
        return 2
    env = dict(os.environ)
    env.update({"RANK": flags.get("node-rank", "0"), "WORLD_SIZE": flags.get("nnodes", "1"),
                "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                "MASTER_ADDR": flags.get("master-addr", "127.0.0.1"),
                "MASTER_PORT": flags.get("master-port", "29500")})
    try:
        os.execvpe(command[0], command, env)
    except OSError as exc:
        print(f"standin_torchrun: cannot run {command[0]!r}: {exc}", file=sys.stderr)
        return 127
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
