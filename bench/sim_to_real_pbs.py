"""The real half of ``bench/sim_to_real.py --batch-system pbs``: the demo's workload on the local
OpenPBS complex, measured from the server's own accounting log and the workers' files.

A complex of :data:`MOMS` moms (network namespaces, test timings: queue kill_delay 2 s), with
MalleTrain's queues and hooks (``pbs_hooks/install.sh``) and one ``malletraind`` in the server's
namespace with the demo's stood-in settings (speedup objective, 60-s look-ahead, curves not
profiled). The prod jobs of :func:`devtools.demo.workload.plan` (gaps from the Summit fragments)
go to the ``prod`` queue pinned to their vnodes (``select=1:ncpus=2:host=n01+…``,
``place=scatter``), each submitted at its planned time; :data:`ELASTIC_JOBS` elastic jobs
(``qsub -q malletrain -J 1-8``) run ``examples/standin_nas.py`` under ``malletrain-run
--inplace``, as the Slurm demo's do. At the end the server's ``server_priv/accounting/YYYYMMDD``
is copied out, and the figures :func:`bench.sim_to_real.predict` compares are read:

* idle node-seconds: the prod queue's runs in that log (whole seconds), over the window; the
  replay reads the same records, so this row agrees by construction (Slurm's section takes it
  from slurmctld's log, to the millisecond, instead);
* harvested node-seconds: idle seconds inside the workers' completed steps (their step logs);
* samples: kept and rolled back, from the step logs (the training state's counters as a
  check); held node-seconds, task starts and preemptions
  (requeued subjobs): the elastic subjobs' records of the same log;
* grant delays: a vnode's prod run ended → an elastic subjob started there, under 30 s (whole
  seconds: the log's resolution).
"""

from __future__ import annotations

import json
import shlex
import shutil
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

from bench.sections import host, say  # noqa: E402
from bench.sim_to_real_costs import censored_starts, step_gaps, step_samples, step_stats  # noqa: E402
from devtools.demo import summary, workload  # noqa: E402
from devtools.localcluster.pbs import PbsComplex  # noqa: E402
from malletrain_core.sim.accounting import JobRun, read_accounting  # noqa: E402

MOMS = 8
ELASTIC_JOBS = 2
MAX_NODES = 8
COMPUTE_S = 0.4
CHECKPOINT_EVERY_S = 15.0
PROD_QUEUE, WORKER_QUEUE = "prod", "mt_preemptable"
GRANT_WITHIN_S = 30.0
DAEMON_TOML = ("[allocator]\nlookahead_s = 60.0\nobjective = \"speedup\"\n"
               "[profiler]\nenabled = false\nwindow_s = 6.0\ndefault_scale_up_s = 2.0\n"
               "default_scale_down_s = 1.0\n")
"""The Slurm demo's stood-in settings (scripts/demo.py, DAEMON_SETTINGS["standin"])."""


def prod_args(job: workload.ProdJob) -> list[str]:
    """qsub arguments of a planned prod job: pinned to its vnodes, a walltime above its run."""
    select = "+".join(f"1:ncpus=2:host={n}" for n in job.nodes)
    return ["-q", PROD_QUEUE, "-N", job.name[:15], "-l", f"select={select}",
            "-l", "place=scatter", "-l", f"walltime=00:{job.time_limit_min:02d}:00",
            "-o", "/dev/null", "-e", "/dev/null"]


