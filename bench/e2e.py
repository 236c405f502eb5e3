"""End-to-end timings of MalleTrain on a real local Slurm cluster.

    python -m bench.e2e --json                       # prints the figures as JSON
    python -m bench.e2e --markdown BENCHMARKS.md     # and rewrites the e2e section there

One run, one 16-node cluster (test timings: bf_interval=1, batch_sched_delay=0), one
malletraind, in three phases:

1. **rescales, real torch** — a prod job holds 12 nodes, so 4 stay idle; one elastic job
   (``-N 1-4``, examples/train_elastic.py, gloo DDP, profiling off) trains on them. Each round a
   2-node prod job preempts two workers: ``shrink_s`` runs from the prod job RUNNING to the
   first training step at world size 2; when it ends, ``grow_s`` runs from its end to the first
   step at world size 4. Times come from squeue and the workers' own output, polled every
   0.2 s.
2. **prod start with MalleTrain** — stand-in workers (a sleeping script) hold all 4 idle
   nodes; one-node prod jobs are submitted one at a time and each must preempt a worker:
   the delay from ``sbatch`` returning to squeue showing it RUNNING (polled every 50 ms).
3. **prod start without** — the same submissions with the daemon stopped and no workers.
4. **in place and restart side by side** (run between phases 1 and 2, bench/e2e_paths.py) —
   one job per path, the same script (tests/workers/inplace_train.py), ``--path-rounds``
   rounds of a one-node preemption, a grow, a planned shrink and a grow: the training pause
   on the members (gap between their step timestamps), the steps lost, node idle → training.
   JSON: ``inplace`` and ``restart``, each with ``grow_pause_s``, ``shrink_pause_s``,
   ``preempt_pause_s`` (medians), ``steps_lost`` (largest) and ``idle_to_training_s``.

``hook_to_action_ms`` is the daemon's own measurement (``malletrain status``): from a hook
datagram's arrival to the batch-system command it led to.

Over 400 lines on purpose: the Slurm phases, their report and the merging of several runs' JSON
share the record's keys; what the PBS run shares with it is :mod:`bench.e2e_common`, its in-
place phase :mod:`bench.e2e_paths`.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

if __name__ == "__main__" and not __package__:  # started as a file; bench/ is a package
    sys.exit("run it as a module from the repository's root: python -m bench.e2e "
             + " ".join(sys.argv[1:]))
from bench.e2e_common import EpochWatcher, p95, timing_rows, wait  # noqa: E402
from bench.e2e_paths import SETTINGS, lost_tasks, run_paths  # noqa: E402
from bench.sections import host, replace_section, say  # noqa: E402
from devtools.localcluster import LocalCluster  # noqa: E402
from devtools.localcluster.daemon import LocalDaemon  # noqa: E402

BEGIN, END = "<!-- e2e:begin -->", "<!-- e2e:end -->"
TRAIN = [sys.executable, "examples/train_elastic.py", "--steps", "0", "--batch", "16",
         "--step-sleep-s", "0.05", "--checkpoint-every-s", "20", "--log-every", "1"]


def state_of(cluster: LocalCluster, job: str) -> str:
    return cluster.run(["squeue", "-h", "-j", job, "-o", "%T"], check=False).stdout.strip()


def running_tasks(cluster: LocalCluster, job: str) -> int:
    out = cluster.run(["squeue", "-h", "-r", "-j", job, "-t", "R", "-o", "%i"],
                      check=False).stdout
    return len(out.split())


def rescales(cluster: LocalCluster, daemon: LocalDaemon, work: Path, rounds: int,
             idle: int, lost: list[str]) -> tuple[list[float], list[float]]:
    outdir = work / "out"
    outdir.mkdir()
    script = daemon.training_script(TRAIN, outdir)
    job = cluster.sbatch("--qos=malletrain", f"-N1-{idle}", "--comment=profile=no",
                         "--open-mode=append", "-o", f"{outdir}/task-%A_%a.out", script=script)
    watch = EpochWatcher(outdir, job)
    t0 = time.monotonic()
    watch.wait_world(idle, t0, 300)
    say(f"elastic job {job} trains on {idle} nodes after {time.monotonic() - t0:.1f} s")
    grows, shrinks = [], []
    for r in range(rounds):
        prod = cluster.sbatch("-p", "prod", "-N", "2", "-o", "/dev/null", "--wrap", "sleep 25")
        t_run = wait("prod running", lambda p=prod: state_of(cluster, p) == "RUNNING", 60)
        shrinks.append(watch.wait_world(idle - 2, t_run, 180) - t_run)
        t_end = wait("prod ended", lambda p=prod: state_of(cluster, p) in ("", "COMPLETED"),
                     90)
        grows.append(watch.wait_world(idle, t_end, 180) - t_end)
        say(f"round {r + 1}/{rounds}: shrink {shrinks[-1]:.1f} s, grow {grows[-1]:.1f} s")
    lost += lost_tasks(cluster, job)
    cluster.run(["scancel", job])
    wait("training job gone", lambda: not state_of(cluster, job), 60, 0.5)
    return grows, shrinks


STARTED = ("RUNNING", "COMPLETING", "COMPLETED", "")


def prod_starts(cluster: LocalCluster, n: int, before: Any = None,
                delays: list[float] | None = None, ended: Any = None) -> list[float]:
    delays = [] if delays is None else delays
    for i in range(n):
        if before is not None:
            before()
        t0 = time.monotonic()
        prod = cluster.sbatch("-p", "prod", "-N", "1", "-o", "/dev/null", "--wrap", "sleep 1")
        t1 = wait("prod running", lambda p=prod: state_of(cluster, p) in STARTED, 60)
        delays.append(t1 - t0)
        wait("prod ended", (lambda p=prod: ended(p)) if ended is not None else
             (lambda p=prod: state_of(cluster, p) in ("", "COMPLETED")), 60, 0.2)
        if (i + 1) % 10 == 0:
            say(f"  {i + 1}/{n} prod jobs, median start {statistics.median(delays):.2f} s")
    return delays


def prod_starts_on_workers(cluster: LocalCluster, idle: int, n: int, delays: list[float],
                           regrow: list[float]) -> str:
    """Stand-in workers (a sleeping script, under the running daemon) on the ``idle`` free
    nodes, then ``n`` one-node prod jobs, each submitted once every free node has a worker
    again, so that each preempts one; returns the stand-in job's id (left running)."""
    standin = cluster.sbatch("--qos=malletrain", f"-N1-{idle}", "--comment=profile=no",
                             "-o", "/dev/null", "--chdir=/tmp",
                             script="#!/bin/sh\nexec sleep 100000\n")
    ended: list[float] = []

    def harvested() -> None:
        t = wait("all idle nodes harvested",
                 lambda: running_tasks(cluster, standin) == idle, 90, 0.05)
        if ended:  # the node the last prod job used, training again
            regrow.append(round(t - ended[-1], 2))

    def done(p: str) -> bool:
        if state_of(cluster, p) in ("", "COMPLETED"):
            ended.append(time.monotonic())
            return True
        return False

    prod_starts(cluster, n, before=harvested, delays=delays, ended=done)
    return standin


