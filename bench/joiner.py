"""Node idle → the joiner's first training step, in place, on a real local Slurm cluster.

One elastic job (``malletrain-run --inplace``, ``-N 1-NODES``, tests/workers/joiner_train.py:
a user's script with a ``torch.optim`` optimizer) holds every node of a small local cluster.
Each join: a prod job pinned to one of the job's nodes (``sleep``, a whole-minute time limit)
preempts the task there, runs and completes; the daemon grants the freed node back and the
joiner trains again with the others. Per join, from slurmctld's log (to the millisecond) and
the joiner's own line (tests/workers/joiner_train.py):

* **grant**: the prod job's end (``_job_complete``) → slurmctld starts the elastic task there
  (the daemon's hook or poll, its ``scontrol release``, Slurm's scheduling tick);
* **slurmd**: that start → the task's process (the batch script, exec'ed into the launcher);
* **launcher**: → the training process's exec (the launcher's start-up, it starts the process
  ahead of the node's epoch);
* **import torch** (and the rest of the script's imports), **model**, **optimizer** (its first
  ``add_param_group`` imports ``torch._dynamo``), **to ready** (``Elastic``);
* **placed and formed**: ready → the first step at the grown size (the launcher tells the
  daemon, which places the node; the members re-form at their next step boundary).

``--markdown FILE --compare BEFORE.json AFTER.json [...]`` writes the section from pairs of
saved runs (the same bench on two versions of the code), without running anything.
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

REPO = Path(__file__).resolve().parents[1]
if not __package__:  # started as a file: bench/ is a package, run from the repository's root
    sys.exit("run it as a module from the repository's root: python -m bench.joiner "
             + " ".join(sys.argv[1:]))

from bench.sections import host, replace_section, say  # noqa: E402
from bench.sim_to_real_costs import elastic_starts  # noqa: E402
from devtools.demo.slurmctld_log import job_times  # noqa: E402
from devtools.localcluster import LocalCluster  # noqa: E402
from devtools.localcluster.daemon import LocalDaemon  # noqa: E402
from devtools.runlogs.jsonlines import read_json_lines  # noqa: E402
from devtools.waiting import wait_until  # noqa: E402

BEGIN, END = "<!-- joiner:begin -->", "<!-- joiner:end -->"
WORKER = [sys.executable, "tests/workers/joiner_train.py", "--compute-s", "0.1"]
PARTS = (("grant", "idle_t", "start_t"), ("slurmd", "start_t", "task_t"),
         ("launcher", "task_t", "exec_t"), ("import_torch", "exec_t", "imported_t"),
         ("model", "imported_t", "model_t"), ("optimizer", "model_t", "built_t"),
         ("to_ready", "built_t", "ready_t"), ("placed_and_formed", "ready_t", "first_t"))
"""Each part of a join: its name and the two moments it lies between."""
LABELS = {"grant": "grant: node idle → task started (slurmctld)",
          "slurmd": "task started → its process (slurmd)",
          "launcher": "launcher → training process exec",
          "import_torch": "import torch (and the script's imports)", "model": "model",
          "optimizer": "optimizer (imports torch._dynamo)", "to_ready": "Elastic → ready",
          "placed_and_formed": "ready → placed and formed, first step"}


FINDINGS = """\
What each part is, and what of it can be cut:

* *Grant.* The daemon hears of the prod job's end from the EpilogSlurmctld hook and releases
  the task to the node within about 60 ms (the daemon's log against slurmctld's). Slurm 22.05
  then starts it at its next scheduling pass: the background loop wakes about once a second
  (ten 0.1-s naps, then `schedule()` when a job changed) and backfill every `bf_interval` (1 s
  here), at the same phase through the run. The one event that runs the scheduler at once is a
  node's epilog-complete message (`_slurm_rpc_epilog_complete`), and a prod job that ends by
  itself on a node with no `Epilog` configured, as in the local cluster, sends none (with
  `SlurmctldDebug=debug2` slurmctld's log shows one for each killed elastic task, none for the
  prod jobs that ended), so nothing runs the scheduler when the node is released. About
  half a second on average, a second at most, is Slurm's.
* *import torch and the optimizer* are the script's own: `import torch` and, at the first
  `torch.optim` optimizer (`Optimizer.add_param_group` is wrapped by `torch._disable_dynamo`),
  `import torch._dynamo`, together about 3 CPU-seconds here, serial in one interpreter (an
  import in a thread hides nothing on a CPU: `bench/gpu.py --cpu-check --parts joiner`).
  Both vary with the host's load (the other runs on these 2 cores), hence most of the spread
  of the totals. The demo's worker (`examples/standin_nas.py`) writes its SGD out and skips
  the second.
* *Launcher.* `malletrain-run --inplace` starts the training process before its first
  check-in; the part is the task's shell, the launcher's interpreter and imports, and the
  training interpreter's own start. Starting the process before the launcher's other imports
  and its config was tried and not kept: from the launcher's exec to the training process's
  first line took 0.105 s against 0.098 s before (bytecode compiled; 0.149 against 0.147 s
  without), medians of 20 starts each on this host.
