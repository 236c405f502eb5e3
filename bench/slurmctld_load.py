"""What malletraind costs slurmctld: RPCs and controller time per minute, counted by ``sdiag``.

    python -m bench.slurmctld_load                        # 16, 64 and 256 nodes; prints JSON
    python -m bench.slurmctld_load --markdown BENCHMARKS.md   # and rewrites its section there
    python -m bench.slurmctld_load --nodes 16 --phase-s 20    # one small run

For each node count: a local cluster (test timings), ``--queued`` held prod jobs that cannot
start (the queue slurmctld must walk on every full read), and a real ``malletraind`` running
as root with the configuration's defaults (``--daemon-settings`` overrides them). Then three
phases of ``--phase-s`` seconds each, ``sdiag --reset`` before and ``sdiag`` after each:

* **idle**: no elastic job, nothing changes; the daemon only polls.
* **harvesting**: elastic jobs (``-N 1-4``, profiling off, tasks that ``sleep``) hold every
  idle node; nothing changes once they run.
* **churn**: a 1- to 3-node prod job every ``--churn-every-s`` preempts workers; the daemon
  grows the jobs back when the prod jobs end.

Who spends what: everything the bench does during a phase (elastic and prod submissions)
runs as ``--user`` (mtuser1), so root's RPCs are the daemon's plus what the slurmd and
slurmstepd processes (root too) send about job starts and ends. Those message types are never
sent by the daemon's commands (``NODE_TYPES``); the daemon's share is root's count and time
minus theirs and minus the bench's own ``sdiag``. Each phase also times one plain ``squeue``
(as ``--user``, ``--squeue-samples`` of them, on the same queue): the goal is that the
daemon costs slurmctld less than one ``squeue`` every 10 s, i.e. 6 per minute.

The backend's two paths on the newer releases (the matrix's chroot, ``make setup-matrix``)::

    python -m bench.slurmctld_load --slurm 24.11,25.11 --paths commands,pyslurm \
        --markdown BENCHMARKS.md

runs every node count once per release and path (the pyslurm path: ``slurm.pyslurm`` set to
the release's helper in the chroot; the run fails if the daemon did not take it) and writes a
second section, beside the 22.05 one.

Over 400 lines on purpose: the measurement, its extrapolation to larger clusters and the section
it writes share the keys of one JSON record; kept together, a key renamed on one side cannot
silently drop out of the other.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

if __name__ == "__main__" and not __package__:  # started as a file; bench/ is a package
    sys.exit("run it as a module from the repository's root: python -m bench.slurmctld_load "
             + " ".join(sys.argv[1:]))
from bench.e2e import machine  # noqa: E402
from bench.sections import replace_section, say  # noqa: E402
from devtools.localcluster import LocalCluster  # noqa: E402
from devtools.localcluster.daemon import LocalDaemon  # noqa: E402
from malletrain_core.backends.slurm import parse as sp  # noqa: E402

BEGIN, END = "<!-- slurmctld-load:begin -->", "<!-- slurmctld-load:end -->"
PATHS_BEGIN, PATHS_END = "<!-- slurmctld-load-paths:begin -->", "<!-- slurmctld-load-paths:end -->"

NODE_TYPES = sp.SDIAG_NODE_TYPES
parse_sdiag = sp.parse_sdiag_rpcs
daemon_share = sp.sdiag_daemon_share


class ProdChurn(threading.Thread):
    """A 1- to 3-node prod job (``sleep``) every ``every_s``, submitted as ``user``."""

    def __init__(self, cluster: LocalCluster, user: str, every_s: float, seed: int) -> None:
        super().__init__(daemon=True)
        self.cluster, self.user, self.every_s = cluster, user, every_s
        self.rng = random.Random(seed)
        self.submitted = 0
        self.stop_event = threading.Event()

    def run(self) -> None:
        while not self.stop_event.is_set():
            t0 = time.monotonic()
            k, hold = self.rng.randint(1, 3), self.rng.uniform(3.0, 8.0)
            res = self.cluster.run(["sbatch", "-p", "prod", "-N", str(k), "-o", "/dev/null",
                                    "--chdir=/tmp", "--wrap", f"sleep {hold:.1f}"],
                                   user=self.user, check=False)
            self.submitted += res.returncode == 0
            self.stop_event.wait(max(0.0, self.every_s - (time.monotonic() - t0)))


def running_tasks(cluster: LocalCluster) -> int:
    out = cluster.run(["squeue", "-h", "-r", "-t", "R", "-p", "preemptable", "-o", "%i"],
                      check=False).stdout
    return sum(1 for line in out.splitlines() if line.strip())


def wait_stable(cluster: LocalCluster, target: int, max_s: float) -> tuple[int, float]:
    """Wait until ``target`` worker tasks run and the count held for 10 s (or ``max_s``)."""
    t0 = time.monotonic()
    last, since = -1, time.monotonic()
    while time.monotonic() - t0 < max_s:
        n = running_tasks(cluster)
        if n != last:
            last, since = n, time.monotonic()
        elif n >= target and time.monotonic() - since >= 10.0:
            break
        time.sleep(2.0)
    return last, time.monotonic() - t0


def squeue_cost(cluster: LocalCluster, user: str, samples: int) -> dict[str, float]:
    """The controller time of one plain ``squeue`` (all jobs) by ``user``, from sdiag."""
    cluster.run(["sdiag", "--reset"])
    for _ in range(samples):
        cluster.run(["squeue"], user=user)
    stats = parse_sdiag(cluster.run(["sdiag"]).stdout)
    mine = stats["users"].get(user, {"count": 0, "time_us": 0})
    return {"rpcs": mine["count"], "samples": samples, "time_us": mine["time_us"],
            "us_per_squeue": round(mine["time_us"] / samples, 1)}


def measure(cluster: LocalCluster, seconds: float) -> dict[str, Any]:
    cluster.run(["sdiag", "--reset"])
    time.sleep(seconds)
    stats = parse_sdiag(cluster.run(["sdiag"]).stdout)
    share = daemon_share(stats)
    per_min = 60.0 / seconds
    return {"seconds": seconds, "rpcs": share["count"], "time_us": share["time_us"],
            "rpcs_per_min": round(share["count"] * per_min, 1),
            "ms_per_min": round(share["time_us"] * per_min / 1e3, 2),
            "types": {k: v for k, v in sorted(stats["types"].items())},
            "users": stats["users"]}


def queue_held(cluster: LocalCluster, n: int) -> float:
    """``n`` held prod jobs (they cannot start); returns the seconds it took."""
    t0 = time.monotonic()

    def one(_: int) -> None:
        cluster.run(["sbatch", "--hold", "-p", "prod", "-N", "1", "-o", "/dev/null",
                     "--chdir=/tmp", "--job-name=queued", "--wrap", "true"])

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(one, range(n)))
    return time.monotonic() - t0


def run_size(nodes: int, args: argparse.Namespace, work: Path, slurm: str | None = None,
             path: str = "commands") -> dict[str, Any]:
    tag = f"{slurm or 'host'}-{path}-{nodes}"
    cluster = LocalCluster(nodes=nodes, root=work / f"cluster-{tag}", slurm=slurm)
    say(f"starting a {nodes}-node local cluster (Slurm {cluster.release.name}, {path} path)")
    report = cluster.start(timeout_s=max(60.0, nodes * 0.5))
    settings = json.loads(args.daemon_settings) if args.daemon_settings else {}
    settings.setdefault("daemon", {}).setdefault("poll_interval_s", args.poll_interval_s)
    settings["daemon"].setdefault("idle_poll_interval_s", args.idle_poll_interval_s)
    if path == "pyslurm":
        helper = cluster.release.pyslurm_helper()
        if helper is None:
            cluster.stop()
            raise SystemExit(f"slurmctld_load: no pyslurm for Slurm {cluster.release.name}: "
                             "run `make setup-matrix` (it builds those of 24.11 and 25.11)")
        settings.setdefault("slurm", {})["pyslurm"] = helper
    daemon = LocalDaemon(cluster, root=work / f"daemon-{tag}", settings=settings)
    churn = ProdChurn(cluster, args.user, args.churn_every_s, seed=nodes)
    phases: dict[str, Any] = {}
    try:
        queued_s = queue_held(cluster, args.queued)
        say(f"{args.queued} held prod jobs queued in {queued_s:.1f} s")
        daemon.start()
        time.sleep(3.0)
        base = squeue_cost(cluster, args.user, args.squeue_samples)
        say(f"one squeue: {base}")
        phases["idle"] = measure(cluster, args.phase_s)
        say(f"idle: {phases['idle']['rpcs_per_min']} RPCs/min, "
            f"{phases['idle']['ms_per_min']} ms/min")
        jobs = max(2, nodes // 4)
        script = "#!/bin/bash\nexec sleep 100000\n"
        for i in range(jobs):
            cluster.sbatch("--qos=malletrain", "-N", "1-4", "--comment=profile=no",
                           "-o", "/dev/null", "--chdir=/tmp", f"--job-name=el{i}",
                           user=args.user, script=script)
        tasks, warm_s = wait_stable(cluster, nodes, args.warmup_max_s)
        say(f"{jobs} elastic jobs: {tasks} tasks running after {warm_s:.0f} s")
        phases["harvesting"] = measure(cluster, args.phase_s)
        phases["harvesting"].update(elastic_jobs=jobs, tasks_running=tasks)
        say(f"harvesting: {phases['harvesting']['rpcs_per_min']} RPCs/min, "
            f"{phases['harvesting']['ms_per_min']} ms/min")
        churn.start()
        time.sleep(5.0)
        sub0 = churn.submitted
        phases["churn"] = measure(cluster, args.phase_s)
        phases["churn"].update(prod_submitted=churn.submitted - sub0,
                               tasks_running=running_tasks(cluster))
        say(f"churn: {phases['churn']['rpcs_per_min']} RPCs/min, "
            f"{phases['churn']['ms_per_min']} ms/min")
        churn.stop_event.set()
        churn.join(30)
        after = squeue_cost(cluster, args.user, args.squeue_samples)
        dlog = daemon.log_text()
        taken = next((line.split("Slurm backend: ", 1)[1] for line in dlog.splitlines()
                      if "Slurm backend: " in line), "").replace(f"{REPO}/", "")
        if path == "pyslurm" and not taken.startswith("pyslurm"):
            raise RuntimeError(f"the daemon did not take the pyslurm path: {taken!r}")
    finally:
        churn.stop_event.set()
        daemon.stop()
        cluster.run(["scancel", "-u", args.user], check=False)
        cluster.stop()
    return {"nodes": nodes, "slurm": cluster.release.name, "path": path, "backend": taken,
            "queued": args.queued, "cluster_start_s": round(report.total_s, 1),
            "squeue": base, "squeue_loaded": after, "phases": phases,
            "daemon_warnings": sum(1 for line in dlog.splitlines() if " WARNING " in line),
            "daemon_errors": sum(1 for line in dlog.splitlines() if " ERROR " in line)}


def run(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="malletrain-ctldload-"))
    work.chmod(0o755)
    if args.slurm:
        sizes = [run_size(n, args, work, rel, path) for rel in args.slurm
                 for path in args.paths for n in args.nodes]
    else:
        sizes = [run_size(n, args, work) for n in args.nodes]
    return {"sizes": sizes, "releases": args.slurm or [], "phase_s": args.phase_s, "queued": args.queued,
            "daemon_settings": args.daemon_settings or "",
            "poll_interval_s": args.poll_interval_s,
            "idle_poll_interval_s": args.idle_poll_interval_s}


# ---------------------------------------------------------------------------- output
def per_squeue_us(size: dict[str, Any]) -> float:
    sq = size["squeue"]
    return float(sq["time_us"]) / sq["samples"] if "samples" in sq else (
        sq["us_per_squeue"] * sq["rpcs"] / 20)  # the first runs divided by the RPCs (2 each)


def budget_ms_per_min(size: dict[str, Any]) -> float:
    """Six plain squeues a minute (one every 10 s) on the same cluster and queue."""
    return 6 * per_squeue_us(size) / 1e3


def extrapolate(r: dict[str, Any], nodes: int = 10_000) -> list[str]:
    """The steady-state cost at ``nodes`` from the largest run's per-type times (see the
    section's text for the assumptions)."""
    big = max(r["sizes"], key=lambda s: s["nodes"])
    k = nodes / big["nodes"]
    budget = budget_ms_per_min(big)
    out = []
    for phase in ("idle", "harvesting"):
        ph = big["phases"][phase]
        per_min = 60.0 / ph["seconds"]
        types = {t: v["time_us"] * per_min / 1e3 for t, v in ph["types"].items()
                 if t not in NODE_TYPES}
        fixed_queue = sum(v * (k if t == "REQUEST_NODE_INFO" else 1.0) for t, v in types.items())
        out.append(f"{phase}: {fixed_queue:.0f} ms/min with the queue kept at {r['queued']} "
                   f"jobs (budget {budget:.0f} ms/min, ratio {fixed_queue / budget:.2f}); "
                   f"{ph['ms_per_min'] * k:.0f} ms/min with a queue {k:.0f}× longer (budget "
                   f"{budget * k:.0f}, ratio {ph['ms_per_min'] / budget:.2f})")
    return out