def elastic_script(jobs_dir: Path, seed: int) -> str:
    """One worker: the launcher in place around the stood-in NAS cell; its output, step log
    (named after the vnode) and the job's checkpoints under ``jobs_dir``."""
    py = sys.executable
    launcher = shlex.join([py, "-m", "malletrain_core.worker.launcher", "--poll-s", "0.5",
                           "--inplace"])
    train = shlex.join([py, str(REPO / "examples" / "standin_nas.py"), "--cell-seed", str(seed),
                        "--steps", "0", "--compute-s", str(COMPUTE_S),
                        "--checkpoint-every-s", f"{CHECKPOINT_EVERY_S:g}"])
    d = shlex.quote(str(jobs_dir))
    return (f"#!/bin/bash\ncd {shlex.quote(str(REPO))}\nexport PYTHONPATH={shlex.quote(str(REPO))}\n"
            'n=${PBS_ARRAY_ID%%[*}\n'
            'export PBS_NODENAME=$(head -n1 "$PBS_NODEFILE" | cut -d. -f1)\n'
            f'export MALLETRAIN_CHECKPOINT_DIR={d}/checkpoints-"$n"\n'
            f'exec >> {d}/nas-"$n"_"$PBS_ARRAY_INDEX".out 2>&1\n'
            f"exec {launcher} -- {train}\n")


