"""How long freeing an epoch's store takes while members keep connecting to it, on torch's
default socket and on the one :func:`malletrain_core.worker.inplace.listen_on` binds.

An in-place epoch's store is a TCPStore its rank 0 hosts; a new epoch's store replaces it at
every re-form, and the old one is freed (its destructor joins the store's thread, with the
GIL held, so the whole process waits). Each trial here hosts a store on a fresh loopback
port, lets ``--clients`` threads connect to it and call ``add`` without pause (as members'
heartbeats do), and times the store's destructor; both ways alternate, trial by trial. The
store's thread formats each client's address with a reverse name lookup: on torch's default
dual-stack socket a loopback client reads ``::ffff:127.0.0.1``, which ``/etc/hosts``' IPv4
lines do not match, so the lookup goes to DNS, and a resolver that drops the query holds it
for its timeout. Prints one JSON object (last line); ``--markdown FILE`` rewrites the section.

    python -m bench.store_shutdown [--trials 40] [--clients 2] [--markdown BENCHMARKS.md]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

if not __package__:  # started as a file: bench/ is a package, run from the repository's root
    sys.exit("run it as a module from the repository's root: python -m bench.store_shutdown "
             + " ".join(sys.argv[1:]))
from bench.sections import host, replace_section  # noqa: E402
from malletrain_core.worker import inplace  # noqa: E402

BEGIN, END = "<!-- store-shutdown:begin -->", "<!-- store-shutdown:end -->"
WAYS = ("default socket", "listen_on")


def one_trial(port: int, bound: bool, clients: int) -> float:
    """Seconds the destructor of a store on ``port`` took while ``clients`` threads connect."""
    import torch.distributed as dist

    fd = inplace.listen_on("127.0.0.1", port) if bound else None
    store = dist.TCPStore("127.0.0.1", port, 2, is_master=True, master_listen_fd=fd,
                          timeout=dt.timedelta(seconds=5), wait_for_workers=False)
    stop = threading.Event()

    def connect() -> None:
        while not stop.is_set():
            try:
                client = dist.TCPStore("127.0.0.1", port, 2, is_master=False,
                                       timeout=dt.timedelta(seconds=0.8),
                                       wait_for_workers=False)
                client.add("beat", 1)
                del client
            except (RuntimeError, OSError, ValueError):
                time.sleep(0.01)  # refused once the store is gone

    threads = [threading.Thread(target=connect, daemon=True) for _ in range(clients)]
    for t in threads:
        t.start()
    time.sleep(0.05)
    t0 = time.monotonic()
    del store
    took = time.monotonic() - t0
    stop.set()
    for t in threads:
        t.join(10.0)
    return took


def summary(seconds: list[float]) -> dict[str, Any]:
    return {"trials": len(seconds), "median_s": round(statistics.median(seconds), 4),
            "max_s": round(max(seconds), 4), "over_1s": sum(s > 1.0 for s in seconds)}


def markdown(result: dict[str, Any], command: str) -> str:
    rows = [f"| {way} | {r['trials']} | {r['median_s']:.4f} | {r['max_s']:.4f} | "
            f"{r['over_1s']} |" for way, r in result["ways"].items()]
    return "\n".join([
        BEGIN,
        f"`{command}` on {result['host']}, {result['date']}: a store on a fresh loopback port "
        f"freed while {result['clients']} threads connect to it and call `add` without pause; "
        "the two ways alternate trial by trial.",
        "",
        "| store listens on | trials | destructor median s | max s | over 1 s |",
        "| --- | ---: | ---: | ---: | ---: |",
        *rows,
        END])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trials", type=int, default=40, help="per way (default 40)")
    p.add_argument("--clients", type=int, default=2, help="connecting threads (default 2)")
    p.add_argument("--markdown", type=Path, default=None, metavar="FILE",
                   help="rewrite the store-shutdown section of FILE (e.g. BENCHMARKS.md)")
    args = p.parse_args()
    if args.trials < 1 or args.clients < 1:
        p.error("give --trials ≥ 1 and --clients ≥ 1")
    ports = inplace.PortCycle(26000, 26999, start=26000 + os.getpid() % 1000)
    taken: dict[str, list[float]] = {way: [] for way in WAYS}
    for i in range(args.trials):
        for way in WAYS:
            taken[way].append(one_trial(ports(), way == "listen_on", args.clients))
        if (i + 1) % 10 == 0:
            print(f"store_shutdown: {i + 1}/{args.trials} trials", file=sys.stderr, flush=True)
    result = {"ways": {way: summary(s) for way, s in taken.items()}, "clients": args.clients,
              "host": host(), "date": time.strftime("%Y-%m-%d", time.gmtime())}
    if args.markdown is not None:
        command = f"python -m bench.store_shutdown --trials {args.trials} " \
                  f"--clients {args.clients}"
        replace_section(args.markdown, BEGIN, END, markdown(result, command),
                        "Freeing an epoch's store")
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
