"""The Slurm backend's two paths to slurmctld side by side: the commands and pyslurm.

    python -m bench.slurm_paths                             # 24.11 and 25.11; prints JSON
    python -m bench.slurm_paths --markdown BENCHMARKS.md    # and rewrites its section there
    python -m bench.slurm_paths --release 24.11 --polls 10 --cycles 2

For each release (a local cluster of ``--nodes`` virtual nodes, started once; both paths in the
same run, against the same queue: one elastic array of ``--nodes`` held tasks and ``--queue``
pending prod jobs): the latency of one backend poll and slurmctld's RPCs per poll, then
``--cycles`` rounds of the backend's actions on one task — grow (``scontrol update JobId=A_i
ReqNodeList=N StartTime=now TimeLimit=M`` and ``scontrol release``), the admin hold of the
running task, the shrink (``scontrol requeuehold Incomplete``) — and the cancel of a whole
array (``scancel``), each timed from the call to its return, with slurmctld's RPCs for it.

RPCs are ``sdiag``'s counts by message type, read before and after each measured call: the
client requests only (``REQUEST_*`` other than sdiag's own ``REQUEST_STATS_INFO`` and the
completion messages slurmd sends); the types seen are in the JSON. The pyslurm path is the
helper process in the release's chroot (a pyslurm built there does not load in a host
process): its latency includes one JSON line each way over a pipe.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from datetime import datetime, timezone
from functools import partial
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

if __name__ == "__main__" and not __package__:  # started as a file; bench/ is a package
    sys.exit("run it as a module from the repository's root: python -m bench.slurm_paths "
             + " ".join(sys.argv[1:]))
from bench.sections import host, replace_section, say  # noqa: E402
from devtools.localcluster import LocalCluster  # noqa: E402
from malletrain_core.backends.slurm.backend import SlurmBackend  # noqa: E402
from malletrain_core.backends.slurm.pyslurm_reader import PyslurmSource, choose  # noqa: E402
from malletrain_core.runner import CommandRunner  # noqa: E402

BEGIN, END = "<!-- slurm-paths:begin -->", "<!-- slurm-paths:end -->"
SLEEP = "#!/bin/sh\nexec sleep 600\n"
_NOT_CLIENT = ("REQUEST_STATS_INFO", "REQUEST_COMPLETE_", "REQUEST_STEP_COMPLETE",
               "REQUEST_EPILOG", "REQUEST_PROLOG")


def rpc_counts(cluster: LocalCluster) -> Counter[str]:
    """sdiag's RPC counts by message type, client requests only."""
    out = cluster.run(["sdiag"]).stdout
    section = out[out.index("by message type"):out.index("by user")]
    return Counter({m.group(1): int(m.group(2)) for m in re.finditer(
        r"^\s*(\w+)\s+\(\s*\d+\) count:(\d+)", section, re.MULTILINE)
        if m.group(1).startswith("REQUEST_") and not m.group(1).startswith(_NOT_CLIENT)})


class Path_:
    """One path's actions, as the backend makes them."""

    def __init__(self, cluster: LocalCluster, source: PyslurmSource | None) -> None:
        self.runner = CommandRunner(env=cluster.env)
        self.source = source

    def scontrol(self, verb: str, jobs: str) -> None:
        if self.source is not None:
            self.source.scontrol(verb, jobs)
        else:
            self.runner.run(["scontrol", *verb.split(), jobs])

    def grow(self, key: str, node: str, minutes: int) -> None:
        if self.source is not None:
            self.source.grow(key, node, minutes)
        else:
            self.runner.run(["scontrol", "update", f"JobId={key}", f"ReqNodeList={node}",
                             "StartTime=now", f"TimeLimit={minutes}"])

    def cancel(self, arrays: list[str]) -> None:
        if self.source is not None:
            self.source.cancel(arrays)
        else:
            self.runner.run(["scancel", *arrays])


def measured(cluster: LocalCluster, fn: Any, *args: Any) -> tuple[float, Counter[str]]:
    """(milliseconds, RPCs by type) of one call."""
    before = rpc_counts(cluster)
    t0 = time.perf_counter()
    fn(*args)
    ms = (time.perf_counter() - t0) * 1000
    after = rpc_counts(cluster)
    for _ in range(5):  # slurmctld counts an RPC after it answered it: wait for the count
        time.sleep(0.05)
        again = rpc_counts(cluster)
        if again == after:
            break
        after = again
    after.subtract(before)
    return ms, +after