def _phase_label(name: str, ph: dict[str, Any]) -> str:
    if name == "harvesting":
        return f"harvesting ({ph['tasks_running']} tasks of {ph['elastic_jobs']} jobs)"
    if name == "churn":
        return f"churn ({ph['prod_submitted']} prod jobs)"
    return name


def section(r: dict[str, Any], base: dict[str, Any] | None = None) -> str:
    """The BENCHMARKS.md section; ``base``: a run of the daemon that polls at every cycle,
    shown beside ``r``."""
    before = {s["nodes"]: s for s in base["sizes"]} if base else {}
    rows, steady = [], []
    for s in r["sizes"]:
        budget = budget_ms_per_min(s)
        old = before.get(s["nodes"])
        for name in ("idle", "harvesting", "churn"):
            ph = s["phases"][name]
            top = sorted(((v["time_us"], k) for k, v in ph["types"].items()
                          if k not in NODE_TYPES), reverse=True)[:2]
            was = old["phases"][name] if old else None
            rpcs = f"{was['rpcs_per_min']:g} → {ph['rpcs_per_min']:g}" if was else \
                f"{ph['rpcs_per_min']:g}"
            ms = f"{was['ms_per_min']:g} → {ph['ms_per_min']:g}" if was else \
                f"{ph['ms_per_min']:g}"
            ratio = ph["ms_per_min"] / budget
            if name != "churn":
                steady.append(ratio)
            rows.append(f"| {s['nodes']} | {_phase_label(name, ph)} | {rpcs} | {ms} | "
                        f"{budget:.1f} | {ratio:.2f} | "
                        + ", ".join(k.removeprefix("REQUEST_") for _, k in top) + " |")
    sizes = ", ".join(f"{s['nodes']} nodes: {per_squeue_us(s) / 1e3:.2f} ms"
                      for s in r["sizes"])
    ext = extrapolate(r)
    settings = r.get("daemon_settings") or ""
    head = [
        f"Measured {r['date']} on {r['machine']}, with `{r['command']}` (one run per node "
        f"count; test timings bf_interval=1, batch_sched_delay=0; daemon poll_interval_s = "
        f"{r['poll_interval_s']:g}, idle_poll_interval_s = "
        f"{r.get('idle_poll_interval_s', 'not yet there')}"
        f"{'; ' + settings if settings else ''}).",
    ]
    if base:
        head += ["", f"Before (left of each arrow): the daemon before quiet polling, which "
                 f"polled at every cycle, measured {base['date']} on {base['machine']} "
                 f"with `{base['command']}` (`--idle-poll-interval-s 5` runs the same "
                 "poll today)."]
    return "\n".join([
        BEGIN, *head,
        "",
        f"Each cluster had {r['queued']} held prod jobs queued (they cannot start) besides "
        f"the elastic tasks; each phase lasted {r['phase_s']:g} s between `sdiag --reset` and "
        "`sdiag`. The daemon's share is root's RPCs minus the message types slurmd and "
        "slurmstepd send (job start/end, registration) and the bench's `sdiag`: everything "
        "else the bench did ran as another user. Controller time is sdiag's total_time "
        "(microseconds spent processing, summed). The budget is one plain `squeue` (all jobs) "
        f"every 10 s on the same queue, i.e. six a minute; one squeue cost {sizes}. Harvesting "
        "and churn tasks only sleep (no launcher), so the phases measure the batch-system "
        "side alone. Slurm 22.05 and the commands path: the newer releases and the pyslurm "
        "path are in the next table.",
        "",
        "| nodes | phase | daemon RPCs / min | slurmctld ms / min | budget ms / min | "
        "/ budget | costliest now |",
        "|---|---|---|---|---|---|---|",
        *rows,
        "",
        f"Steady state (idle and harvesting): {max(steady):.2f} of the budget at most "
        f"({'below' if max(steady) < 1 else 'NOT below'} one squeue every 10 s at every "
        "size). Under churn every prod job's start and end wakes the daemon (its epilog), "
        "which then polls at every cycle while the change settles and re-holds and grows "
        "the tasks (`UPDATE_JOB`): there quiet polling saves nothing, and the RPC count "
        "follows the churn (a prod job every few seconds here) rather than the size.",
        "",
        *([f"Extrapolated to 10,000 nodes from the {max(x['nodes'] for x in r['sizes'])}-node "
           "run, assuming the daemon's RPCs per minute stay as measured (they are set by its "
           "intervals and the hooks, not by the size), a node read (`NODE_INFO`) costs in "
           "proportion to the nodes, and a job read (`JOB_INFO`, and the budget's squeue) in "
           "proportion to the queue, which is either kept as measured or grown with the "
           "nodes: " + "; ".join(ext) + ". The timings above vary by tens of percent from "
           "run to run on this shared 2-core machine (the 16-node rows cost more than the "
           "64-node ones), so these are orders of magnitude. Steady-state cost is one full "
           "poll per idle_poll_interval_s, so a ratio above 1 is divided by lengthening it "
           "(120 s halves it)."] if ext else []),
        END])