def clear_phase(cluster: LocalCluster, keep: str) -> None:
    """After a failed phase: cancel every job but ``keep`` (the blocker) and wait for them."""
    ids = set(cluster.run(["squeue", "-h", "-o", "%F"], check=False).stdout.split()) - {keep}
    if ids:
        cluster.run(["scancel", *sorted(ids)], check=False)
    wait("the failed phase's jobs gone", lambda: not set(cluster.run(
        ["squeue", "-h", "-o", "%F"], check=False).stdout.split()) - {keep}, 90, 0.5)


def run(nodes: int, submissions: int, rounds: int, path_rounds: int = 3) -> dict[str, Any]:
    """One run; a phase that fails is named in ``failed`` (with why) and the others go on."""
    work = Path(tempfile.mkdtemp(prefix="malletrain-e2e-"))
    work.chmod(0o755)
    cluster = LocalCluster(nodes=nodes, root=work / "cluster")
    say(f"starting a {nodes}-node local cluster in {work}")
    cluster.start()
    daemon = LocalDaemon(cluster, root=work / "daemon", settings=SETTINGS)
    failed: dict[str, str] = {}
    lost: list[str] = []
    grows: list[float] = []
    shrinks: list[float] = []
    paths: dict[str, Any] = {}
    with_mt: list[float] = []
    without: list[float] = []
    regrow: list[float] = []
    status: dict[str, Any] = {"daemon": {}}
    idle = 4
    blocker = ""

    def phase(name: str, body: Any) -> None:
        try:
            body()
        except (TimeoutError, RuntimeError, ValueError) as exc:
            failed[name] = str(exc).splitlines()[0]
            say(f"{name} FAILED: {failed[name]} (the other phases go on)")
            clear_phase(cluster, blocker)

    try:
        daemon.start()
        blocker = cluster.sbatch("-p", "prod", "-N", str(nodes - idle), "-o", "/dev/null",
                                 "--wrap", "sleep 100000")
        wait("blocker running", lambda: state_of(cluster, blocker) == "RUNNING", 60)

        def phase1() -> None:
            say("phase 1: rescales of a real torch job")
            g, s = rescales(cluster, daemon, work, rounds, idle, lost)
            grows.extend(g)
            shrinks.extend(s)

        def phase4() -> None:
            say(f"phase 4: in place and restart side by side, {path_rounds} rounds each")
            paths.update(run_paths(cluster, daemon, work, path_rounds, lost))

        def phase2() -> None:
            say(f"phase 2: {submissions} prod jobs preempting stand-in workers")
            standin = prod_starts_on_workers(cluster, idle, submissions, with_mt, regrow)
            status.update(daemon.query("status"))
            lost.extend(lost_tasks(cluster, standin))
            cluster.run(["scancel", standin])
            wait("workers gone", lambda: not state_of(cluster, standin), 60, 0.5)

        phase("phase 1", phase1)
        phase("phase 4", phase4)
        phase("phase 2", phase2)
        daemon.stop()

        def phase3() -> None:
            say(f"phase 3: {submissions} prod jobs without MalleTrain")
            prod_starts(cluster, submissions, delays=without)

        phase("phase 3", phase3)
    finally:
        daemon.stop()
        cluster.stop()
    hook = status["daemon"].get("hook_to_action_ms", {})

    def med(xs: list[float]) -> float | None:
        return statistics.median(xs) if xs else None

    grant = grows + regrow + [x for p in ("inplace", "restart")
                              for x in paths.get(p, {}).get("idle_to_training_s_all", [])]
    return {
        "nodes": nodes, "completed": not failed, "failed": failed,
        "tasks_lost": lost, "grant_to_training_s_max": max(grant) if grant else None,
        "grant_to_start_s": status["daemon"].get("grant_to_start_s"),
        "regrow_after_prod_s": {"median": med(regrow), "max": max(regrow) if regrow else None},
        "grow_s": med(grows), "shrink_s": med(shrinks),
        "hook_to_action_ms": hook.get("median"),
        "prod_start_s": {"with_malletrain": med(with_mt), "without": med(without),
                         "with_malletrain_p95": p95(with_mt) if with_mt else None,
                         "without_p95": p95(without) if without else None},
        "grow_s_all": [round(x, 2) for x in grows],
        "shrink_s_all": [round(x, 2) for x in shrinks],
        "hook_to_action_ms_p95": hook.get("p95"), "hook_to_action_count": hook.get("count"),
        "submissions": submissions, "rounds": rounds,
        **paths, "path_rounds": path_rounds,
    }


