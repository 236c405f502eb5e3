"""The MalleTrain demo: elastic training on the idle nodes of a real local Slurm cluster.

It starts a 16-node local Slurm cluster and ``malletraind``, replays onto the ``prod``
partition a main-queue workload whose idle gaps follow the Summit trace's fragment lengths
(time-compressed, see :mod:`devtools.demo.workload`; big jobs wait and leave planned
holes), and keeps a stream of elastic jobs in the queue, each training a random NAS-Bench-101
cell. By default (``--compute standin``) the accelerator's compute of each step is STOOD IN by
a timed wait (``examples/nas_standin.sbatch``: a small real cell whose gradients are
all-reduced over gloo, rescaling in place), so that every idle virtual node can hold a worker
on a host with few cores; ``--compute cpu`` trains the cells for real on the host's cores
(``examples/nas.sbatch``, at most ``--elastic-jobs`` × ``--max-nodes`` workers). The harvested
node-seconds count only time inside training steps the workers completed (their step logs).
While it runs it shows the cluster as
Slurm sees it every ~2 s; at the end it prints a summary computed from Slurm's records and the
workers' counters, saves it as ``summary.json`` and draws ``timeline.png`` in ``--out``.

    python3 scripts/demo.py [--out demo-output] [--duration-s 150] [--nodes 16] [--seed 0]
                            [--compute standin|cpu] [--json]

Everything it starts (cluster, daemon, training workers) is stopped at the end, also on
Ctrl-C or failure. Exit status 0 on success, 1 with one line saying what went wrong.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn, TextIO

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from devtools.demo import live, summary, timeline, workload  # noqa: E402
from devtools.localcluster import LocalCluster  # noqa: E402
from devtools.localcluster.daemon import LocalDaemon  # noqa: E402
from malletrain_core.errors import CommandError, MalleTrainError  # noqa: E402
from malletrain_core.runner import CommandRunner  # noqa: E402

SAMPLE_EVERY_S = 2.0
DAEMON_SETTINGS: dict[str, dict[str, dict[str, Any]]] = {
    "cpu": {"allocator": {"lookahead_s": 60.0},
            "profiler": {"window_s": 6.0, "default_scale_up_s": 8.0,
                         "default_scale_down_s": 4.0}},
    # Stood-in compute scales linearly by construction: no profiling run (one probe window
    # at the first scale, linear from there); in-place rescaling costs about a second. The
    # speedup objective values every job's node alike, so measurement noise between the
    # jobs' probes does not trade nodes between them (each trade restarts a task).
    "standin": {"allocator": {"lookahead_s": 60.0, "objective": "speedup"},
                "profiler": {"enabled": False, "window_s": 6.0, "default_scale_up_s": 2.0,
                             "default_scale_down_s": 1.0}},
}
BEGIN, END = "<!-- demo:begin -->", "<!-- demo:end -->"
NAS_SBATCH = {"cpu": REPO / "examples" / "nas.sbatch",
              "standin": REPO / "examples" / "nas_standin.sbatch"}
COMPUTE_NOTE = {
    "standin": "compute STOOD IN: each training step's accelerator compute is a timed wait "
               "(--compute-s); the gradients of a small real NAS cell are all-reduced over gloo "
               "between the job's nodes",
    "cpu": "compute real: NAS cells trained with torch on the host's CPU cores"}
MODE_DEFAULTS = {"standin": {"elastic_jobs": 4, "max_nodes": 16, "steps": 0},
                 "cpu": {"elastic_jobs": 3, "max_nodes": 2, "steps": 80}}


class DemoError(MalleTrainError):
    """The demo could not run or produced nothing to summarise."""


class Demo:
    """One run of the demo (see the module doc); :meth:`run` returns the summary."""

    def __init__(self, args: argparse.Namespace, log: TextIO) -> None:
        self.args = args
        self.out = Path(args.out).resolve()
        self.jobs_dir = self.out / "jobs"
        self.work = Path(tempfile.mkdtemp(prefix="mt-demo-"))  # short: socket paths
        self.cluster = LocalCluster(nodes=args.nodes, root=self.work / "cluster")
        self.daemon = LocalDaemon(self.cluster, root=self.work / "daemon",
                                  settings=DAEMON_SETTINGS[args.compute])
        self.view = live.LiveView(self.cluster.node_names, out=log)
        self.log = log
        self.samples: list[summary.Sample] = []
        self.prod_ids: dict[str, str] = {}
        self.elastic: dict[str, int] = {}  # job id → cell seed
        self.missing: dict[str, int] = {}
        self.failures = 0  # commands that failed during the replay (skipped)
        self.next_seed = args.seed * 1000
        self.plan = workload.Workload((), {}, args.duration_s, args.compress)

    # ------------------------------------------------------------------ commands
    def sbatch(self, args: list[str], env: dict[str, str] | None = None) -> str:
        runner = CommandRunner(timeout_s=60.0, env={**self.cluster.env, **(env or {})})
        return runner.run(["sbatch", "--parsable", *args]).stdout.strip().split(";", 1)[0]

    def submit_elastic(self) -> str:
        seed = self.next_seed
        self.next_seed += 1
        run = f"{sys.executable} -m malletrain_core.worker.launcher --poll-s 1"
        if self.args.compute == "standin":
            run = f"{sys.executable} -m malletrain_core.worker.launcher --poll-s 0.5 --inplace"
        env = {**self.daemon.job_env, "PYTHON": sys.executable, "CELL_SEED": str(seed),
               "MALLETRAIN_EXAMPLES": str(REPO / "examples"), "PYTHONPATH": str(REPO),
               "STEPS": str(self.args.steps), "CHECKPOINT_EVERY_S": "15",
               "COMPUTE_S": str(self.args.compute_s), "MALLETRAIN_RUN": run}
        job = self.sbatch(["--qos=malletrain", "-N", f"1-{self.args.max_nodes}",
                           "-J", f"nas-{seed}", "-D", str(self.jobs_dir),
                           str(NAS_SBATCH[self.args.compute])], env)
        self.elastic[job] = seed
        return job

    def sample(self) -> summary.Sample:
        run = self.cluster.run
        sq = run(["squeue", "-h", "-a", "-o", summary.SQUEUE_FORMAT], timeout_s=30).stdout
        si = run(["sinfo", "-h", "-N", "-p", "prod", "-o", summary.SINFO_FORMAT],
                 timeout_s=30).stdout
        return summary.Sample.parse(time.time(), sq, si)

    # ------------------------------------------------------------------ phases
    def start(self) -> None:
        # A new cluster numbers its jobs from 1 again: an earlier run's checkpoints and
        # counters would be resumed and counted as this run's.
        for old in ("jobs", "logs"):
            shutil.rmtree(self.out / old, ignore_errors=True)
        for name in ("samples.jsonl", "summary.json", "timeline.png", "slurm_jobs.txt",
                     "failure.txt"):
            (self.out / name).unlink(missing_ok=True)
        self.jobs_dir.mkdir(parents=True, exist_ok=True)
        self.view.message(f"starting a {self.args.nodes}-node local Slurm cluster ...")
        t = time.monotonic()
        self.cluster.start(timeout_s=180.0)
        self.view.message(f"  cluster ready in {time.monotonic() - t:.1f} s; starting "
                          "malletraind")
        waited = self.daemon.start(timeout_s=90.0)
        self.view.message(f"  malletraind listening after {waited:.1f} s "
                          f"(API 127.0.0.1:{self.daemon.port})")

    def warm_up(self, plan: workload.Workload) -> list[workload.ProdJob]:
        """Submit the prod jobs running when the workload begins and wait until they run
        (so the first sample does not count the empty cluster as idle); the rest is returned."""
        first = [j for j in plan.jobs if j.submit_s <= 0]
        for job in first:
            self.prod_ids[job.name] = self.sbatch(job.sbatch_args())
        ids = ",".join(self.prod_ids.values())
        self.cluster.wait_for("the first prod jobs running", lambda: not self.cluster.run(
            ["squeue", "-h", "-t", "PD", "-j", ids, "-o", "%i"]).stdout.strip(), 60.0, 0.2)
        return [j for j in plan.jobs if j.submit_s > 0]

    def replay(self, plan: workload.Workload, pending: list[workload.ProdJob]) -> None:
        t0 = time.monotonic()
        next_sample = 0.0
        rescales = preemptions = 0
        with open(self.out / "samples.jsonl", "w") as fh:
            while True:
                now = time.monotonic() - t0
                if now > plan.horizon_s + 60.0:  # samples kept failing at the end: stop anyway
                    return
                while pending and pending[0].submit_s <= now:
                    job = pending.pop(0)
                    try:
                        self.prod_ids[job.name] = self.sbatch(job.sbatch_args())
                    except CommandError as exc:  # one lost job must not end the demo
                        self.failures += 1
                        self.view.message(f"[{now:6.1f}s] {job.name} not submitted: "
                                          f"{str(exc).splitlines()[0]}")
                        continue
                    if job.kind == "big":
                        self.view.message(f"[{now:6.1f}s] big prod job {job.name} on "
                                          f"{len(job.nodes)} nodes submitted; starts when its "
                                          f"nodes are released (planned at {job.start_s:.0f}s)")
                if now >= next_sample:
                    try:
                        sample = self.sample()
                    except CommandError as exc:  # a slow squeue: skip this sample
                        self.failures += 1
                        self.view.message(f"[{now:6.1f}s] no sample: "
                                          f"{str(exc).splitlines()[0]}")
                        next_sample += SAMPLE_EVERY_S
                        continue
                    fh.write(json.dumps(sample.to_json()) + "\n")
                    fh.flush()
                    if self.samples:
                        r, p = summary.scale_changes([self.samples[-1], sample])
                        rescales, preemptions = rescales + r, preemptions + p
                    self.samples.append(sample)
                    self.keep_stream(sample, plan.horizon_s - now)
                    self.view.show(now, sample, rescales, preemptions)
                    next_sample += SAMPLE_EVERY_S
                    if now >= plan.horizon_s:
                        return
                time.sleep(max(0.05, min(next_sample - (time.monotonic() - t0),
                                         (pending[0].submit_s - now) if pending else 1.0,
                                         0.5)))

    def keep_stream(self, sample: summary.Sample, left_s: float) -> None:
        """Replace elastic jobs that finished (gone from squeue twice in a row)."""
        for job in list(self.elastic):
            if job in sample.jobs:
                self.missing.pop(job, None)
                continue
            self.missing[job] = self.missing.get(job, 0) + 1
            if self.missing[job] >= 2:
                del self.elastic[job]
                if left_s > 30:
                    try:
                        new = self.submit_elastic()
                    except CommandError as exc:
                        self.failures += 1
                        new = f"none ({str(exc).splitlines()[0]})"
                    self.view.message(f"elastic job {job} finished; submitted {new}")

    def collect(self) -> dict[str, Any]:
        records = self.cluster.run(["scontrol", "-o", "show", "job"], timeout_s=60).stdout
        (self.out / "slurm_jobs.txt").write_text(records)
        log_text = ""
        ctld = self.cluster.run_dir / "log" / "slurmctld.log"
        if ctld.is_file():
            log_text = ctld.read_text(errors="replace")
        counters = summary.read_counters(sorted(self.jobs_dir.glob("checkpoints-*/"
                                                                   "counters.json")))
        steps_read_at = time.time()
        steps = summary.read_step_logs(sorted(self.jobs_dir.glob("checkpoints-*/steps/*.log")),
                                       until=steps_read_at)
        result = summary.summarize(self.samples, summary.prod_records(records), counters,
                                   self.args.nodes,
                                   summary.count_preemptions_in_log(log_text) if log_text
                                   else None, cap_per_job=self.args.max_nodes, steps=steps,
                                   prod_busy=summary.prod_busy_from_log(log_text),
                                   node_names=self.cluster.node_names, prod_log=log_text)
        result["startups"] = summary.startup_summary(summary.read_startups(
            sorted(self.jobs_dir.glob("nas-*.out"))))
        plan = self.plan
        result.update({"compute": self.args.compute, "steps_read_at": round(steps_read_at, 3),
                       "compute_note": COMPUTE_NOTE[self.args.compute],
                       **({"compute_s": self.args.compute_s}
                          if self.args.compute == "standin" else {}),
                       "elastic_jobs": self.args.elastic_jobs, "max_nodes": self.args.max_nodes,
                       "seed": self.args.seed, "compress": self.args.compress,
                       "prod_jobs_planned": len(plan.jobs),
                       "commands_failed": self.failures,
                       "big_jobs_planned": sum(j.kind == "big" for j in plan.jobs),
                       "source": "slurmctld.log (prod jobs' start and end), squeue/sinfo "
                                 "every 2 s, scontrol show job, workers' step logs and "
                                 "counters.json"})
        return result

    def save_logs(self) -> None:
        if not self.out.is_dir():  # failed before anything ran
            return
        logs = self.out / "logs"
        logs.mkdir(exist_ok=True)
        for src in (self.daemon.log_path, self.cluster.run_dir / "log" / "slurmctld.log"):
            if src.is_file():
                shutil.copy(src, logs / src.name)

    def stop(self) -> None:
        for step in (self.save_logs, self.daemon.stop, self.cluster.stop):
            try:
                step()
            except Exception as exc:  # keep cleaning up: each step stops different things
                print(f"demo: cleanup: {exc}".splitlines()[0], file=sys.stderr)
        if not self.args.keep:
            shutil.rmtree(self.work, ignore_errors=True)

    def run(self) -> dict[str, Any]:
        load_start = _load()
        plan = self.plan = workload.plan(self.cluster.node_names, self.args.duration_s,
                                         seed=self.args.seed, compress=self.args.compress)
        (self.out).mkdir(parents=True, exist_ok=True)
        (self.out / "workload.json").write_text(json.dumps(
            {"compress": plan.compress, "horizon_s": plan.horizon_s,
             "jobs": [{"name": j.name, "kind": j.kind, "nodes": list(j.nodes),
                       "submit_s": j.submit_s, "start_s": j.start_s, "run_s": j.run_s}
                      for j in plan.jobs]}, indent=1) + "\n")
        gaps = plan.all_gaps()
        self.view.message(
            f"workload: {len(plan.jobs)} prod jobs ({sum(j.kind == 'big' for j in plan.jobs)} "
            f"big) over {plan.horizon_s:.0f} s; idle gaps from the Summit fragments, 1 trace "
            f"hour = {3600 / plan.compress:.0f} s (median gap {float(_median(gaps)):.1f} s)")
        self.view.message(f"{self.args.compute.upper()} MODE: {COMPUTE_NOTE[self.args.compute]}")
        self.start()
        rest = self.warm_up(plan)
        for _ in range(self.args.elastic_jobs):
            self.submit_elastic()
        self.view.message(f"elastic jobs {', '.join(self.elastic)} submitted (sbatch "
                          f"--qos=malletrain -N 1-{self.args.max_nodes} "
                          f"examples/{NAS_SBATCH[self.args.compute].name})")
        self.replay(plan, rest)
        result = self.collect()
        result["load_1min"] = {"start": load_start, "end": _load()}
        (self.out / "summary.json").write_text(json.dumps(result, indent=2) + "\n")
        timeline.draw(self.samples, self.args.nodes, self.out / "timeline.png",
                      title=f"MalleTrain demo: {self.args.nodes} nodes, seed {self.args.seed}")
        if result["harvested_node_seconds"] <= 0:
            raise DemoError("no elastic task ever ran on an idle node; see "
                            f"{self.out / 'logs' / 'daemon.log'}")
        return result


def _load() -> float | None:
    """The 1-min load average (None where the system has none)."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def write_markdown(path: Path, body: str, wall_s: float,
                   load: tuple[float | None, float | None] = (None, None)) -> None:
    """Replace the text between the demo markers of ``path`` (appended when missing)."""
    cores = os.cpu_count() or "?"
    seen = "" if None in load else f"; 1-min load {load[0]:g} at the start, {load[1]:g} at the end"
    section = (f"{BEGIN}\n{body}\n\nMeasured once on the development machine ({cores} CPU "
               f"cores{seen}); the whole demo took {wall_s:.0f} s.\n{END}")
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        text = head + section + rest.split(END, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n## Demo: elastic training on a local Slurm cluster\n\n" \
            + section + "\n"
    path.write_text(text)


def _median(values: Any) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2] if ordered else 0.0


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(1, f"demo: error: {message} (see --help)\n")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = _Parser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="demo-output", help="folder of the results")
    p.add_argument("--duration-s", type=float, default=150.0, help="workload length")
    p.add_argument("--nodes", type=int, default=16, help="virtual nodes of the cluster")
    p.add_argument("--seed", type=int, default=0, help="workload and cell seed")
    p.add_argument("--compress", type=float, default=workload.DEFAULT_COMPRESS,
                   help="trace seconds per demo second")
    p.add_argument("--compute", choices=("standin", "cpu"), default="standin",
                   help="standin (default): each step's accelerator compute is a timed wait, "
                   "real gloo all-reduces of a small real model, every idle node can hold a "
                   "worker; cpu: real NAS-cell training on the host's cores, few workers")
    p.add_argument("--compute-s", type=float, default=0.4,
                   help="standin: seconds of stood-in compute per step")
    p.add_argument("--elastic-jobs", type=int, help="elastic jobs kept queued "
                   "(default: 4 standin, 3 cpu)")
    p.add_argument("--max-nodes", type=int, help="nodes per elastic job at most "
                   "(default: 16 standin, 2 cpu)")
    p.add_argument("--steps", type=int, help="steps each elastic job trains, 0: until the "
                   "demo ends (default: 0 standin, 80 cpu)")
    p.add_argument("--json", action="store_true", help="print only the summary JSON")
    p.add_argument("--keep", action="store_true", help="keep the cluster's run folder")
    p.add_argument("--markdown", metavar="FILE", type=Path,
                   help="rewrite the demo section of FILE (e.g. BENCHMARKS.md)")
    args = p.parse_args(argv)
    for name, value in MODE_DEFAULTS[args.compute].items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.compute_s < 0 or args.steps < 0:
        p.error("give --compute-s ≥ 0 and --steps ≥ 0")
    if args.nodes < 4 or args.duration_s < 20 or args.elastic_jobs < 1 or args.max_nodes < 1:
        p.error("give --nodes ≥ 4, --duration-s ≥ 20, --elastic-jobs ≥ 1 and --max-nodes ≥ 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if os.geteuid() != 0:
        print("demo: error: run as root (the local cluster runs slurmd/slurmctld as root)",
              file=sys.stderr)
        return 1

    def _terminate(signum: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _terminate)
    log = sys.stderr if args.json else sys.stdout
    t0 = time.monotonic()
    demo: Demo | None = None
    try:
        demo = Demo(args, log)
        result = demo.run()
    except KeyboardInterrupt:
        print("demo: interrupted; everything it started is being stopped", file=sys.stderr)
        return 1
    except (MalleTrainError, OSError, ValueError) as exc:
        text = str(exc)
        if demo is not None and "\n" in text:
            (demo.out / "failure.txt").write_text(text + "\n")
            text = text.splitlines()[0] + f" (details in {demo.out / 'failure.txt'})"
        print(f"demo: error: {text}", file=sys.stderr)
        return 1
    finally:
        if demo is not None:
            demo.stop()
    wall_s = time.monotonic() - t0
    if args.markdown:
        command = "bash scripts/demo.sh" + ("" if args.seed == 0 else f" --seed {args.seed}") \
            + ("" if args.duration_s == 150 else f" --duration-s {args.duration_s:g}") \
            + ("" if args.compute == "standin" else f" --compute {args.compute}")
        write_markdown(args.markdown, summary.markdown(result, command), wall_s,
                       (result["load_1min"]["start"], result["load_1min"]["end"]))
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print("\n" + summary.format_summary(result))
        print(f"{args.compute.upper()} MODE: {COMPUTE_NOTE[args.compute]}")
        print(f"\nsaved {demo.out / 'summary.json'} and {demo.out / 'timeline.png'} "
              f"(whole demo {wall_s:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