def state(cluster: LocalCluster, task: str) -> str:
    return cluster.run(["squeue", "-h", "-j", task, "-o", "%T|%r"]).stdout.strip()


def in_state(cluster: LocalCluster, task: str, prefix: str) -> bool:
    return state(cluster, task).startswith(prefix)


def one_path(cluster: LocalCluster, name: str, source: PyslurmSource | None, polls: int,
             cycles: int) -> dict[str, Any]:
    backend = SlurmBackend(CommandRunner(env=cluster.env), source=source)
    backend.poll(time.time())  # the first poll reports everything; later ones only changes
    lat, rpcs = [], Counter[str]()
    for _ in range(polls):
        ms, got = measured(cluster, backend.poll, time.time())
        lat.append(ms)
        rpcs.update(got)
    out: dict[str, Any] = {"path": name, "polls": polls, "poll_ms": statistics.median(lat),
                           "poll_ms_max": max(lat), "poll_rpcs": sum(rpcs.values()) / polls,
                           "poll_rpc_types": dict(rpcs)}
    act = Path_(cluster, source)
    job = cluster.sbatch("--qos=malletrain", "-N", "1-2", "-o", "/dev/null", "--chdir=/tmp",
                         script=SLEEP)
    cluster.wait_for("the elastic job held", lambda: "JobHeldUser" in state(cluster, job + "_1"),
                     30)
    samples: dict[str, list[tuple[float, Counter[str]]]] = {}
    for i in range(cycles):
        task, node = f"{job}_{i % 2}", cluster.node_names[i % len(cluster.node_names)]
        samples.setdefault("grow: update", []).append(measured(cluster, act.grow, task, node, 30))
        samples.setdefault("grow: release", []).append(
            measured(cluster, act.scontrol, "release", task))
        cluster.wait_for(f"{task} running", partial(in_state, cluster, task, "RUNNING"), 60)
        samples.setdefault("hold", []).append(measured(cluster, act.scontrol, "hold", task))
        samples.setdefault("shrink: requeuehold Incomplete", []).append(
            measured(cluster, act.scontrol, "requeuehold Incomplete", task))
        cluster.wait_for(f"{task} held again", partial(in_state, cluster, task, "PENDING"), 60)
    samples["cancel (scancel)"] = [measured(cluster, act.cancel, [job])]
    out["actions"] = {k: {"ms": statistics.median(ms for ms, _ in v),
                          "rpcs": sum(sum(c.values()) for _, c in v) / len(v),
                          "rpc_types": dict(sum((c for _, c in v), Counter[str]())),
                          "n": len(v)} for k, v in samples.items()}
    return out


def run_release(release: str, nodes: int, queue: int, polls: int, cycles: int) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix=f"malletrain-paths-{release}-"))
    root.chmod(0o755)
    cluster = LocalCluster(nodes=nodes, root=root / "cluster", slurm=release)
    say(f"Slurm {release}: starting a {nodes}-node local cluster in {root}")
    cluster.start()
    os.environ["PATH"] = cluster.release.env(dict(os.environ))["PATH"]
    try:
        helper = cluster.release.pyslurm_helper()
        if helper is None:
            raise SystemExit(f"no pyslurm for Slurm {release}: run scripts/setup-slurm-matrix.sh "
                             "pyslurm (as root)")
        cluster.sbatch("--qos=malletrain", "-N", f"1-{nodes}", "-o", "/dev/null",
                       "--chdir=/tmp", script=SLEEP)
        for _ in range(queue):  # pending behind a hold: the queue a poll reads
            cluster.sbatch("-p", "prod", "-H", "-o", "/dev/null", "--chdir=/tmp", script=SLEEP)
        version = cluster.run(["scontrol", "--version"]).stdout.split()[-1]
        result: dict[str, Any] = {"release": version, "nodes": nodes, "queue": queue,
                                  "paths": []}
        for name in ("commands", "pyslurm"):
            source, line = (None, "commands") if name == "commands" else choose(helper,
                                                                                 cluster.env)
            if name == "pyslurm" and (source is None or not source.acts):
                raise SystemExit(f"Slurm {release}: the pyslurm path was not taken: {line}")
            say(f"Slurm {release}: {line}")
            try:
                got = one_path(cluster, name, source, polls, cycles)
            finally:
                if source is not None:
                    source.close()
            got["choice"] = line
            result["paths"].append(got)
            say(f"Slurm {release}, {name}: poll {got['poll_ms']:.1f} ms, "
                f"{got['poll_rpcs']:g} RPCs")
        return result
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


