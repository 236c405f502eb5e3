"""Sharded models rescaled in place against the restart path, on a real local Slurm cluster.

    python -m bench.sharded --json                      # both modes, both paths, the reference
    python -m bench.sharded --json --markdown BENCHMARKS.md
    python -m bench.sharded --json --quick              # the tests' small model, one round

One local Slurm cluster (3 virtual nodes) and one real ``malletraind``; examples/train_sharded.py
(the example's 13.8 M-parameter transformer, AdamW; ``--batch 2 --seq 32`` so that a step is
short on a small host; gloo on CPU; a peer lost after 5 s of silence, :data:`PEER_TIMEOUT_S`;
a line per step; periodic checkpoints every 3600 s, so none
in the measured window; FSDP's buddy copies every 5 steps) runs as one elastic job ``-N 1-3``,
per mode (``hsdp``: two processes per node, a node's processes sharding among themselves and
nodes being replicas; ``fsdp``: one per node, the shards across the whole job) and per path
(``malletrain-run --inplace``: the processes live across changes and the shards move in memory;
``malletrain-run``: torchrun per epoch, a DCP checkpoint at each planned change, read by the
next epoch). From 3 nodes, ``--rounds`` rounds of:

* **shrink** 3 → 2 (planned): a second elastic job (a stand-in) takes its share;
* **grow** 2 → 3: the stand-in is cancelled;

then one **preempt** 3 → 2: a one-node prod job pinned to the job's newest node (no warning; it
may host the epoch's master and store), and a **grow** back once the prod job is
cancelled (:data:`GROW_AFTER_LOSS`).

Figures (bench/sharded_figures.py computes them from the example's lines, which carry the
wall-clock time, and the daemon's log):

* a **pause** (``grow_s``, ``shrink_s``, ``preempt_s``) is the time from the change's order to
  the job's first step at the new world (the first ``step=`` line of the epoch that trains at
  it, the step included), median over the changes of that kind. A preemption's order is the
  prod job's submission (Slurm's own preemption latency included, on both paths); a grow's or
  a planned shrink's is the daemon's line for the first epoch it started after the old one (in
  place: the new membership; on the restart path: the epoch it starts once the old epoch has
  written its checkpoint, so the restart path's figure leaves that write out, in its favour);
* ``steps_lost``: steps trained and then rolled back, summed over the changes (the most steps a
  rank of the old epochs printed, less the steps the new epoch began from);
* ``disk_bytes``: bytes written to the job's checkpoint folder during the changes (each file new
  or changed between a read just before the trigger and one after the new world trained 2
  steps, counted whole), summed;
* ``peak_extra_ratio``: the largest, over the changes and ranks that moved shards (a heal or a
  re-shard), of the exchange's buffers alive at once over the rank's shard, as the hand-over
  records it (``moved`` on the example's ``start`` line; a preemption under ``fsdp`` rolls back
  from the buddy copies and records none: ``peak_extra_ratio_from`` says which changes gave one);
* ``matches_reference``: bench/sharded_reference.py's check (no Slurm): the test worker's model
  taken in place through 2 → 4 → 3 → 2 (a node lost) → 1 → 2 nodes and by save-and-restart
  through the same worlds from the same steps: the full-state digest, sampler position and
  scheduler count at every kept step equal on both.

``restart`` holds each mode's restart run and, per kind, the faster of the two modes' medians;
``done_when`` checks each mode against its own mode's restart run. A phase that fails gives a
row with its ``error`` (and the figures of the changes it measured), not a crash. Progress goes
to stderr, the JSON as the last line of stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from functools import partial
from pathlib import Path
from typing import Any

if __name__ == "__main__" and not __package__:  # started as a file; bench/ is a package
    sys.exit("run it as a module from the repository's root: python -m bench.sharded "
             + " ".join(sys.argv[1:]))
from bench import sharded_reference  # noqa: E402
from bench.e2e_paths import _gone, _running  # noqa: E402
from bench.sections import host, replace_section, say  # noqa: E402
from bench.sharded_figures import (  # noqa: E402
    KINDS,
    Change,
    done_when,
    fastest_restart,
    figures,
    folder_files,
    summarize,
)
from devtools.localcluster import LocalCluster  # noqa: E402
from devtools.localcluster.daemon import LocalDaemon  # noqa: E402
from devtools.runlogs.sharded_logs import daemon_epoch_times, sharded_log  # noqa: E402
from devtools.waiting import wait_until  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- sharded:begin -->", "<!-- sharded:end -->"
IDLE = 3
MODES = {"hsdp": 2, "fsdp": 1}
"""Each mode's processes per node."""
SETTINGS: dict[str, dict[str, Any]] = {"profiler": {"enabled": False},
                                       "allocator": {"min_share": 1.0}}