* *What the change moved* is the last part alone, placed and formed (every run's median below
  every run's before). The launcher's and the imports' parts differ from run to run in both
  versions with the host's load (other work shares these 2 cores; runs of either side took
  0.9 to 1.9 s for `import torch`), and most of the difference between the totals is theirs.
* *Placed and formed* is MalleTrain's: the launcher notices the ready file, checks in, the
  daemon starts the epoch, the members hear of it and re-form at their next step boundary
  (steps of about 0.1 s here). The launcher now looks for the ready files every 10 ms (was
  0.1 s) and the joiner's check-in wakes the members' held check-ins (was their 50-ms look).\
"""


def joiner_lines(outdir: Path) -> list[dict[str, Any]]:
    """Every first-step line the job's processes printed (their tasks' output)."""
    return read_json_lines(*sorted(outdir.glob("task-*.out")), prefix='{"joiner"')


def running_nodes(cluster: LocalCluster, job: str) -> list[str]:
    out = cluster.run(["squeue", "-h", "-r", "-j", job, "-t", "R", "-o", "%N"],
                      check=False).stdout
    return sorted(out.split())


def joins(log_text: str, prods: list[tuple[str, str]],
          lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each prod job's node given back: its parts (see the module doc), from slurmctld's log
    and the joiner's line on that node after the prod job's end."""
    _, _, done = job_times(log_text)
    starts = elastic_starts(log_text)
    out = []
    for prod, node in prods:
        idle_t = done.get(prod)
        if idle_t is None:
            continue
        start = [t for t in starts.get(node, ()) if t >= idle_t]
        line = next((x for x in sorted(lines, key=lambda x: x["exec_t"])
                     if x["joiner"] == node and x["exec_t"] >= idle_t), None)
        if not start or line is None:
            continue
        moments = {**line, "idle_t": idle_t, "start_t": min(start)}
        row = {name: round(moments[b] - moments[a], 3) for name, a, b in PARTS}
        row.update(node=node, prod=prod, world=line["world"],
                   total=round(line["first_t"] - idle_t, 3))
        out.append(row)
    return out


def run(n_joins: int, nodes: int, prod_s: float, node_epilog_s: float = 0.0) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="malletrain-joiner-"))
    work.chmod(0o755)
    # node_epilog_s: what most sites have, an Epilog slurmd runs at every job's end
    cluster = LocalCluster(nodes=nodes, root=work / "cluster", node_epilog_s=node_epilog_s)
    say(f"starting a {nodes}-node local cluster in {work}")
    cluster.start()
    daemon = LocalDaemon(cluster, root=work / "daemon")
    prods: list[tuple[str, str]] = []
    try:
        daemon.start()
        outdir = work / "out"
        outdir.mkdir()
        outdir.chmod(0o777)
        script = daemon.training_script(WORKER, outdir, inplace=True)
        job = cluster.sbatch("--qos=malletrain", f"-N1-{nodes}", "--comment=profile=no",
                             "--open-mode=append", "-o", f"{outdir}/task-%A_%a.out",
                             script=script)
        wait_until(f"job {job} training on {nodes} nodes",
                   lambda: any(x["world"] == nodes for x in joiner_lines(outdir))
                   and len(running_nodes(cluster, job)) == nodes, 180, 0.5)
        for i in range(n_joins):
            node = running_nodes(cluster, job)[-1 - i % nodes]
            t0 = time.time()
            prod = cluster.sbatch("-p", "prod", "-N", "1", "-w", node, "-t", "1",
                                  "-o", "/dev/null", "--wrap", f"sleep {prod_s:g}")
            prods.append((prod, node))
            wait_until(f"join {i + 1}: {node} training again",
                       lambda node=node, t0=t0: any(  # type: ignore[misc]
                           x["joiner"] == node and x["exec_t"] > t0 + prod_s
                           and x["world"] == nodes for x in joiner_lines(outdir)),
                       90 + prod_s, 0.3)
            time.sleep(1.0)  # the members' steps settle before the next preemption
            say(f"join {i + 1}/{n_joins} on {node} done")
        cluster.run(["scancel", job], check=False)
        log_text = (cluster.run_dir / "log" / "slurmctld.log").read_text(errors="replace")
        rows = joins(log_text, prods, joiner_lines(outdir))
    finally:
        daemon.stop()
        cluster.stop()
    return {"joins": rows, "nodes": nodes, "prod_s": prod_s, "node_epilog_s": node_epilog_s,
            "median": medians(rows)}


def medians(joins: list[dict[str, Any]]) -> dict[str, float]:
    """The median of the total and of each part over ``joins``."""
    return {k: round(statistics.median(j[k] for j in joins), 3)
            for k in ("total", *(p[0] for p in PARTS))} if joins else {}


