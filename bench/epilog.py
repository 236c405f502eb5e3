"""Prod job start with a node Epilog on every node, and the margin that keeps it off planned
starts.

    python -m bench.epilog --json                       # prints the figures as JSON
    python -m bench.epilog --markdown BENCHMARKS.md     # and rewrites its section there

One local Slurm cluster (test timings: bf_interval=1, bf_resolution=1) whose nodes all run an
Epilog that sleeps ``--epilog-s`` seconds (a site's health check) at every job's end:

1. **unplanned prod start, workers on the node** — bench/e2e.py's phase 2 under malletraind:
   stand-in workers hold 4 free nodes, one-node prod jobs submitted one at a time each preempt
   one; ``sbatch`` returning → squeue RUNNING (polled every 50 ms).
2. **unplanned prod start, idle node** — the same submissions, daemon stopped, no workers.
3. **planned start** — pairs of nodes (a, b): a reservation holds a until T, so a two-node prod
   job on (a, b) is planned at T and b is a hole ending at T. About 123.8 s before T the
   Slurm backend grants b to an elastic task, with ``slurm.epilog_margin_s`` = 0 ("off") and
   with :func:`~malletrain_core.backends.slurm.backend.epilog_margin_for` of the Epilog
   ("on"), one pair of each per T; the prod job's start is timed against T, and each task's
   end and its node leaving COMPLETING against T (polled every 0.1 s near a T). The pairs of a
   round have T 7 s apart, so that their tasks' ends fall at other moments of slurmctld's
   30-s time-limit check.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

if __name__ == "__main__" and not __package__:  # started as a file; bench/ is a package
    sys.exit("run it as a module from the repository's root: python -m bench.epilog "
             + " ".join(sys.argv[1:]))
from bench.e2e import clear_phase, prod_starts, prod_starts_on_workers, state_of  # noqa: E402
from bench.e2e_common import p95, wait  # noqa: E402
from bench.sections import host, replace_section, say  # noqa: E402
from devtools.localcluster import LocalCluster  # noqa: E402
from devtools.localcluster.daemon import LocalDaemon  # noqa: E402
from devtools.waiting import poll_until  # noqa: E402
from malletrain_core.backends.slurm.backend import SlurmBackend, epilog_margin_for  # noqa: E402
from malletrain_core.errors import MalleTrainError  # noqa: E402
from malletrain_core.events import Grow, JobSubmitted, WorkerStarted  # noqa: E402

BEGIN, END = "<!-- epilog:begin -->", "<!-- epilog:end -->"
IDLE = 4
GRANT_BEFORE_S = 123.8
"""How long before the planned start the tasks are granted: with the local cluster's 3 s
hole margin a two-minute limit still fits, so without the Epilog margin the task ends within
seconds of the planned start, as a task fitted to a hole can."""
STAGGER_S = 7


def _stamp(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t))


def _planned_at(cluster: LocalCluster, prod: str, planned: dict[str, float], b: str) -> bool:
    """Is ``prod`` planned to start at its reservation's end? Slurm 22.05 plans it at the end,
    25.11 one second after it (the end is inclusive there): within 2 s counts, and ``planned``
    takes the start Slurm planned."""
    text = cluster.run(["squeue", "-h", "-j", prod, "--start", "-o", "%S"]).stdout.strip()
    try:
        start = time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S"))
    except ValueError:  # N/A until the backfill has planned it
        return False
    if 0 <= start - planned[b] <= 2:
        planned[b] = start
        return True
    return False


def planned_round(cluster: LocalCluster, pairs: int, epilog_s: float,
                  tag: str = "r") -> list[dict[str, Any]]:
    """One round of phase 3 on the first ``4 * pairs`` nodes: ``pairs`` pairs with the Epilog
    margin off, as many with it on; one row per pair (see the module doc)."""
    names = cluster.node_names
    if len(names) < 4 * pairs:
        raise ValueError(f"{pairs} pairs a mode need {4 * pairs} nodes, the cluster has "
                         f"{len(names)}")
    hole_margin = float(cluster.timings.hole_margin_s)
    modes = {"off": 0.0, "on": float(epilog_margin_for(epilog_s))}
    plan = {m: [(names[4 * i + 2 * k], names[4 * i + 2 * k + 1]) for i in range(pairs)]
            for k, m in enumerate(modes)}
    # Each pair's own planned start, STAGGER_S apart: its task's end meets slurmctld's
    # 30-s time-limit check and the backfill cycle at another moment.
    first = int(time.time()) + 150
    planned = {b: float(first + STAGGER_S * i) for pp in plan.values()
               for i, (_, b) in enumerate(pp)}
    prods: dict[str, str] = {}
    jobs: dict[str, str] = {}
    resvs: list[str] = []
    try:
        for m, pp in plan.items():
            for i, (a, b) in enumerate(pp):
                resvs.append(f"mt-{tag}-{m}{i}")
                cluster.run(["scontrol", "create", "reservation", f"ReservationName={resvs[-1]}",
                             "StartTime=now", f"EndTime={_stamp(planned[b])}", f"Nodes={a}",
                             "Users=root", "Flags=maint,ignore_jobs"])
                prods[b] = cluster.sbatch("-p", "prod", "-N", "2", "-w", f"{a},{b}", "-t", "5",
                                          "-o", "/dev/null", "--wrap", "sleep 5")
            jobs[m] = cluster.sbatch("--qos=malletrain", f"-N1-{pairs}", "-o", "/dev/null",
                                     "--chdir=/tmp", script="#!/bin/sh\nexec sleep 100000\n")
        # One backend for both jobs (two would each adopt the other's workers): the margin
        # is its setting at the moment of each grant.
        backend = SlurmBackend(cluster.runner(), grant_timeout_s=60, unplanned_wait_s=0,
                               hole_margin_s=hole_margin)
        poll_until(backend, lambda ev: {e.job.id for e in ev if isinstance(e, JobSubmitted)}
                   >= set(jobs.values()), 30)
        wait("the prod jobs planned at the reservations' end",
             lambda: all(_planned_at(cluster, p, planned, b) for b, p in prods.items()), 60, 0.5)
        for i in range(pairs):
            while planned[plan["off"][i][1]] - time.time() > GRANT_BEFORE_S:
                time.sleep(0.05)
            for m, margin in modes.items():
                b = plan[m][i][1]
                backend.epilog_margin_s = margin
                refused = backend.execute([Grow(jobs[m], (b,), planned[b] - time.time())],
                                          time.time())
                if refused:
                    raise RuntimeError(f"grant refused ({m}, {b}): {refused}")
        want = {(jobs[m], b) for m in modes for _, b in plan[m]}
        poll_until(backend, lambda ev: {(e.job_id, e.node) for e in ev
                                        if isinstance(e, WorkerStarted)} >= want, 30)
        limits: dict[str, str] = {}
        for m in modes:
            out = cluster.run(["squeue", "-h", "-r", "-j", jobs[m], "-t", "R", "-o", "%N|%l"])
            for line in out.stdout.split():
                node, limit = line.split("|")
                limits[node] = limit
        rows = _watch(cluster, prods, planned)
    finally:
        cluster.run(["scancel", *prods.values(), *jobs.values()], check=False)
        for name in resvs:
            cluster.run(["scontrol", "delete", f"ReservationName={name}"], check=False)
    wait("the round's jobs gone", lambda: not any(
        state_of(cluster, j) for j in [*prods.values(), *jobs.values()]), 90, 0.5)
    return [{"margin": m, "epilog_margin_s": modes[m], "node": b, "limit": limits.get(b, ""),
             **rows[b]} for m, pp in plan.items() for _, b in pp]


def _watch(cluster: LocalCluster, prods: dict[str, str],
           planned: dict[str, float]) -> dict[str, dict[str, Any]]:
    """Per hole node: its task's end, the node leaving COMPLETING and the prod job's start,
    each in seconds from the planned start (negative: before it)."""
    seen: dict[str, dict[str, Any]] = {b: {} for b in prods}
    while any("prod_start_s" not in s for s in seen.values()):
        now = time.time()
        if now > max(planned.values()) + 120:
            raise TimeoutError(f"prod jobs not running 120 s after their planned start: {seen}")
        ours = set(cluster.run(["squeue", "-h", "-r", "-p", "preemptable", "-t", "R",
                                "-o", "%N"]).stdout.split())
        states = dict(line.split("|") for line in cluster.run(
            ["sinfo", "-h", "-N", "-o", "%N|%T"]).stdout.split())
        running = set(cluster.run(["squeue", "-h", "-p", "prod", "-t", "R", "-o", "%i"])
                      .stdout.split())
        for b, s in seen.items():
            if b not in ours and "task_end_s" not in s:
                s["task_end_s"] = round(now - planned[b], 2)
            if "task_end_s" in s and "node_free_s" not in s and \
                    "completing" not in states.get(b, ""):
                s["node_free_s"] = round(now - planned[b], 2)
            if prods[b] in running and "prod_start_s" not in s:
                s["prod_start_s"] = round(now - planned[b], 2)
                # sinfo is read before squeue: a node still COMPLETING there whose prod job
                # runs here left COMPLETING in between, so by the prod job's start at the latest
                s.setdefault("task_end_s", s["prod_start_s"])
                s.setdefault("node_free_s", s["prod_start_s"])
        near = any(abs(t - now) < 10 for t in planned.values())
        time.sleep(0.1 if near else 0.5)
    return seen


def run(submissions: int, pairs: int, rounds: int, epilog_s: float) -> dict[str, Any]:
    """The three phases on one cluster; a phase that fails is named in ``failed``."""
    work = Path(tempfile.mkdtemp(prefix="malletrain-epilog-"))
    work.chmod(0o755)
    nodes = max(4 * pairs, IDLE + 2)
    cluster = LocalCluster(nodes=nodes, root=work / "cluster", node_epilog_s=epilog_s)
    say(f"starting a {nodes}-node local cluster with a {epilog_s:g} s node Epilog in {work}")
    cluster.start()
    daemon = LocalDaemon(cluster, root=work / "daemon")
    failed: dict[str, str] = {}
    with_mt: list[float] = []
    without: list[float] = []
    regrow: list[float] = []
    planned: list[dict[str, Any]] = []
    blocker = ""
    try:
        daemon.start()
        blocker = cluster.sbatch("-p", "prod", "-N", str(nodes - IDLE), "-o", "/dev/null",
                                 "--wrap", "sleep 100000")
        wait("blocker running", lambda: state_of(cluster, blocker) == "RUNNING", 60)
        try:
            say(f"phase 1: {submissions} prod jobs preempting stand-in workers")
            standin = prod_starts_on_workers(cluster, IDLE, submissions, with_mt, regrow)
            cluster.run(["scancel", standin])
            wait("workers gone", lambda: not state_of(cluster, standin), 60, 0.5)
        except (TimeoutError, RuntimeError) as exc:
            failed["phase 1"] = str(exc).splitlines()[0]
            clear_phase(cluster, blocker)
        daemon.stop()
        try:
            say(f"phase 2: {submissions} prod jobs on idle nodes, no MalleTrain")
            prod_starts(cluster, submissions, delays=without)
        except (TimeoutError, RuntimeError) as exc:
            failed["phase 2"] = str(exc).splitlines()[0]
        cluster.run(["scancel", blocker])
        wait("blocker gone", lambda: not state_of(cluster, blocker), 60, 0.5)
        for r in range(rounds):
            say(f"phase 3: round {r + 1}/{rounds}, {pairs} planned holes a margin "
                "(about 2.5 min)")
            try:
                planned += planned_round(cluster, pairs, epilog_s, tag=f"r{r}")
            except (TimeoutError, RuntimeError, MalleTrainError) as exc:
                failed[f"phase 3 round {r + 1}"] = str(exc).splitlines()[0]
                clear_phase(cluster, "")
    finally:
        daemon.stop()
        cluster.stop()
    return {"epilog_s": epilog_s, "nodes": nodes, "slurm": cluster.release.name,
            "submissions": submissions,
            "pairs": pairs, "rounds": rounds, "failed": failed,
            "prod_start_s": {"with_malletrain": with_mt, "without": without},
            "regrow_after_prod_s": regrow, "planned": planned}


def summary(r: dict[str, Any]) -> dict[str, Any]:
    """Medians and p95 of the unplanned starts; per margin, of the planned ones."""
    out: dict[str, Any] = {}
    for k, xs in r["prod_start_s"].items():
        out[k] = {"n": len(xs), "median": statistics.median(xs) if xs else None,
                  "p95": p95(xs) if xs else None}
    for m in ("off", "on"):
        rows = [x for x in r["planned"] if x["margin"] == m]
        out[f"planned_{m}"] = {
            "n": len(rows), "limits": sorted({x["limit"] for x in rows}),
            "epilog_margin_s": rows[0]["epilog_margin_s"] if rows else None,
            **{f"{k}_median": statistics.median(x[k] for x in rows) if rows else None
               for k in ("prod_start_s", "task_end_s", "node_free_s")},
            "prod_start_max_s": max(x["prod_start_s"] for x in rows) if rows else None,
            "epilog_done_before_start": sum(x["node_free_s"] <= 0 for x in rows)}
    return out


def section(r: dict[str, Any]) -> str:
    s = summary(r)
    w, wo, off, on = s["with_malletrain"], s["without"], s["planned_off"], s["planned_on"]

    def f(x: Any) -> str:
        return "–" if x is None else f"{x:+.2f} s" if x < 0 else f"{x:.2f} s"
    return "\n".join([
        BEGIN,
        f"Measured {r['date']} on {r['machine']} (1-min load {r['load_before']} at the start), "
        f"with `nice -n 5 {r['command']}` (one run; a "
        f"{r['nodes']}-node local cluster, test timings bf_interval=1, bf_resolution=1, "
        f"every node with `Epilog=` a script that sleeps {r['epilog_s']:g} s).",
        "",
        "| prod job start | n | median | p95 (unplanned) / max (planned) |",
        "|---|---|---|---|",
        f"| unplanned, MalleTrain's workers on the node (preempted) | {w['n']} | "
        f"{f(w['median'])} | {f(w['p95'])} |",
        f"| unplanned, idle node, no MalleTrain | {wo['n']} | {f(wo['median'])} | "
        f"{f(wo['p95'])} |",
        f"| planned, task fitted to the hole, `slurm.epilog_margin_s = 0` (limit "
        f"{', '.join(off['limits'])}) — after the planned start | {off['n']} | "
        f"{f(off['prod_start_s_median'])} | {f(off['prod_start_max_s'])} |",
        f"| planned, `slurm.epilog_margin_s = {on['epilog_margin_s']:g}` (limit "
        f"{', '.join(on['limits'])}) — after the planned start | {on['n']} | "
        f"{f(on['prod_start_s_median'])} | {f(on['prod_start_max_s'])} |",
        "",
        f"Unplanned: workers on the node minus idle node = "
        f"{w['median'] - wo['median']:+.2f} s (medians): the preempted task's Epilog runs "
        "before Slurm gives the node to the prod job, and nothing MalleTrain can do shortens "
        "it — a prod job that Slurm had not planned takes the node the moment it is submitted. "
        f"Planned: the task's end (median {f(off['task_end_s_median'])} off, "
        f"{f(on['task_end_s_median'])} on) and its node leaving COMPLETING (median "
        f"{f(off['node_free_s_median'])} off, {f(on['node_free_s_median'])} on), relative to "
        f"the planned start; the Epilog was done before the planned start on "
        f"{off['epilog_done_before_start']}/{off['n']} nodes off and "
        f"{on['epilog_done_before_start']}/{on['n']} on. A waiting job whose start is "
        "planned behind another job's end waits for that job's own Epilog as well, which "
        "hides the task's where the two overlap; the holes here end at a reservation's end "
        "(no Epilog of their own), where nothing hides it. The planned phase drives the Slurm "
        "backend itself (the code malletraind runs for a grant), granting each hole about "
        f"{GRANT_BEFORE_S:g} s before its end so that, without the margin, a two-minute task "
        "ends within seconds of it; its holes' ends are 7 s apart, "
        f"{r['rounds']} rounds of {r['pairs']} per margin. Times come from squeue and sinfo "
        "polled every 0.1 s near each planned start, slower under this load. JSON: "
        "`bench/results/epilog.json`.",
        END])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epilog-s", type=float, default=5.0, help="the nodes' Epilog (seconds)")
    p.add_argument("--submissions", type=int, default=12, help="prod jobs per unplanned phase")
    p.add_argument("--pairs", type=int, default=5, help="planned holes per margin and round")
    p.add_argument("--rounds", type=int, default=2, help="rounds of the planned phase")
    p.add_argument("--json", action="store_true", help="print only the JSON")
    p.add_argument("--markdown", metavar="FILE", help="rewrite the epilog section of FILE")
    p.add_argument("--from-json", metavar="FILE", help="no run: the figures of a --json run")
    args = p.parse_args(argv)
    if not 0 < args.epilog_s <= 30 or args.submissions < 1 or args.pairs < 1 or args.rounds < 0:
        p.error("--epilog-s between 0 and 30, --submissions and --pairs ≥ 1, --rounds ≥ 0")
    if args.from_json:
        result = json.loads(Path(args.from_json).read_text())
    else:
        load = Path("/proc/loadavg").read_text().split()[0]
        result = run(args.submissions, args.pairs, args.rounds, args.epilog_s)
        result["command"] = "python -m bench.epilog " + shlex.join(
            argv if argv is not None else sys.argv[1:])
        result["machine"] = host(extra=f"Slurm {result['slurm']}")
        result["load_before"] = load
        result["date"] = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    result["summary"] = summary(result)
    if args.markdown and result.get("failed"):
        say(f"{args.markdown} not rewritten: {', '.join(result['failed'])} failed")
    elif args.markdown:
        replace_section(Path(args.markdown), BEGIN, END, section(result),
                        "Prod start with a node Epilog")
    print(json.dumps(result, indent=None if args.json else 1))
    return 1 if result.get("failed") else 0


if __name__ == "__main__":
    sys.exit(main())