STANDIN = "#!/bin/sh\nexec sleep 100000\n"
GROW_AFTER_LOSS = ("after the preemption the prod job is cancelled and the job grows back "
                   "(counted with the grows): a grow after a loss under HSDP in place crashed "
                   "before the fix of DTensor's sharding cache (the model rebuilt on an earlier "
                   "epoch's mesh)")
"""Why each run ends with a grow after its preemption."""
HEADLINE = ["--batch", "2", "--seq", "32"]
"""The example's default model (13.8 M parameters), fewer tokens per step."""
SMALL = ["--vocab", "512", "--dim", "64", "--layers", "2", "--heads", "2", "--seq", "16",
         "--batch", "4"]
"""--quick: tests/slurm/test_sharded_slurm.py's small configuration."""


PEER_TIMEOUT_S = 5.0
"""``MALLETRAIN_PEER_TIMEOUT_S`` of the training processes (default 1.25 s): on a 2-core host
running six of them, a heal's 83 MB exchange and rebuild starved the heartbeats past 1.4 s, the
grow's epoch was abandoned as a loss (this bench's third run)."""


def command(mode: str, quick: bool) -> list[str]:
    return ["env", "OMP_NUM_THREADS=1", f"MALLETRAIN_PEER_TIMEOUT_S={PEER_TIMEOUT_S:g}",
            sys.executable, "examples/train_sharded.py", "--mode",
            mode, "--steps", "0", "--log-every", "1", "--checkpoint-every-s", "3600",
            "--buddy-every", "5", *(SMALL if quick else HEADLINE)]