def section(befores: list[dict[str, Any]], afters: list[dict[str, Any]]) -> str:
    """The BENCHMARKS section: every join of the runs of each side pooled, medians side by
    side, then each run's joins."""
    pooled = [medians([j for r in runs for j in r["joins"]]) for runs in (befores, afters)]

    def cell(side: int, key: str) -> str:
        return f"{pooled[side][key]:.2f} s" if key in pooled[side] else "–"

    def each(runs: list[dict[str, Any]], key: str) -> str:
        return ", ".join(f"{r['median'][key]:.2f}" for r in runs if key in r.get("median", {}))

    rows = [f"| {LABELS[name]} | {cell(0, name)} | {cell(1, name)} | {each(befores, name)} "
            f"| {each(afters, name)} |" for name, _, _ in PARTS]
    rows.append(f"| **node idle → first step at the grown size** | **{cell(0, 'total')}** "
                f"| **{cell(1, 'total')}** | {each(befores, 'total')} | {each(afters, 'total')} |")
    every = [f"* {label} ({r['commit']}, {r['date']}, 1-min load {r['load']} at the end): "
             + ", ".join(f"{j['total']:.2f}" for j in r["joins"])
             + f" s; median {r['median']['total']:.2f} s, placed and formed "
             f"{r['median']['placed_and_formed']:.2f} s"
             for label, runs in (("before", befores), ("after", afters)) for r in runs]
    after = afters[-1]
    n = [sum(len(r["joins"]) for r in runs) for runs in (befores, afters)]
    return "\n".join([
        BEGIN,
        f"`{after['command']}` on {after['machine']}: a {after['nodes']}-node local Slurm "
        "cluster and `malletraind`, one elastic job rescaling in place on every node "
        "(tests/workers/joiner_train.py: `torch.optim.SGD`, a step of 0.1 s of waiting and a "
        "small real all-reduce over gloo); each join, a prod job pinned to one of its nodes "
        f"runs {after['prod_s']:g} s and completes, and the node goes back to the job. "
        f"Before: the code at {befores[0]['commit']} (with this bench added), after: at "
        f"{after['commit']}, run alternately. Median over {n[0]} joins (before) and {n[1]} "
        "(after); each part from slurmctld's log (ms) and the joiner's own timestamps:",
        "",
        "| part | before | after | before, each run's median | after, each run's median |",
        "| --- | ---: | ---: | --- | --- |",
        *rows,
        "",
        "Each run's joins, node idle → first step:",
        "",
        *every,
        "",
        FINDINGS,
        END,
    ])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--joins", type=int, default=6)
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument("--prod-s", type=float, default=4.0, help="each prod job's run")
    p.add_argument("--node-epilog-s", type=float, default=0.0, help="give the nodes an Epilog "
                   "that takes this long (the local cluster has none; sites commonly have one)")
    p.add_argument("--markdown", metavar="FILE", help="rewrite the joiner section of FILE "
                   "(with --compare)")
    p.add_argument("--compare", metavar="JSON", nargs="+", help="no run: BEFORE.json "
                   "AFTER.json [...], pairs of saved runs of this bench (the same bench on two "
                   "versions of the code), each side's joins pooled, side by side")
    args = p.parse_args(argv)
    if args.compare:
        try:
            runs = [json.loads(Path(f).read_text()) for f in args.compare]
        except (OSError, ValueError) as exc:
            p.error(f"--compare: {exc} (give the JSON files this bench printed)")
        if len(runs) % 2:
            p.error("--compare takes pairs: BEFORE.json AFTER.json [BEFORE.json AFTER.json ...]")
        befores, afters = runs[0::2], runs[1::2]
        if args.markdown:
            replace_section(Path(args.markdown), BEGIN, END, section(befores, afters),
                            "Joiners: node idle → training in place")
        print(json.dumps({side: medians([j for r in rs for j in r["joins"]])
                          for side, rs in (("before", befores), ("after", afters))}))
        return 0
    if args.joins < 1 or args.nodes < 2 or args.prod_s < 4 or not 0 <= args.node_epilog_s <= 30:
        p.error("--joins must be ≥ 1, --nodes ≥ 2, --prod-s ≥ 4 (a task is not given back a "
                "node it left under 3 s ago) and --node-epilog-s between 0 and 30")
    result = run(args.joins, args.nodes, args.prod_s, args.node_epilog_s)
    import subprocess  # noqa: PLC0415

    result["commit"] = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                                      capture_output=True, text=True).stdout.strip()
    result["command"] = "python -m bench.joiner " + shlex.join(
        argv if argv is not None else sys.argv[1:])
    result["machine"] = host(extra="slurm-wlm 22.05")
    result["load"] = Path("/proc/loadavg").read_text().split()[0]
    result["date"] = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    print(json.dumps(result))
    if not result["joins"]:
        say("no join measured")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