def section(results: list[dict[str, Any]], command: str, machine: str) -> str:
    date = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    r0 = results[0]
    lines = [BEGIN,
             f"Measured {date} on {machine}, with `{command}` (both paths in one run per "
             f"release, on a {r0['nodes']}-node local cluster with one elastic array of "
             f"{r0['nodes']} tasks and {r0['queue']} held prod jobs queued; test timings). "
             "Latency: median of the calls, from the call to its return (poll: "
             f"{r0['paths'][0]['polls']} polls; grow, hold and shrink: "
             f"{r0['paths'][0]['actions']['hold']['n']} each; cancel: one call, so noisy); "
             "RPCs: slurmctld's client requests counted by `sdiag` around each call (sdiag's "
             "own left out; a grow through the commands is `scontrol update`, which asks for "
             "the federation and the job before it updates, and `scontrol release`). "
             "The pyslurm path is a helper process in the release's chroot, one JSON line "
             "each way per call.", "",
             "| Slurm | path | poll | RPCs per poll | grow (update + release) | RPCs | hold | "
             "RPCs | shrink (requeuehold) | RPCs | cancel | RPCs |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        for p in r["paths"]:
            a = p["actions"]
            up, rel = a["grow: update"], a["grow: release"]
            hold, shr, can = a["hold"], a["shrink: requeuehold Incomplete"], a["cancel (scancel)"]
            lines.append(
                f"| {r['release']} | {p['path']} | {p['poll_ms']:.1f} ms | {p['poll_rpcs']:g} | "
                f"{up['ms'] + rel['ms']:.1f} ms | {up['rpcs'] + rel['rpcs']:g} | "
                f"{hold['ms']:.1f} ms | {hold['rpcs']:g} | {shr['ms']:.1f} ms | "
                f"{shr['rpcs']:g} | {can['ms']:.1f} ms | {can['rpcs']:g} |")
    types = sorted({t for r in results for p in r["paths"] for t in p["poll_rpc_types"]})
    lines += ["", f"RPC types of a poll: {', '.join(types)}; of the actions: "
              f"{', '.join(sorted({t for r in results for p in r['paths'] for a in p['actions'].values() for t in a['rpc_types']}))}. "  # noqa: E501
              f"Samples: {r0.get('samples', 'the JSON this command prints')}.", END]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--release", action="append", choices=("24.11", "25.11"),
                   help="a release with a pyslurm (repeatable; default both)")
    p.add_argument("--nodes", type=int, default=8)
    p.add_argument("--queue", type=int, default=200, help="held prod jobs in the queue")
    p.add_argument("--polls", type=int, default=30)
    p.add_argument("--cycles", type=int, default=5, help="grow/hold/shrink rounds")
    p.add_argument("--json", metavar="FILE", help="write the samples there too")
    p.add_argument("--markdown", metavar="FILE", help="rewrite this section of that file")
    args = p.parse_args(argv)
    results = [run_release(r, args.nodes, args.queue, args.polls, args.cycles)
               for r in (args.release or ["24.11", "25.11"])]
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
        results[0]["samples"] = os.path.relpath(args.json, REPO)
    print(json.dumps(results, indent=1))
    if args.markdown:
        command = "python -m " + " ".join(["bench.slurm_paths", *(argv or sys.argv[1:])])
        slurm = ", ".join(f"Slurm {r['release']}" for r in results)
        replace_section(Path(args.markdown), BEGIN, END,
                        section(results, command, host(slurm)), "Slurm releases")
    return 0


if __name__ == "__main__":
    sys.exit(main())