def machine() -> str:
    slurm = subprocess.run(["slurmctld", "-V"], capture_output=True, text=True,
                           check=False).stdout.strip()
    return host(slurm)


def liveness_rows(r: dict[str, Any]) -> list[str]:
    """Grant → training at its worst, and the tasks jobs lost (absent from older JSON)."""
    if "grant_to_training_s_max" not in r:
        return []
    g = r["regrow_after_prod_s"]
    return [
        f"| prod job ended → its node training again (phase 2, n = {r['submissions'] - 1}) | "
        f"{g['median']:.2f} s | max {g['max']:.2f} s |",
        f"| node idle → training, worst of every grow in the run | | "
        f"{r['grant_to_training_s_max']:.1f} s |",
        *([f"| grant → its task running (the daemon's own count to the poll that saw it, n = "
           f"{r['grant_to_start_s']['count']}) | {r['grant_to_start_s']['median']:.2f} s | max "
           f"{r['grant_to_start_s']['max']:.2f} s |"]
          if (r.get("grant_to_start_s") or {}).get("count") else []),
        f"| tasks an elastic job lost for good (FAILED, never requeued) | "
        f"{len(r['tasks_lost'])} | {', '.join(r['tasks_lost']) or 'none'} |"]


def section(r: dict[str, Any], command: str) -> str:
    p = r["prod_start_s"]
    date = r.get("date") or datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return "\n".join([
        BEGIN,
        f"Measured {date} on {r.get('machine') or machine()}, with `{command}` (one run; test timings "
        "bf_interval=1, batch_sched_delay=0).",
        "",
        "| what | median | p95 / all |",
        "|---|---|---|",
        *timing_rows(r),
        *liveness_rows(r),
        f"| prod job start, workers on its node (n = {r['submissions']}) | "
        f"{p['with_malletrain']:.2f} s | {p['with_malletrain_p95']:.2f} s |",
        f"| prod job start, idle node, no MalleTrain (n = {r['submissions']}) | "
        f"{p['without']:.2f} s | {p['without_p95']:.2f} s |",
        "",
        f"Prod start with MalleTrain's workers on the node minus without: "
        f"{p['with_malletrain'] - p['without']:+.2f} s (median), "
        f"{p['with_malletrain_p95'] - p['without_p95']:+.2f} s (p95) — Slurm preempts the "
        "workers itself (REQUEUE, GraceTime 0), so a prod job waits for no MalleTrain "
        "component; the two phases ran one after the other, so the difference is within the "
        "machine's noise. The hook latency is mostly the daemon's 0.2 s coalescing window "
        "(a burst of hooks makes one cycle). Grow and shrink include a torchrun restart of every worker from the last "
        "checkpoint (gloo, a small CNN on CPU); a grow also waits for the checkpoint the "
        "running epoch takes before the membership changes. The elastic job runs without "
        "profiling (`--comment=profile=no`) so that its size follows the idle nodes only.",
        *path_rows(r),
        END])