def model_params(quick: bool) -> int:
    """The example's parameter count at the bench's configuration (built on the meta device)."""
    import importlib.util

    import torch

    spec = importlib.util.spec_from_file_location("train_sharded_bench",
                                                  REPO / "examples" / "train_sharded.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    a = mod.parse_args(SMALL if quick else HEADLINE)
    with torch.device("meta"):
        model = mod.TinyLM(a.vocab, a.dim, a.layers, a.heads, a.seq)
    return int(sum(p.numel() for p in model.parameters()))


def newest_node(cluster: LocalCluster, job: str) -> str:
    """The node of the job's running task that started last (the highest array index); the
    daemon keeps the first surviving member first, so after a shrink and a grow it can be the
    node hosting the epoch's master and store."""
    out = cluster.run(["squeue", "-h", "-r", "-j", job, "-t", "R", "-o", "%K %N"]).stdout
    return max((int(i), node) for i, node in (line.split() for line in out.splitlines()))[1]


def wait_world(cluster: LocalCluster, outdir: Path, job: str, nodes: int, nproc: int,
               after: int, timeout_s: float) -> int:
    """The first epoch after ``after`` in which all ``nodes × nproc`` ranks printed 2 steps,
    once the batch system runs ``nodes`` of the job's tasks."""
    found: list[int] = []

    def ok() -> bool:
        log = sharded_log(outdir, job)
        hits = [e for e in sorted(log.steps) if e > after and log.trained(e, nodes * nproc)]
        if hits and len(_running(cluster, job)) == nodes:
            found.append(hits[0])
            return True
        return False

    wait_until(f"job {job} training on {nodes} nodes after epoch {after}", ok, timeout_s, 1.0,
               detail=lambda: f"latest: {sharded_log(outdir, job).latest()}")
    return found[0]


def run_phase(cluster: LocalCluster, daemon: LocalDaemon, work: Path, mode: str,
              inplace: bool, rounds: int, quick: bool) -> dict[str, Any]:
    """One mode on one path: the job, ``rounds`` rounds of changes, its figures."""
    nproc, path = MODES[mode], "inplace" if inplace else "restart"
    t0 = time.monotonic()
    outdir = work / f"out-{mode}-{path}"
    outdir.mkdir()
    outdir.chmod(0o777)
    script = daemon.training_script(command(mode, quick), outdir, inplace=inplace,
                                    nproc_per_node=nproc)
    job = cluster.sbatch("--qos=malletrain", f"-N1-{IDLE}", "--comment=profile=no",
                         "--open-mode=append", "-o", f"{outdir}/task-%A_%a.out", script=script)
    ckpt = outdir / f"ckpt-{job}"
    changes: list[Change] = []
    others: list[str] = []
    error = None
    epoch = -1

    def change(kind: str, nodes: int, act: Any) -> None:
        nonlocal epoch
        before = folder_files(ckpt)
        act()
        t = time.time()
        nxt = wait_world(cluster, outdir, job, nodes, nproc, epoch, 300)
        changes.append(Change(kind, epoch, nxt, t, before, folder_files(ckpt)))
        say(f"{mode} {path}: {kind} → {nodes} nodes (epoch {epoch} → {nxt})")
        epoch = nxt

    def submit(*args: str, script: str | None = None) -> None:
        others.append(cluster.sbatch("-o", "/dev/null", *args, script=script))

    def cancel() -> None:
        other = others.pop()
        cluster.run(["scancel", other])
        wait_until(f"job {other} gone", lambda: _gone(cluster, other), 60, 0.1)

    try:
        epoch = wait_world(cluster, outdir, job, IDLE, nproc, -1, 900)
        say(f"{mode} {path}: training on {IDLE} nodes (epoch {epoch})")
        for _ in range(rounds):
            change("shrink", IDLE - 1, lambda: submit(
                "--qos=malletrain", "-N", "1-1", "--comment=profile=no", "--chdir=/tmp",
                script=STANDIN))
            change("grow", IDLE, cancel)
        change("preempt", IDLE - 1, lambda: submit(
            "-p", "prod", "-N", "1", "-w", newest_node(cluster, job), "--wrap", "sleep 100000"))
        change("grow", IDLE, cancel)   # a grow after a loss (GROW_AFTER_LOSS)
    except Exception as exc:  # noqa: BLE001 - a failed phase is a row with its reason
        error = f"{type(exc).__name__}: {exc}"[:2000]
        say(f"{mode} {path}: failed: {error[:300]}")
    finally:
        for other in [*others, job]:
            cluster.run(["scancel", other], check=False)
        for other in [*others, job]:
            try:
                wait_until(f"job {other} gone", partial(_gone, cluster, other), 60, 0.5)
            except TimeoutError as exc:
                error = error or f"cleanup: {exc}"
    log = sharded_log(outdir, job)
    epochs = daemon_epoch_times(daemon.log_text(), job)
    out = summarize([figures(c, log, epochs) for c in changes])
    out.update(processes_per_node=nproc, job=job, seconds=round(time.monotonic() - t0, 1))
    if error:
        out["error"] = error
    return out


def measure(modes: list[str], rounds: int, quick: bool, restart: bool,
            work: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """Every mode in place, and on the restart path when ``restart``, on one cluster."""
    inplace: dict[str, Any] = {}
    restarted: dict[str, Any] = {}
    cluster = LocalCluster(root=work / "cluster", nodes=IDLE)
    try:
        cluster.start()
        os.environ["PATH"] = cluster.release.env(dict(os.environ))["PATH"]
        daemon = LocalDaemon(cluster, root=work / "malletraind", settings=SETTINGS)
        daemon.start()
        try:
            for mode in modes:
                say(f"{mode}: in place")
                inplace[mode] = run_phase(cluster, daemon, work, mode, True, rounds, quick)
                if restart:
                    say(f"{mode}: restart path")
                    restarted[mode] = run_phase(cluster, daemon, work, mode, False, rounds,
                                                quick)
        finally:
            daemon.stop()
    except Exception as exc:  # noqa: BLE001 - no cluster: every row says why
        why = f"cluster: {type(exc).__name__}: {exc}"[:2000]
        for mode in modes:
            inplace.setdefault(mode, {"error": why})
            if restart:
                restarted.setdefault(mode, {"error": why})
    finally:
        cluster.stop()
    return inplace, restarted


def run(modes: list[str], rounds: int, quick: bool, restart: bool, reference: bool,
        work: Path) -> dict[str, Any]:
    t0 = time.monotonic()
    refs = {}
    for mode in modes:
        if reference:
            say(f"{mode}: the reference (in place against save-and-restart, no Slurm)")
            ref = sharded_reference.check(work, mode, MODES[mode])
            say(f"{mode}: matches_reference {ref['matches']} ({ref.get('steps_compared')} "
                f"steps compared{', ' + ref['error'][:200] if 'error' in ref else ''})")
        else:
            ref = {"matches": None, "error": "not run (--no-reference)"}
        refs[mode] = ref
    inplace, restarted = measure(modes, rounds, quick, restart, work)
    for mode in modes:
        inplace[mode]["matches_reference"] = refs[mode]["matches"]
        inplace[mode]["reference"] = refs[mode]
    top: dict[str, Any] = {**fastest_restart(restarted), **restarted}
    return {
        "model_params": model_params(quick), "modes": inplace, "restart": top,
        "done_when": {m: done_when(inplace[m], restarted.get(m, top)) for m in modes},
        "meta": {"rounds": rounds, "quick": quick, "host": machine(), "note": GROW_AFTER_LOSS,
                 "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                 "seconds": round(time.monotonic() - t0, 1)}}


def machine() -> str:
    slurm = subprocess.run(["slurmctld", "-V"], capture_output=True, text=True,
                           check=False).stdout.strip()
    return host(slurm)


def _s(x: Any) -> str:
    return f"{x:.2f} s" if isinstance(x, (int, float)) else "—"


def section(results: dict[str, Any], command_line: str) -> str:
    meta, restart = results["meta"], results["restart"]
    rows = ["| mode | path | grow | planned shrink | preemption | steps lost | bytes to disk "
            "| peak extra / shard | matches reference |", "|---|---|---|---|---|---|---|---|---|"]
    for mode, r in results["modes"].items():
        ref = r.get("reference", {})
        rows.append(f"| {mode} | in place | {_s(r.get('grow_s'))} | {_s(r.get('shrink_s'))} | "
                    f"{_s(r.get('preempt_s'))} | {r.get('steps_lost', '—')} | "
                    f"{r.get('disk_bytes', '—')} | {r.get('peak_extra_ratio') or '—'} | "
                    f"{ref.get('matches')} ({ref.get('steps_compared', 0)} steps) |")
        if mode in restart:
            x = restart[mode]
            rows.append(f"| {mode} | restart | {_s(x.get('grow_s'))} | "
                        f"{_s(x.get('shrink_s'))} | {_s(x.get('preempt_s'))} | "
                        f"{x.get('steps_lost', '—')} | {x.get('disk_bytes', '—')} | | |")
    checks = []
    for mode, d in results["done_when"].items():
        ratios = ", ".join(f"{k} {d.get(f'{k}_ratio', '—')}×" for k in KINDS)
        failed = [k for k, v in d.items() if v is not True and k != "all"
                  and not k.endswith("_ratio")]
        checks.append(f"* {mode}: done-when {'met' if d['all'] else 'NOT met'} (restart ÷ in "
                      f"place: {ratios}; failed: {', '.join(failed) or 'none'})")
        errors = [f"{p}: {x['error'][:300]}" for p, x in
                  (("in place", results["modes"][mode]), ("restart", restart.get(mode, {})))
                  if x.get("error")]
        checks += [f"  * error, {e}" for e in errors]
        left = results["modes"][mode].get("from_disk") or []
        if left:
            checks.append(f"  * in place, changes that read the checkpoint instead (a failure "
                          f"on the in-place path, the daemon then took the disk path): "
                          f"{', '.join(left)}")
    return "\n".join([
        BEGIN, f"Measured {meta['date']} by `{command_line}` on {meta['host']}, in "
        f"{meta['seconds']:.0f} s: examples/train_sharded.py at {results['model_params']:,} "
        f"parameters, {meta['rounds']} round(s) per mode and path of planned shrink 3→2 and grow "
        "2→3, then one preemption 3→2 and a grow back 2→3 (medians; definitions in bench/sharded.py's docstring: a "
        "pause runs from the change's order to the first step at the new world; peak extra "
        "memory is the exchange's buffers over a rank's shard, as the hand-over records it).",
        "", *rows, "", *checks, *([f"* Note: {meta['note']}."] if meta.get("note") else []),
        "", END])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", action="append", choices=sorted(MODES),
                   help="repeat for several (default: hsdp and fsdp)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--quick", action="store_true",
                   help="the tests' small model and one round: a smoke run")
    p.add_argument("--no-restart", action="store_true", help="skip the restart path")
    p.add_argument("--no-reference", action="store_true", help="skip matches_reference")
    p.add_argument("--json", action="store_true", help="print the results as one JSON line")
    p.add_argument("--markdown", metavar="FILE", help="rewrite this section of that file")
    p.add_argument("--workdir", metavar="DIR",
                   help="a new folder to run in, kept afterwards (default: a temporary one)")
    p.add_argument("--from", dest="source", metavar="FILE",
                   help="the JSON line of an earlier run (its last line) instead of running")
    args = p.parse_args(argv)
    modes = args.mode or list(MODES)
    rounds = 1 if args.quick else args.rounds
    command_line = " ".join(["python -m bench.sharded --json", *(f"--mode {m}" for m in
                                                                 args.mode or []),
                             *(["--quick"] if args.quick else [f"--rounds {rounds}"]),
                             *(["--no-restart"] if args.no_restart else []),
                             *(["--no-reference"] if args.no_reference else [])])
    if args.source:
        results = json.loads(Path(args.source).read_text().strip().splitlines()[-1])
        command_line = results["meta"].get("command", command_line)
        results["done_when"] = {m: done_when(x, results["restart"].get(m, results["restart"]))
                                for m, x in results["modes"].items()}
    elif args.workdir:  # kept: the outputs and the daemon's log, to see what happened
        work = Path(args.workdir)
        work.mkdir(parents=True)
        work.chmod(0o755)
        results = run(modes, rounds, args.quick, not args.no_restart, not args.no_reference,
                      work)
        results["meta"]["command"] = command_line
    else:
        with tempfile.TemporaryDirectory(prefix="malletrain-sharded-") as tmp:
            work = Path(tmp)
            work.chmod(0o755)
            results = run(modes, rounds, args.quick, not args.no_restart,
                          not args.no_reference, work)
        results["meta"]["command"] = command_line
    if args.markdown:
        replace_section(Path(args.markdown), BEGIN, END, section(results, command_line),
                        "Sharded models: in place against the restart path")
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
