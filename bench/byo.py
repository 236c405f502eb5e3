"""Bring-your-own loops on a real local Slurm cluster: in process and restart, side by side.

    python -m bench.byo --json                               # every integration, both paths
    python -m bench.byo --json --integration torchrun --rounds 2
    python -m bench.byo --markdown BENCHMARKS.md             # and rewrite its section there

For each integration (examples/NAME/after.py, unchanged) and each path (``malletrain-run
--inplace``: the processes live across changes; ``malletrain-run``: torchrun restarts every
worker each epoch), one elastic job ``-N 1-3`` on 3 idle nodes, ``--rounds`` rounds of:

* **preemption** 3 → 2: a one-node prod job pinned to one of the job's nodes (no warning);
* **grow** 2 → 3: that prod job is cancelled;
* **planned shrink** 3 → 1: a second elastic job (a stand-in that sleeps) takes its share
  (``allocator.min_share = 1``);
* **grow** 1 → 3: the stand-in is cancelled.

Per change, from the workers' own step lines (devtools/runlogs/byo_logs.py): the *pause* (the last
step of the old epoch to the first step of the new one) and the *samples lost* (the positions
trained in the old epoch beyond the cursor the new epoch started from). The JSON's last line
has, per integration and path, the medians of the pauses and the largest loss on a
preemption; an integration that has no in-process path says so instead of figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

if __name__ == "__main__" and not __package__:  # started as a file; bench/ is a package
    sys.exit("run it as a module from the repository's root: python -m bench.byo "
             + " ".join(sys.argv[1:]))
from bench.e2e_paths import SETTINGS, STANDIN, _gone, _running  # noqa: E402
from bench.sections import host, replace_section  # noqa: E402
from devtools.localcluster import LocalCluster  # noqa: E402
from devtools.localcluster.daemon import LocalDaemon  # noqa: E402
from devtools.runlogs.byo_logs import ENV, SCRIPTS, ByoLog, problems, read  # noqa: E402
from devtools.waiting import wait_until  # noqa: E402

BEGIN, END = "<!-- byo:begin -->", "<!-- byo:end -->"
INPROCESS = {"torchrun", "lightning", "hf"}
"""The integrations with an in-process path."""
IDLE = 3


def world_of(log: ByoLog, epoch: int) -> tuple[int, set[int]]:
    rows = log.steps.get(epoch, [])
    return (max((r.world for r in rows), default=0), {r.rank for r in rows})


def wait_epoch(cluster: LocalCluster, outdir: Path, job: str, world: int, after: int,
               timeout_s: float = 300.0) -> int:
    """The first epoch after ``after`` where ``world`` ranks trained 3 steps on as many
    RUNNING tasks."""
    found: list[int] = []

    def ok() -> bool:
        log = read(outdir, job)
        for e in sorted(log.steps):
            w, ranks = world_of(log, e)
            if e > after and w == world and ranks == set(range(world)) and \
                    len({r.step for r in log.steps[e]}) >= 3:
                if len(_running(cluster, job)) == world:
                    found.append(e)
                    return True
        return False

    wait_until(f"job {job} training at world {world} after epoch {after}", ok, timeout_s, 0.5)
    return found[0]


def change(log: ByoLog, a: int, b: int) -> tuple[float, int]:
    """(pause s, samples lost) from epoch ``a``'s last step to epoch ``b``'s first."""
    before = [r for e, rows in log.steps.items() if a <= e < b for r in rows]
    after = log.steps[b]
    pause = min(r.t for r in after) - max(r.t for r in before)
    resumed = [c for _, _, _, c, _, _ in log.starts.get(b, [])]
    start = min(resumed) if resumed else min(r.first for r in after)
    return round(pause, 3), max(0, max(r.stop for r in before) - start)


def one_path(cluster: LocalCluster, daemon: LocalDaemon, work: Path, name: str,
             inplace: bool, rounds: int) -> dict[str, Any]:
    path = "inprocess" if inplace else "restart"
    outdir = work / f"out-{name}-{path}"
    outdir.mkdir()
    outdir.chmod(0o777)
    command = [arg.format(out=outdir) for arg in SCRIPTS[name]]
    script = daemon.training_script([*ENV, *command], outdir, inplace=inplace)
    job = cluster.sbatch("--qos=malletrain", f"-N1-{IDLE}", "--comment=profile=no",
                         "--open-mode=append", "-o", f"{outdir}/task-%A_%a.out", script=script)
    e = wait_epoch(cluster, outdir, job, IDLE, -1, 400)
    load = [os.getloadavg()[0]]
    done: dict[str, list[tuple[int, int]]] = {"preempt": [], "grow": [], "shrink": []}

    def to(world: int, kind: str) -> None:
        nonlocal e
        nxt = wait_epoch(cluster, outdir, job, world, e)
        done[kind].append((e, nxt))
        e = nxt

    def free(other: str) -> None:
        cluster.run(["scancel", other])
        wait_until(f"job {other} gone", lambda: _gone(cluster, other), 60, 0.1)

    for r in range(rounds):
        prod = cluster.sbatch("-p", "prod", "-N", "1", "-w", _running(cluster, job)[-1],
                              "-o", "/dev/null", "--wrap", "sleep 100000")
        to(IDLE - 1, "preempt")
        free(prod)
        to(IDLE, "grow")
        standin = cluster.sbatch("--qos=malletrain", "-N", "2-2", "--comment=profile=no",
                                 "-o", "/dev/null", "--chdir=/tmp", script=STANDIN)
        to(IDLE - 2, "shrink")
        free(standin)
        to(IDLE, "grow")
        load.append(os.getloadavg()[0])
        print(f"[{time.strftime('%H:%M:%S')}] {name} {path}: round {r + 1}/{rounds} done",
              file=sys.stderr, flush=True)
    time.sleep(2)
    cluster.run(["scancel", job])
    wait_until("training job gone", lambda: _gone(cluster, job), 60, 0.5)
    log = read(outdir, job)
    out: dict[str, Any] = {}
    for kind, pairs in done.items():
        figures = [change(log, a, b) for a, b in pairs]
        out[f"{kind}_pause_s"] = statistics.median(p for p, _ in figures)
        out[f"{kind}_pause_s_all"] = [p for p, _ in figures]
        out[f"{kind}_samples_lost_all"] = [n for _, n in figures]
    out["samples_lost_preempt"] = max(out.pop("preempt_samples_lost_all"))
    out["grow_pause_s"] = out.pop("grow_pause_s")
    out["accounting_problems"] = problems(log)
    out["in_memory_epochs"] = len(log.in_memory)
    out["load_1min"] = [round(x, 1) for x in load]
    return out


def run(names: list[str], rounds: int, work: Path) -> dict[str, Any]:
    cluster = LocalCluster(root=work / "cluster", nodes=IDLE + 2)
    cluster.start()
    os.environ["PATH"] = cluster.release.env(dict(os.environ))["PATH"]
    blocker = cluster.sbatch("-p", "prod", "-N", "2", "-o", "/dev/null",
                             "--wrap", "sleep 100000")  # IDLE nodes stay free
    daemon = LocalDaemon(cluster, root=work / "malletraind",
                         settings={"profiler": {"enabled": False}, **SETTINGS})
    daemon.start()
    results: dict[str, Any] = {}
    try:
        for name in names:
            results[name] = {"inprocess": (
                one_path(cluster, daemon, work, name, True, rounds) if name in INPROCESS else
                {"supported": False, "why": "no in-process path for this integration yet"})}
            results[name]["restart"] = one_path(cluster, daemon, work, name, False, rounds)
    finally:
        daemon.stop()
        cluster.run(["scancel", blocker], check=False)
        cluster.stop()
    results["meta"] = {"rounds": rounds, "idle_nodes": IDLE, "host": host(),
                       "versions": versions(),
                       "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}
    return results


def versions() -> str:
    """torch's, Lightning's and transformers' releases, as installed."""
    from importlib.metadata import PackageNotFoundError, version

    out = []
    for name in ("torch", "lightning", "transformers"):
        try:
            out.append(f"{name} {version(name)}")
        except PackageNotFoundError:
            out.append(f"{name} not installed")
    return ", ".join(out)


