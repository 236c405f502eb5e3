"""How long a grant waits for Slurm: a held task, pinned to a node, released the moment the prod
job on that node has ended; seconds from the release to the task RUNNING.

This is the daemon's grow (``scontrol update ... StartTime=now`` then ``scontrol release``)
without the daemon, so that only Slurm's part is timed. An update RPC (``scontrol update``,
``scontrol release``) does not schedule: it counts a request that slurmctld's background loop
serves about once a second (slurmctld's debug log on 22.05 and 25.11), so the task starts at
that pass or at the next backfill cycle (``bf_interval``), whichever comes first; the log says
which one started it. Each release is started as a small local cluster (``devtools.localcluster``, the
test-friendly timings: ``bf_interval=1``); each trial's prod job runs a random 0.3-1.3 s, so
that the releases fall anywhere in Slurm's one-second cycles.

    python -m bench.grant_latency [--releases 22.05 25.11] [--trials 16] [--json]
        [--markdown BENCHMARKS.md]

The last line of stdout is one JSON object: per release, the median, mean and largest
latency, and how many tasks the main scheduler started (the others the backfill), from
slurmctld's log.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __name__ == "__main__" and not __package__:
    sys.exit("run it as a module from the repository's root: python -m bench.grant_latency "
             + " ".join(sys.argv[1:]))
from bench.sections import host, replace_section  # noqa: E402
from devtools.localcluster import LocalCluster  # noqa: E402
from devtools.localcluster.releases import RELEASES, release  # noqa: E402
from devtools.waiting import wait_until  # noqa: E402
from malletrain_core.errors import ConfigError  # noqa: E402

BEGIN, END = "<!-- grant-latency:begin -->", "<!-- grant-latency:end -->"
POLL_S = 0.01


def _state(cluster: LocalCluster, job: str) -> str:
    return cluster.run(["squeue", "-h", "-j", job, "-o", "%T"], check=False).stdout.strip()


def _wait(cluster: LocalCluster, job: str, running: bool, limit_s: float = 30.0) -> None:
    wait_until(f"job {job} {'running' if running else 'ended'}",
               lambda: (_state(cluster, job) == "RUNNING") == running, limit_s, POLL_S)


def trials(cluster: LocalCluster, count: int, rng: random.Random) -> list[dict[str, Any]]:
    """``count`` grants on the cluster's first node, each after a prod job there ended."""
    node = cluster.run(["sinfo", "-h", "-N", "-o", "%N"]).stdout.split()[0]
    out = []
    for _ in range(count):
        task = cluster.sbatch("-p", "preemptable", "--hold", "-w", node, "-t", "5",
                              "-o", "/dev/null", "--wrap", "sleep 600")
        # a prod job of random length: it starts on one of Slurm's ticks, so a fixed length
        # would end every trial at the same phase of them
        prod = cluster.sbatch("-p", "prod", "-w", node, "-o", "/dev/null",
                              "--wrap", f"sleep {rng.uniform(0.3, 1.3):.2f}")
        _wait(cluster, prod, True)
        _wait(cluster, prod, False)
        time.sleep(rng.uniform(0.03, 0.1))  # the daemon's reaction to the epilog's datagram
        t0 = time.monotonic()
        cluster.run(["scontrol", "update", f"JobId={task}", "StartTime=now"])
        cluster.run(["scontrol", "release", task])
        _wait(cluster, task, True)
        out.append({"task": task, "latency_s": round(time.monotonic() - t0, 3)})
        cluster.run(["scancel", task], check=False)
        time.sleep(rng.uniform(0.5, 1.5))
    return out


def started_by(log: str, task: str) -> str:
    """``main`` or ``backfill``: which of Slurm's schedulers started ``task`` (its log)."""
    if re.search(rf"sched: Allocate JobId={task}\b", log):
        return "main"
    if re.search(rf"_start_job: (?:HETJOB: )?Started JobId={task}\b", log):
        return "backfill"
    return "unknown"  # 26.05 logs backfill's starts only under DebugFlags=HetJob


def installed() -> list[str]:
    """The releases this machine can start (:meth:`Release.check_installed`)."""
    names = []
    for name, r in RELEASES.items():
        try:
            r.check_installed()
        except ConfigError:
            continue
        names.append(name)
    return names


def one_release(name: str, count: int, seed: int, work: Path) -> dict[str, Any]:
    cluster = LocalCluster(nodes=2, root=work / name, slurm=name)
    cluster.start()
    try:
        got = trials(cluster, count, random.Random(seed))
        log = (cluster.run_dir / "log" / "slurmctld.log").read_text(errors="replace")
    finally:
        cluster.stop()
    xs = [t["latency_s"] for t in got]
    by = [started_by(log, t["task"]) for t in got]
    return {"release": cluster.release.name, "trials": count, "median_s": statistics.median(xs),
            "mean_s": round(statistics.fmean(xs), 3), "max_s": max(xs),
            "started_by_main": by.count("main"), "started_by_backfill": by.count("backfill"),
            "latencies_s": xs}


def markdown(result: dict[str, Any], command: str) -> str:
    rows = [f"| {r['release']} | {r['median_s']:.3f} | {r['mean_s']:.3f} | {r['max_s']:.3f} | "
            f"{r['started_by_main']} / {r['started_by_backfill']} / "
            f"{r['trials'] - r['started_by_main'] - r['started_by_backfill']} |"
            for r in result["releases"]]
    return "\n".join([
        BEGIN,
        f"`{command}` on {result['host']}, {result['date']}: a held task pinned to a node, "
        "released (`scontrol update StartTime=now`, `scontrol release`) 30-100 ms after the "
        "prod job there ended, as the daemon does on the EpilogSlurmctld's datagram; seconds "
        f"from the release to the task RUNNING, {result['releases'][0]['trials']} trials per "
        "release spaced by random waits, on a 2-node local cluster with `bf_interval=1`.",
        "",
        "| Slurm | median s | mean s | max s | started by main / backfill / unknown |",
        "| --- | ---: | ---: | ---: | ---: |",
        *rows,
        END,
    ])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--releases", nargs="+", default=None,
                   help="Slurm releases (default: every one installed here)")
    p.add_argument("--trials", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print only the JSON line")
    p.add_argument("--markdown", type=Path, default=None, metavar="FILE",
                   help="rewrite the grant-latency section of FILE (e.g. BENCHMARKS.md)")
    args = p.parse_args()
    if args.trials < 1:
        p.error("give --trials ≥ 1")
    names = args.releases or installed()
    for name in names:
        try:
            release(name).check_installed()
        except ConfigError as exc:  # one line saying how to set it up
            p.error(str(exc))
    result: dict[str, Any] = {"releases": [], "host": host(),
                              "date": time.strftime("%Y-%m-%d", time.gmtime())}
    with tempfile.TemporaryDirectory(prefix="mt-grant-") as tmp:
        for name in names:
            if not args.json:
                print(f"Slurm {name}: {args.trials} grants ...", file=sys.stderr, flush=True)
            result["releases"].append(one_release(name, args.trials, args.seed, Path(tmp)))
    if args.markdown is not None:
        command = "python -m bench.grant_latency --releases " + " ".join(names) + \
            f" --trials {args.trials}"
        replace_section(args.markdown, BEGIN, END, markdown(result, command),
                        "Grant latency by Slurm release")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
