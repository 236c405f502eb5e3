"""A fault campaign on the in-place path: many faults at random moments of a churning run.

    python -m bench.campaign --json                          # 100 faults on local Slurm
    python -m bench.campaign --backend pbs --faults 20 --json  # on a local OpenPBS complex
    python -m bench.campaign --quick --json                  # one fault of each class
    python -m bench.campaign --backend both --write          # and rewrite BENCHMARKS.md

One local cluster (Slurm: 10 nodes, test timings; PBS: 8 moms), one malletraind, three (PBS:
two) elastic jobs that rescale in place (``malletrain-run --inplace``,
tests/workers/inplace_train.py, gloo, a checkpoint every 4 s into a 4 MB tmpfs of each job's
own), and prod jobs of 1-2 nodes submitted every 4-10 s (at most two at a time) that preempt
elastic tasks. Faults are injected one after the other, each at a random moment (0.5-4 s after
the last one recovered) into a job that is training, and tracked until the job trains again
(five consecutive global steps of one epoch after the fault was undone) or 150 s:

* ``daemon_kill``: SIGKILL malletraind, started again 1-5 s later on its state;
* ``launcher_kill``: SIGKILL one task's ``malletrain-run`` (its training process dies with it);
* ``train_kill``: SIGKILL one task's training process;
* ``slurmd_kill``: SIGKILL the slurmd of a node running one of the job's tasks, started again
  3-10 s later (its steps live on; the node is resumed if Slurm set it down);
* ``slurmctld_restart``: slurmctld stopped (SIGTERM, as a planned restart) and started 1-4 s
  later on its saved state;
* ``ckpt_full``: the job's checkpoint tmpfs filled to ENOSPC for 12 s, then emptied;
* ``sigstop``: one training process frozen with SIGSTOP for 30 s (longer than its 20 s
  collective timeout: a peer that hangs without dying), then SIGCONT.

Each row says: recovered, fault → training again (from the step lines), the steps rolled back
and samples lost against what the step lines say was trained, tasks lost (a task of a live job
that ended for good, or a job that ended without being cancelled: must be 0) and stalled nodes
(the daemon's "grant ... not running after" lines: a node granted whose task did not run by
the grant deadline: must be 0). A fault that cannot be injected is a row with its reason.
A fault slower than 5 s keeps its logs and says where its time went (``--evidence``,
bench/campaign_evidence.py). The last stdout line is the JSON; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shlex
import shutil
import signal
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

if __name__ == "__main__" and not __package__:  # started as a file; bench/ is a package
    sys.exit("run it as a module from the repository's root: python -m bench.campaign "
             + " ".join(sys.argv[1:]))
from bench.campaign_evidence import SLOW_S, keep  # noqa: E402
from bench.campaign_report import MARKERS, StepReader, recovery, section, summarize  # noqa: E402
from bench.campaign_rigs import BATCH, LAUNCHER, TRAINER, Churn, PbsRig, Rig, SlurmRig, pids_of  # noqa: E402
from bench.sections import host, replace_section, say  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
TIMEOUT_S = 150.0
TRIES = 3
"""Tries per fault slot: one that could not be injected is tried again on another pick."""
PROCESS_FAULTS = ("launcher_kill", "train_kill", "sigstop")
BY_DESIGN = {  # a PBS subjob whose launcher was killed is requeued by mt_epilogue now
    ("any", "sigstop/1"): "by design: at world 1 no peer watches the process; it trains again "
                          "once continued",
}


class NotInjected(Exception):
    """The fault could not be injected (no such process now, ...): a row with the reason."""


Undo = Callable[[], None]


def fill(folder: Path) -> Path:
    """Fill ``folder``'s file system to ENOSPC with one ballast file; returns its path."""
    ballast = folder / ".campaign-ballast"
    fd = os.open(ballast, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for size in (1 << 20, 4096, 1):
            with contextlib.suppress(OSError):
                while True:
                    os.write(fd, b"\0" * size)
    finally:
        os.close(fd)
    if os.statvfs(folder).f_bavail:
        raise NotInjected(f"{folder} still has free blocks after the ballast")
    return ballast


def one_process(rig: Rig, job: str, marker: str, rng: random.Random) -> tuple[str, int]:
    tasks = rig.running(job)
    if not tasks:
        raise NotInjected(f"job {job} has no running task")
    index = rng.choice(sorted(tasks))
    pids = pids_of(marker, rig.task_env(job, index), "" if marker == LAUNCHER else LAUNCHER)
    if not pids:
        raise NotInjected(f"no {marker} process of task {job}_{index} on {tasks[index]}")
    return f"task {job}_{index} on {tasks[index]}", min(pids)


def inject(rig: Rig, fault: str, job: str, rng: random.Random) -> tuple[str, float, Undo | None]:
    """Inject ``fault`` into ``job``: (what was hit, hold seconds, how to undo it)."""
    if fault == "daemon_kill":
        rig.kill_daemon()
        return "malletraind", rng.uniform(1, 5), rig.start_daemon
    if fault in ("launcher_kill", "train_kill", "sigstop"):
        target, pid = one_process(rig, job, LAUNCHER if fault == "launcher_kill" else TRAINER,
                                  rng)
        if fault != "sigstop":
            os.kill(pid, signal.SIGKILL)
            return f"{target}, pid {pid}", 0.0, None
        os.kill(pid, signal.SIGSTOP)

        def cont() -> None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        return f"{target}, pid {pid}", 30.0, cont
    if fault == "slurmd_kill" and isinstance(rig, SlurmRig):
        tasks = rig.running(job)
        if not tasks:
            raise NotInjected(f"job {job} has no running task")
        node = rng.choice(sorted(set(tasks.values())))
        pid = rig.kill_slurmd(node)
        return f"slurmd of {node}, pid {pid}", rng.uniform(3, 10), lambda: rig.start_slurmd(node)
    if fault == "slurmctld_restart" and isinstance(rig, SlurmRig):
        down = rng.uniform(1, 4)
        rig.restart_controller(down)
        return f"slurmctld, down {down:.1f} s", 0.0, None
    if fault == "ckpt_full":
        ballast = fill(rig.ckfs[job])
        return f"{rig.ckfs[job].name} (tmpfs)", 12.0, lambda: ballast.unlink(missing_ok=True)
    raise NotInjected(f"{fault} does not apply to {rig.name}")


class Campaign:
    """The faults of one run on one rig, one after the other."""

    def __init__(self, rig: Rig, faults: int, seed: int, quick: bool) -> None:
        self.rig, self.rng = rig, random.Random(seed)
        classes = list(rig.classes)
        order = classes if quick else [classes[i % len(classes)] for i in range(faults)]
        if not quick:
            self.rng.shuffle(order)
        self.order = order
        self.readers: dict[str, StepReader] = {}
        self.seen_lost: set[str] = set()
        self.log_offset = 0
        self.rows: list[dict[str, Any]] = []
        self.t0 = time.time()
        self.evidence: Path | None = None  # where a slow fault's logs go (campaign_evidence)

    def reader(self, job: str) -> StepReader:
        if job not in self.readers:
            self.readers[job] = StepReader(self.rig.outdir, job)
        return self.readers[job]

    def training(self, job: str, within_s: float = 5.0) -> bool:
        steps = self.reader(job).poll()
        return bool(steps) and steps[-1].t > time.time() - within_s

    def pick_job(self, fault: str, timeout_s: float = 90.0) -> str:
        """A job that is training; for a fault in one process, one with peers where there is
        such a job (at world 1 no peer can find a hung or dead process)."""
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            ready = sorted(j for j in self.rig.jobs if self.training(j))
            if ready and fault in PROCESS_FAULTS:
                ready = [j for j in ready if len(self.rig.running(j)) > 1] or ready
            if ready:
                return self.rng.choice(ready)
            self.check_jobs(None)
            time.sleep(1.0)
        raise NotInjected(f"no job trained in the last {timeout_s:g} s")

    def check_jobs(self, row: dict[str, Any] | None) -> None:
        """New lost tasks (confirmed 5 s later: a failed task is requeued at the daemon's next
        poll) and jobs that ended unasked (replaced, so that the campaign goes on)."""
        lost: list[str] = []
        for job in list(self.rig.jobs):
            if not self.rig.alive(job):
                lost.append(f"job {job} ended unasked")
                self.rig.replace_job(job)
                continue
            fresh = [x for x in self.rig.lost(job) if x not in self.seen_lost]
            if fresh:
                time.sleep(5)
                still = set(self.rig.lost(job))
                lost += [x for x in fresh if x in still]
        self.seen_lost.update(lost)
        log = self.rig.daemon_log()
        stalled = self.rig.stalled(log[self.log_offset:])
        self.log_offset = len(log)
        if row is not None:
            row["lost"] = lost
            row["tasks_lost"] = len(lost)
            row["stalled"] = stalled
            row["stalled_nodes"] = len(stalled)
        elif (lost or stalled) and self.rows:
            self._late(lost, stalled)

    def _late(self, lost: list[str], stalled: list[str]) -> None:
        last = self.rows[-1]
        last["lost"] = last.get("lost", []) + lost
        last["tasks_lost"] = len(last["lost"])
        last["stalled"] = last.get("stalled", []) + stalled
        last["stalled_nodes"] = len(last["stalled"])

    def one(self, n: int, fault: str) -> dict[str, Any]:
        row: dict[str, Any] = {"n": n, "backend": self.rig.name, "fault": fault,
                               "injected": False, "recovered": False, "to_training_s": None,
                               "steps_rolled_back": None, "samples_lost": None,
                               "samples_kept": None, "tasks_lost": 0, "stalled_nodes": 0,
                               "reason": ""}
        undo: Undo | None = None
        try:
            job = row["job"] = self.pick_job(fault)
            time.sleep(self.rng.uniform(0.5, 4.0))
            row["world"] = len(self.rig.running(job))
            t_fault = time.time()
            target, hold, undo = inject(self.rig, fault, job, self.rng)
            row.update(injected=True, target=target, t_s=round(t_fault - self.t0, 1),
                       hold_s=round(hold, 1))
            t_release = t_fault
            reader = self.reader(job)
            deadline = t_fault + hold + TIMEOUT_S
            while time.time() < deadline:
                if undo is not None and time.time() >= t_fault + hold:
                    u, undo = undo, None
                    u()
                    t_release = time.time()
                rec = recovery(reader.poll(), t_fault, t_release, BATCH)
                if rec["recovered"] and undo is None:
                    row.update(rec)
                    break
                if not self.rig.alive(job):
                    row["reason"] = f"job {job} ended"
                    break
                time.sleep(0.5)
            else:
                row["reason"] = (f"no 5 consecutive steps within {TIMEOUT_S:g} s of the fault "
                                 "being undone")
        except NotInjected as exc:
            row["reason"] = str(exc)
        except Exception as exc:  # a fault that breaks the harness is a row, not a crash
            row["reason"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        finally:
            if undo is not None:
                try:
                    undo()
                except Exception as exc:
                    row["reason"] += f"; undo failed: {exc}"
        try:
            self.check_jobs(row)
        except Exception as exc:
            row["reason"] += f"; checking the jobs failed: {exc}"
        took = row["to_training_s"]
        if self.evidence is not None and row["injected"] and (took is None or took > SLOW_S):
            try:
                row["where"] = keep(self.evidence / f"{n:03d}-{fault}", row,
                                    self.rig.daemon_log(),
                                    sorted(self.rig.outdir.glob(f"task-{row['job']}_*.out")),
                                    t_fault, None if took is None else t_fault + took, time.time())
            except OSError as exc:
                row["reason"] += f"; keeping its logs failed: {exc}"
        why = BY_DESIGN.get((self.rig.name, fault)) if row["tasks_lost"] else None
        if fault == "sigstop" and row.get("world") == 1:
            why = BY_DESIGN[("any", "sigstop/1")]
        if why:
            row["by_design"] = why
        return row

    def progress(self, row: dict[str, Any], slot: int) -> None:
        took = row["to_training_s"]
        say(f"{self.rig.name} #{slot}/{len(self.order)} {row['fault']} {row.get('target', '')}: "
            + ("recovered" if row["recovered"] else f"NOT recovered ({row['reason']})"
               if row["injected"] else f"not injected ({row['reason']})")
            + (f", training after {took:.1f} s, {row['samples_lost']} samples lost"
               if took is not None else "")
            + (f", tasks lost {row['lost']}" if row["tasks_lost"] else "")
            + (f", stalled {row['stalled']}" if row["stalled_nodes"] else "")
            + (f"; longest wait {row['where']['wait_s']} s, after \"{row['where']['after']}\""
               if row.get("where") else ""))

    def run(self) -> list[dict[str, Any]]:
        say(f"{self.rig.name}: waiting for the {len(self.rig.jobs)} jobs to train")
        deadline = time.time() + 300
        while time.time() < deadline and not all(self.training(j) for j in self.rig.jobs):
            time.sleep(1)
        n = 0
        for slot, fault in enumerate(self.order, 1):
            for _ in range(TRIES):  # a fault not injected (no process there yet) is tried
                n += 1              # again, on another pick: each slot is one fault injected
                row = self.one(n, fault)
                self.rows.append(row)
                self.progress(row, slot)
                if row["injected"]:
                    break
        return self.rows


def run_backend(name: str, faults: int, seed: int, quick: bool, keep: bool = False,
                evidence: Path | None = None) -> dict[str, Any]:
    if name == "slurm":
        rig: Rig = SlurmRig(nodes=6 if quick else 10, jobs=2 if quick else 3,
                            max_nodes=3 if quick else 4)
    else:
        rig = PbsRig(nodes=6 if quick else 8, jobs=2, max_nodes=3)
    t0 = time.monotonic()
    churn = Churn(rig, seed + 1)
    campaign: Campaign | None = None
    try:
        say(f"{name}: starting the cluster and the daemon in {rig.work}")
        rig.start()
        churn.start()
        campaign = Campaign(rig, faults, seed, quick)
        campaign.evidence = evidence / name if evidence is not None else None
        rows = campaign.run()
        churn.done.set()
        churn.join(30)
        time.sleep(3)
        campaign.check_jobs(None)  # what the last fault left behind
    finally:
        churn.done.set()
        load = os.getloadavg()[0]
        say(f"{name}: stopping the cluster")
        rig.stop()
        if not keep:  # the cluster, the daemon's state and the jobs' output
            shutil.rmtree(getattr(rig, "root", rig.work), ignore_errors=True)
    summary = summarize(rows)
    return {"backend": name, **{k: summary[k] for k in ("faults", "recovered", "tasks_lost",
                                                        "stalled_nodes", "not_injected",
                                                        "samples_lost")},
            "classes": summary["classes"], "prod_jobs": churn.submitted,
            "nodes": rig.nodes, "jobs": rig.njobs, "wall_s": round(time.monotonic() - t0),
            "load_1min": load, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", choices=("slurm", "pbs", "both"), default="slurm")
    p.add_argument("--pbs", action="store_true", help="the same as --backend pbs")
    p.add_argument("--faults", type=int, default=0,
                   help="faults per backend (default: 100 on Slurm, 20 on PBS)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--quick", action="store_true", help="one fault of each class, a smaller "
                   "cluster")
    p.add_argument("--json", action="store_true", help="print only the JSON (last line)")
    p.add_argument("--write", action="store_true", help="rewrite the campaign section(s) of "
                   "BENCHMARKS.md")
    p.add_argument("--keep", action="store_true", help="keep the cluster's folder (logs, the "
                   "jobs' output) after the run; it is said where on stderr")
    p.add_argument("--evidence", metavar="DIR", default=str(REPO / "build" / "campaign-evidence"),
                   help="where the logs of each fault slower than 5 s go ('': nowhere)")
    p.add_argument("--from-json", metavar="FILE", help="no run: the JSON of an earlier run")
    args = p.parse_args(argv)
    backends = ["pbs"] if args.pbs else ["slurm", "pbs"] if args.backend == "both" \
        else [args.backend]
    if args.faults < 0:
        p.error("--faults must be ≥ 1 (0: the default of each backend)")
    if args.from_json:
        result = json.loads(Path(args.from_json).read_text())
    else:
        niceness = os.nice(0)  # say how it ran, as it ran
        command = (f"nice -n {niceness} " if niceness else "") + "python -m bench.campaign " \
            + shlex.join(argv if argv is not None else sys.argv[1:])
        runs, stamp = {}, datetime.now().strftime("%Y%m%d-%H%M%S")
        for name in backends:
            r = run_backend(name, args.faults or (100 if name == "slurm" else 20), args.seed,
                            args.quick, args.keep, Path(args.evidence) / stamp
                            if args.evidence else None)
            r.update(seed=args.seed, command=command, machine=host(),
                     date=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"))
            runs[name] = r
        result = {k: sum(r[k] for r in runs.values())
                  for k in ("faults", "recovered", "tasks_lost", "stalled_nodes")}
        result.update(rows=[row for r in runs.values() for row in r["rows"]], runs=runs)
    if args.write:
        for r in result["runs"].values():
            begin, end = MARKERS[r["backend"]]
            replace_section(REPO / "BENCHMARKS.md", begin, end, section(r),
                            "Fault campaign on the in-place path, "
                            + ("Slurm" if r["backend"] == "slurm" else "PBS"))
        say("BENCHMARKS.md updated")
    elif not args.json:
        for r in result["runs"].values():
            print(section(r))
    print(json.dumps(result))
    return 0 if result["tasks_lost"] == 0 and result["stalled_nodes"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