def run_real_pbs(out: Path, duration_s: float, seed: int) -> dict[str, Any]:
    """Run the workload on a fresh complex; writes ``pbs_accounting`` and ``measured.json``
    into ``out`` and returns the measured figures."""
    from devtools.localcluster.pbs_helpers import complex_root, start_daemon

    jobs_dir = out / "jobs"
    shutil.rmtree(jobs_dir, ignore_errors=True)
    jobs_dir.mkdir(parents=True)
    jobs_dir.chmod(0o777)
    cx = PbsComplex(moms=MOMS, root=complex_root())
    say(f"starting a PBS complex of {MOMS} moms in {cx.root}")
    cx.start()
    daemon = None
    try:
        cx.install_malletrain(freq_s=3)
        cx.qmgr("set server acl_roots = root")  # torch here: a Python only root may execute
        daemon = start_daemon(cx, poll_s=2.0, in_server_ns=True, extra_toml=DAEMON_TOML)
        plan = workload.plan(cx.node_names, duration_s, seed=seed)
        first = [j for j in plan.jobs if j.submit_s <= 0]
        rest = [j for j in plan.jobs if j.submit_s > 0]
        ids = [cx.qsub(*prod_args(j), script=f"sleep {j.run_s:.1f}\n") for j in first]
        cx.wait_for("the first prod jobs running", lambda: all(
            v.get("job_state") == "R" for v in cx.jobs(*ids, subjobs=False).values()), 60, 0.2)
        for i in range(ELASTIC_JOBS):
            cx.qsub("-q", "malletrain", "-J", f"1-{MAX_NODES}", "-l", "select=1:ncpus=2",
                    "-o", "/dev/null", "-e", "/dev/null", "-v",
                    f"MALLETRAIN_PROFILE=0,MALLETRAIN_DAEMON={daemon.address}",
                    script=elastic_script(jobs_dir, seed * 1000 + i))
        t0 = time.time()
        say(f"workload: {len(plan.jobs)} prod jobs over {plan.horizon_s:.0f} s, "
            f"{ELASTIC_JOBS} elastic jobs of up to {MAX_NODES} nodes")
        failures = 0
        while True:
            now = time.time() - t0
            while rest and rest[0].submit_s <= now:
                job = rest.pop(0)
                try:
                    cx.qsub(*prod_args(job), script=f"sleep {job.run_s:.1f}\n")
                except Exception as exc:  # one lost job must not end the run
                    failures += 1
                    say(f"[{now:6.1f}s] {job.name} not submitted: {str(exc).splitlines()[0]}")
            if now >= plan.horizon_s:
                break
            time.sleep(max(0.05, min(0.5, (rest[0].submit_s - now) if rest else 0.5)))
        t1 = time.time()
        steps_read_at = time.time()
        time.sleep(2.0)  # the server writes the last records
        day = time.strftime("%Y%m%d", time.localtime(t0))
        logs = sorted((cx.root / "server" / "server_priv" / "accounting").glob("2*"))
        text = "".join(p.read_text(errors="replace") for p in logs
                       if p.name >= day)
        (out / "pbs_accounting").write_text(text)
    finally:
        if daemon is not None:
            daemon.stop()
        cx.stop()
        shutil.rmtree(cx.root, ignore_errors=True)
    result = measure(out, (t0, t1), list(cx.node_names), steps_read_at)
    result.update({"batch_system": "pbs", "accounting": "pbs_accounting", "seed": seed,
                   "elastic_jobs": ELASTIC_JOBS, "max_nodes": MAX_NODES,
                   "checkpoint_every_s": CHECKPOINT_EVERY_S, "compute_s": COMPUTE_S,
                   "prod_jobs_planned": len(plan.jobs), "commands_failed": failures,
                   "span_s": round(t1 - t0, 1),
                   "host": host("OpenPBS 23.06.06, 8 moms in network namespaces")})
    (out / "measured.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


def spans(runs: list[JobRun], queue: str, window: tuple[float, float]) -> dict[str, list[
        tuple[float, float]]]:
    """Per vnode, the spans the runs of ``queue`` held it (open runs: to the window's end)."""
    out: dict[str, list[tuple[float, float]]] = {}
    for r in runs:
        if r.partition != queue:
            continue
        end = window[1] if r.end is None else r.end
        for n in r.nodes:
            out.setdefault(n, []).append((r.start, end))
    return {n: sorted(s) for n, s in out.items()}


def measure(out: Path, window: tuple[float, float], node_names: list[str],
            steps_read_at: float) -> dict[str, Any]:
    """The measured figures of a saved run (see the module doc); a pure function of ``out``."""
    log = read_accounting(out / "pbs_accounting", warn=None)
    prod = spans(log.runs, PROD_QUEUE, window)
    workers = spans(log.runs, WORKER_QUEUE, window)
    paths = sorted(out.glob("jobs/checkpoints-*/steps/*.log"))
    steps = summary.read_step_logs(paths, until=steps_read_at)
    ends = [summary.Sample(t, frozenset(), {}) for t in window]
    idle, harvested = summary.exact_node_seconds(ends, node_names, prod, steps)
    held = sum(min(e, window[1]) - max(s, window[0]) for ss in workers.values()
               for s, e in ss if e > window[0] and s < window[1])
    starts = {n: [s for s, _ in ss] for n, ss in workers.items()}
    delays = []
    for n, ts in starts.items():
        for t in ts:
            before = [e for _, e in prod.get(n, []) if e <= t]
            if window[0] <= t <= window[1] and before and t - before[-1] < GRANT_WITHIN_S:
                delays.append(t - before[-1])
    stalls, handovers = step_gaps(steps, prod, starts, window)
    counters = summary.read_counters(sorted(out.glob("jobs/checkpoints-*/counters.json")))
    startups = summary.read_startups(sorted(out.glob("jobs/nas-*.out")))
    requeued = [r for r in log.runs if r.partition == WORKER_QUEUE and r.state == "RERUN"
                and window[0] <= (r.end or 0.0) <= window[1]]
    return {"window": list(window), "node_names": node_names,
            "idle_node_seconds": round(idle, 1), "harvested_node_seconds": round(harvested, 1),
            "harvested_share": round(harvested / idle, 4) if idle > 0 else 0.0,
            "samples": sum(int(c.get("samples", 0)) for c in counters.values()),
            "held_node_seconds": round(held, 1),
            "held_not_training_node_seconds": round(max(0.0, held - harvested), 1),
            "step_stats": step_stats(steps, *window), "steps_read_at": steps_read_at,
            "step_samples": step_samples(paths, window, until=steps_read_at),
            "grant_delays_s": [round(d, 3) for d in delays],
            "startups_s": [round(s["total"], 3) for s in startups],
            "elastic_task_starts": sum(window[0] <= t <= window[1]
                                       for ts in starts.values() for t in ts),
            "startups_censored_s": censored_starts(steps, prod, starts, window),
            "member_stalls_s": stalls, "handovers_s": handovers,
            "preemptions": len(requeued), "rescales": None,
            "idle_counted_from": "the PBS server's accounting log (prod queue, whole seconds)"}