def path_rows(r: dict[str, Any]) -> list[str]:
    """Phase 4's table: in place and restart side by side (absent from older JSON)."""
    if "inplace" not in r:
        return []
    a, b = r["inplace"], r["restart"]

    def cell(p: dict[str, Any], kind: str) -> str:
        lost = max(p[f"{kind}_steps_lost_all"])
        return (f"{p[f'{kind}_pause_s']:.2f} s ({', '.join(f'{x:.2f}' for x in p[f'{kind}_pause_s_all'])}); "
                f"max {lost} step{'s' if lost != 1 else ''} lost")

    def load(p: dict[str, Any]) -> str:
        return f"{min(p['load_1min']):.1f}-{max(p['load_1min']):.1f}"

    return [
        "",
        f"In place and restart side by side (phase 4, {r['path_rounds']} rounds per path, one "
        "job of 1-4 nodes each, the same script: tests/workers/inplace_train.py, steps of about "
        f"50 ms; 1-min load {load(a)} during the in-place rounds, {load(b)} during the restart "
        "ones). Pause: the gap between "
        "a member's last step timestamp before the change and its first after (median over the "
        "members that lived through it; the median over changes, then every change):",
        "",
        "| change | in place (`malletrain-run --inplace`) | restart (`malletrain-run`) |",
        "|---|---|---|",
        f"| grow (3 → 4, 2 → 4) | {cell(a, 'grow')} | {cell(b, 'grow')} |",
        f"| planned shrink (4 → 2) | {cell(a, 'shrink')} | {cell(b, 'shrink')} |",
        f"| preemption of one node (4 → 3) | {cell(a, 'preempt')} | {cell(b, 'preempt')} |",
        f"| node idle → training at the larger size | {a['idle_to_training_s']:.1f} s "
        f"({', '.join(f'{x:.1f}' for x in a['idle_to_training_s_all'])}) | "
        f"{b['idle_to_training_s']:.1f} s "
        f"({', '.join(f'{x:.1f}' for x in b['idle_to_training_s_all'])}) |",
        f"| path the daemon recorded | {', '.join(sorted(set(a['grow_paths'] + a['shrink_paths'] + a['preempt_paths'])))} "
        f"| {', '.join(sorted(set(b['grow_paths'] + b['shrink_paths'] + b['preempt_paths'])))} |",
        "",
        "In place, a joiner's process starts and imports torch while the members keep "
        "training, so node idle → training is the task start and that import; the pause is the "
        "re-form and hand-over alone. A preemption loses at most the step in flight. On the "
        "restart path every change stops torchrun and every worker and resumes from the "
        "checkpoint (taken at the daemon's request before a planned change; the last periodic "
        "one, every 10 s, on a preemption)."]


