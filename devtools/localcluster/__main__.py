"""``python -m devtools.localcluster start|stop|status|dump``: what start.sh and stop.sh
run."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from malletrain_core.errors import MalleTrainError

from . import LocalCluster


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m devtools.localcluster start|stop|status|dump`` (start.sh, stop.sh)."""
    p = argparse.ArgumentParser(prog="localcluster",
                                description="A real multi-node Slurm cluster on one host.")
    p.add_argument("action", choices=("start", "stop", "status", "dump"))
    p.add_argument("--nodes", type=int, default=16)
    p.add_argument("--accounting", action="store_true", help="MariaDB + slurmdbd + QOS")
    p.add_argument("--site-defaults", action="store_true",
                   help="cred_expire=120, bf_interval=30, batch_sched_delay=3, KillWait=30")
    p.add_argument("--root", default=None, help="default: $MALLETRAIN_CLUSTER_DIR or ./.cluster")
    p.add_argument("--port-base", type=int, default=None,
                   help="default: $MALLETRAIN_PORT_BASE, else a free one at random")
    p.add_argument("--slurm", default=None, metavar="RELEASE",
                   help="22.05 (the host's), 24.11 or 25.11 (scripts/setup-slurm-matrix.sh); "
                   "default: $MALLETRAIN_SLURM or 22.05")
    p.add_argument("--node-epilog-s", type=float, default=0.0, metavar="S",
                   help="give every node an Epilog that sleeps S seconds (a site's health "
                   "check); default: none")
    args = p.parse_args(argv)
    env_base = os.environ.get("MALLETRAIN_PORT_BASE")
    if args.port_base is None and env_base:
        if not env_base.isdigit():
            p.error(f"MALLETRAIN_PORT_BASE={env_base!r}: give a port number, e.g. 24000")
        args.port_base = int(env_base)
    try:
        cluster = LocalCluster(nodes=args.nodes, mode="accounting" if args.accounting else
                               "partition", site_defaults=args.site_defaults, root=args.root,
                               port_base=args.port_base, slurm=args.slurm,
                               node_epilog_s=args.node_epilog_s)
        if args.action == "start":
            rep = cluster.start()
            if rep.already_running:
                print(f"cluster in {cluster.root} is already running (port base "
                      f"{rep.port_base})")
            else:
                phases = ", ".join(f"{k} {v:.2f} s" for k, v in rep.phases_s.items())
                print(f"started {cluster.nodes} nodes ({cluster.mode}) in {rep.total_s:.2f} s "
                      f"({phases}); port base {rep.port_base}; Slurm {cluster.release.name}")
            print(f"use it with: . {cluster.root / 'env.sh'}")
        elif args.action == "stop":
            was = cluster.is_running()
            elapsed = cluster.stop()
            print(f"stopped in {elapsed:.2f} s" if was else "not running (leftovers stopped)")
        elif args.action == "status":
            print("running" if cluster.is_running() else "not running")
            return 0 if cluster.is_running() else 3
        else:
            print(cluster.dump())
    except MalleTrainError as exc:
        print(f"localcluster: error: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())


if __name__ == "__main__":
    sys.exit(main())