def paths_section(r: dict[str, Any]) -> str:
    """The section of a ``--slurm``/``--paths`` run: each release, path and node count."""
    rows, lines = [], []
    by_key = {(s["slurm"], s["path"], s["nodes"]): s for s in r["sizes"]}
    for s in r["sizes"]:
        budget = budget_ms_per_min(s)
        for name in ("idle", "harvesting", "churn"):
            ph = s["phases"][name]
            top = sorted(((v["time_us"], k) for k, v in ph["types"].items()
                          if k not in NODE_TYPES), reverse=True)[:2]
            rows.append(f"| {s['slurm']} | {s['path']} | {s['nodes']} | "
                        f"{_phase_label(name, ph)} | {ph['rpcs_per_min']:g} | "
                        f"{ph['ms_per_min']:g} | {budget:.1f} | "
                        f"{ph['ms_per_min'] / budget:.2f} | "
                        + ", ".join(k.removeprefix("REQUEST_") for _, k in top) + " |")
    for (rel, path, nodes), s in by_key.items():
        other = by_key.get((rel, "commands", nodes))
        if path != "pyslurm" or other is None:
            continue
        parts = []
        for name in ("idle", "harvesting", "churn"):
            a, b = s["phases"][name], other["phases"][name]
            if b["ms_per_min"] > 0:
                parts.append(f"{name} {a['ms_per_min'] / b['ms_per_min']:.2f}× the time, "
                             f"{a['rpcs_per_min']:g} vs {b['rpcs_per_min']:g} RPCs/min")
        lines.append(f"* Slurm {rel}, {nodes} nodes, pyslurm against commands: "
                     + "; ".join(parts) + ".")
    steady = [s["phases"][n]["ms_per_min"] / budget_ms_per_min(s)
              for s in r["sizes"] for n in ("idle", "harvesting")]
    backends = sorted({s["backend"] for s in r["sizes"] if s.get("backend")})
    return "\n".join([
        PATHS_BEGIN,
        f"Measured {r['date']} on {r['machine']}, with `{r['command']}` (one run per release, "
        f"path and node count, each on a fresh cluster; test timings bf_interval=1, "
        f"batch_sched_delay=0; daemon poll_interval_s = {r['poll_interval_s']:g}, "
        f"idle_poll_interval_s = {r['idle_poll_interval_s']:g}). The same phases, queue "
        f"({r['queued']} held prod jobs), accounting of the daemon's share and budget (six "
        "plain `squeue`s a minute) as the 22.05 table above. The pyslurm path is the "
        "release's pyslurm in a helper process in the matrix's chroot (a pyslurm built there "
        "does not load in a host process); the daemon logged: "
        + "; ".join(f"`{b}`" for b in backends) + ".",
        "",
        "| Slurm | path | nodes | phase | daemon RPCs / min | slurmctld ms / min | "
        "budget ms / min | / budget | costliest |",
        "|---|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        *lines,
        "",
        f"Steady state (idle and harvesting), every release, path and size: "
        f"{max(steady):.2f} of the budget at most "
        f"({'below' if max(steady) < 1 else 'NOT below'} one squeue every 10 s).",
        PATHS_END])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", default="16,64,256", help="node counts, comma-separated")
    p.add_argument("--queued", type=int, default=1000, help="held prod jobs in the queue")
    p.add_argument("--phase-s", type=float, default=60.0, help="seconds of each phase")
    p.add_argument("--churn-every-s", type=float, default=4.0, help="prod submission period")
    p.add_argument("--poll-interval-s", type=float, default=5.0,
                   help="the daemon's poll_interval_s (the configuration's default: 5)")
    p.add_argument("--idle-poll-interval-s", type=float, default=60.0,
                   help="the daemon's idle_poll_interval_s (the configuration's default: 60; "
                   "equal to --poll-interval-s: every cycle polls, as before it existed)")
    p.add_argument("--daemon-settings", default="",
                   help='JSON of extra config sections, e.g. \'{"daemon": {...}}\'')
    p.add_argument("--slurm", default="",
                   help="releases, comma-separated (e.g. 24.11,25.11: the matrix's chroot); "
                   "empty: the host's Slurm and the table of 22.05")
    p.add_argument("--paths", default="commands,pyslurm",
                   help="with --slurm: the backend's paths to measure (commands, pyslurm)")
    p.add_argument("--user", default="mtuser1", help="who submits during the phases")
    p.add_argument("--squeue-samples", type=int, default=20)
    p.add_argument("--warmup-max-s", type=float, default=240.0)
    p.add_argument("--json", action="store_true", help="print only the JSON")
    p.add_argument("--markdown", metavar="FILE", help="rewrite the section of FILE")
    p.add_argument("--from-json", metavar="FILE", help="no run: the JSON of a previous run")
    p.add_argument("--baseline", metavar="FILE",
                   help="the JSON of a run polling at every cycle, shown beside this one")
    args = p.parse_args(argv)
    try:
        args.nodes = [int(x) for x in args.nodes.split(",") if x.strip()]
    except ValueError:
        p.error(f"--nodes {args.nodes!r}: give comma-separated numbers, e.g. 16,64,256")
    args.slurm = [x.strip() for x in args.slurm.split(",") if x.strip()]
    args.paths = [x.strip() for x in args.paths.split(",") if x.strip()]
    if set(args.paths) - {"commands", "pyslurm"} or not args.paths:
        p.error(f"--paths {','.join(args.paths)!r}: give commands, pyslurm or both")
    if not args.nodes or min(args.nodes) < 4 or args.queued < 0 or args.phase_s <= 0:
        p.error("--nodes must be ≥ 4 each, --queued ≥ 0, --phase-s > 0")
    if args.from_json:
        result = json.loads(Path(args.from_json).read_text())
    else:
        result = run(args)
        flags = list(argv if argv is not None else sys.argv[1:])
        result["command"] = "python -m bench.slurmctld_load " + shlex.join(flags)
        result["machine"] = machine()
        result["date"] = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    if args.markdown:
        base = json.loads(Path(args.baseline).read_text()) if args.baseline else None
        if result.get("releases"):
            replace_section(Path(args.markdown), PATHS_BEGIN, PATHS_END, paths_section(result),
                            "slurmctld load of the daemon")
        else:
            replace_section(Path(args.markdown), BEGIN, END, section(result, base),
                            "slurmctld load of the daemon")
    print(json.dumps(result, indent=None if args.json else 1))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