def runs_table(results: list[tuple[str, dict[str, Any]]]) -> str:
    """One row per run (``--summarize``): did it complete, what was lost, the worst grant."""
    rows = ["| run | completed | tasks lost | worst node idle → training | prod end → node "
            "training (median / max) | grant → task running (max) | prod start with / without "
            "(median) | 1-min load (phase 4) |", "|---|---|---|---|---|---|---|---|"]
    for name, r in results:
        g, p = r.get("regrow_after_prod_s") or {}, r.get("prod_start_s") or {}
        start = r.get("grant_to_start_s") or {}
        loads = [x for k in ("inplace", "restart") for x in r.get(k, {}).get("load_1min", [])]

        def f(x: Any, unit: str = " s") -> str:
            return "–" if x is None else f"{x:.2f}{unit}"

        load = f"{min(loads):.1f}-{max(loads):.1f}" if loads else "–"
        rows.append(
            f"| {name} | {'yes' if r.get('completed', True) else 'no: ' + ', '.join(r['failed'])}"
            f" | {len(r.get('tasks_lost', []))} | {f(r.get('grant_to_training_s_max'))} | "
            f"{f(g.get('median'))} / {f(g.get('max'))} | "
            f"{f(start.get('max')) if start.get('count') else '–'} | "
            f"{f(p.get('with_malletrain'))} / {f(p.get('without'))} | {load} |")
    return "\n".join(rows)


def write_markdown(path: Path, body: str) -> None:
    replace_section(path, BEGIN, END, body, "End to end on a local Slurm cluster")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-system", choices=("slurm", "pbs"), default="slurm",
                   help="pbs: the same phases on a local OpenPBS complex (bench/e2e_pbs.py)")
    p.add_argument("--nodes", type=int, default=16)
    p.add_argument("--submissions", type=int, default=30, help="prod jobs per phase")
    p.add_argument("--rounds", type=int, default=3, help="preempt/grow rounds of phase 1")
    p.add_argument("--path-rounds", type=int, default=3, help="rounds per path of phase 4 "
                   "(in place and restart side by side)")
    p.add_argument("--json", action="store_true", help="print only the JSON")
    p.add_argument("--markdown", metavar="FILE", help="rewrite the e2e section of FILE")
    p.add_argument("--from-json", metavar="FILE", help="no run: take the figures from the "
                   "JSON a previous --json run printed (with its command in \"command\")")
    p.add_argument("--summarize", metavar="FILE", nargs="+", help="no run: print a markdown "
                   "table with one row per run from the JSON files of several runs")
    args = p.parse_args(argv)
    if args.summarize:
        print(runs_table([(Path(f).stem, json.loads(Path(f).read_text()))
                          for f in args.summarize]))
        return 0
    if args.nodes < 8 or args.submissions < 1 or args.rounds < 1 or args.path_rounds < 1:
        p.error("--nodes must be ≥ 8, --submissions, --rounds and --path-rounds ≥ 1")
    runner: Callable[[int, int, int, int], dict[str, Any]] = run
    where, sect, write = machine, section, write_markdown
    if args.batch_system == "pbs":
        from bench import e2e_pbs  # noqa: PLC0415 - it needs the PBS harness, Slurm runs do not

        def pbs_runner(_nodes: int, submissions: int, rounds: int,
                       _path_rounds: int = 0) -> dict[str, Any]:
            return e2e_pbs.run(submissions, rounds)
        runner = pbs_runner
        where, sect, write = e2e_pbs.machine, e2e_pbs.section, e2e_pbs.write_markdown
    if args.from_json:
        result = json.loads(Path(args.from_json).read_text())
    else:
        result = runner(args.nodes, args.submissions, args.rounds, args.path_rounds)
        flags = [a for a in (argv if argv is not None else sys.argv[1:])]
        result["command"] = "python -m bench.e2e " + shlex.join(flags)
        result["machine"] = where()
        result["date"] = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    if args.markdown and result.get("failed"):
        say(f"{args.markdown} not rewritten: phases failed ({', '.join(result['failed'])})")
    elif args.markdown:
        write(Path(args.markdown), sect(result, result["command"].strip()))
    print(json.dumps(result, indent=None if args.json else 1))
    if result.get("failed"):
        say(f"failed phases: {', '.join(result['failed'])} (their figures are missing above)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