def section(results: dict[str, Any], command: str) -> str:
    meta = results["meta"]
    rows = ["| integration | path | grow pause | shrink pause | preemption pause | "
            "samples lost (preemption, max) | sample accounting | 1-min load |",
            "|---|---|---|---|---|---|---|---|"]
    for name in (n for n in SCRIPTS if n in results):
        for path in ("inprocess", "restart"):
            r = results[name][path]
            if r.get("supported") is False:
                rows.append(f"| {name} | {path} | — | — | — | {r['why']} | | |")
                continue
            rows.append(f"| {name} | {path} | {r['grow_pause_s']:.2f} s | "
                        f"{r['shrink_pause_s']:.2f} s | {r['preempt_pause_s']:.2f} s | "
                        f"{r['samples_lost_preempt']} | "
                        f"{len(r['accounting_problems']) or 'clean'} | "
                        f"{min(r['load_1min'])}–{max(r['load_1min'])} |")
    return "\n".join([
        BEGIN, f"Measured {meta['date']} by `{command}` on {meta['host']} "
        f"({meta.get('versions', 'versions not recorded')}): {meta['rounds']} "
        f"round(s) per path of preemption 3→2, grow 2→3, planned shrink 3→1, grow 1→3 "
        "(medians over the rounds; steps paced to ≥ 0.15 s, the Trainer's micro-batches too; "
        "per-rank batch 8 for torchrun and Lightning, a global batch of 48 for the Trainer; gloo "
        "on CPU; a checkpoint every 6 s). Pauses are from the last step of an epoch to the first "
        "step of the next on the workers' own clocks (one paced step included); samples lost "
        "are the positions trained in the old epoch beyond the cursor the new one started from; "
        "sample accounting is devtools/runlogs/byo_logs.py's position-by-position check over all "
        "the rounds (clean, or the number of problems); the load is the host's 1-min load "
        "average at the start and after each round. A Trainer step at world W is 6/W paced "
        "micro-batches, so its pauses hold up to 0.9 s of one step.",
        "", *rows, "", END])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--integration", action="append", choices=sorted(SCRIPTS),
                   help="repeat for several (default: all)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--json", action="store_true", help="print the results as one JSON line")
    p.add_argument("--markdown", metavar="FILE", help="rewrite this section of that file")
    p.add_argument("--from", dest="source", metavar="FILE",
                   help="the JSON line of an earlier run (its last line) instead of running")
    args = p.parse_args(argv)
    names = args.integration or list(SCRIPTS)
    command = " ".join(["python -m bench.byo --json",
                        *(f"--integration {n}" for n in args.integration or []),
                        f"--rounds {args.rounds}"])
    if args.source:
        results = json.loads(Path(args.source).read_text().strip().splitlines()[-1])
        command = results["meta"].get("command", command)
    else:
        with tempfile.TemporaryDirectory(prefix="malletrain-byo-") as tmp:
            work = Path(tmp)
            work.chmod(0o755)
            results = run(names, args.rounds, work)
        results["meta"]["command"] = command
    if args.markdown:
        replace_section(Path(args.markdown), BEGIN, END, section(results, command),
                        "Bring your own loop: in process and restart")
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
