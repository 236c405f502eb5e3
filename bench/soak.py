"""A one-hour soak of MalleTrain on a real local Slurm cluster: leaks, lost jobs, lost reports.

    python -m bench.soak --json                       # one hour, 32 nodes; JSON on stdout
    python -m bench.soak --markdown BENCHMARKS.md     # and rewrites the soak section there
    python -m bench.soak --quick                      # about 5 minutes, for trials
    python -m bench.soak --from-json bench/results/soak.json --markdown BENCHMARKS.md

One local cluster (test timings), one real ``malletraind`` and, for ``--duration-s``:

* **elastic jobs**, kept at about ``--elastic-jobs`` (``-N 1-4``, profiling off): stand-in
  workers as bench/load.py runs them (the real launcher, examples/standin_torchrun.py as
  torchrun, examples/standin_worker.py sending a signed progress report every 0.5 s), plus
  ``--torch-jobs`` real torch jobs (``-N 1-2``, examples/train_elastic.py through
  bench/soak_torch.py, gloo, a small CNN on CPU) that train a random number of steps and
  complete on their own, and are replaced. Every ``--elastic-every-s`` one stand-in job is
  submitted, finished (its workers exit 0 when told to) or cancelled (``scancel``).
* **prod churn**: bench/load.py's thread submits a 1- to 3-node prod job every
  ``--churn-every-s`` seconds; Slurm preempts workers for it. Its start delay runs from
  ``sbatch`` returning to squeue showing it RUNNING (polled every 0.1 s).
* **daemon restarts** (SIGTERM, then a fresh start on the same state) at 1/6, 2/6 and 5/6 of
  the run: none in the stretch from 2/6 to 5/6 (30 minutes of an hour), on which flatness is
  judged after the first half of a restart interval (warm-up).

Every ``--sample-s`` seconds it records the daemon process's RSS, open file descriptors,
threads and child processes, the state journal's rows (``malletrain status``) and the state
database's bytes on disk (file and write-ahead log). It counts the reports every worker sent
against those each daemon life received or dropped (sent while no daemon listened: counted
apart), jobs lost (an elastic job that ended or vanished though nobody finished or cancelled
it, or that the daemon marks done) and jobs revived (a cancelled job with a task PENDING or
RUNNING one poll interval after ``scancel`` returned).

Over 400 lines on purpose: the soak's driver, its verdicts and its plot read the same per-job
records (``Job``, ``Life``); the churn and job scripts come from :mod:`bench.load`, the training
script is :mod:`bench.soak_torch`.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shlex
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

import psutil  # noqa: E402

if __name__ == "__main__" and not __package__:  # started as a file; bench/ is a package
    sys.exit("run it as a module from the repository's root: python -m bench.soak "
             + " ".join(sys.argv[1:]))
from bench.e2e import machine  # noqa: E402
from bench.load import Churn, elastic_tasks, end_elastic, job_script, sent_reports, squeue  # noqa: E402
from bench.sections import replace_section, say  # noqa: E402
from devtools.localcluster import LocalCluster  # noqa: E402
from devtools.localcluster.daemon import LocalDaemon  # noqa: E402

BEGIN, END = "<!-- soak:begin -->", "<!-- soak:end -->"
RESULTS = REPO / "bench" / "results"
ACTIVE = {"PENDING", "RUNNING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "CONFIGURING",
          "SUSPENDED", "RESIZING", "SIGNALING", "STAGE_OUT"}
"""Task states of a job that still runs or can run again (COMPLETING is on its way out)."""
RSS_GROWTH_MAX = 0.05
"""Flat memory: the least-squares line through the RSS samples of the judged window rises by
at most this fraction of their mean over the window."""
DB_PEAK_GROWTH_MAX = 0.10
"""Flat journal: the largest state database (bytes on disk) of the window's second half is at
most this fraction above the largest of its first half, and the journal's rows stay within
``journal_max_events`` plus one cycle's events (compaction makes a sawtooth, not a line)."""
PROD_P99_MAX_S = 1.5


@dataclass
class Job:
    """One elastic job of the soak and what became of it."""

    id: str
    kind: str  # "standin" or "torch"
    submitted: float
    finished: float | None = None   # told to finish (stand-in) or seen COMPLETED (torch)
    cancelled: float | None = None  # scancel returned
    ended: float | None = None      # no active task left in squeue
    lost: str = ""                  # why it counts as lost
    revived: str = ""               # the active tasks one poll interval after scancel


@dataclass
class Life:
    """One daemon process: when it started, the reports sent meanwhile and what it counted."""

    start: float
    sent_at_start: int
    end: float | None = None
    sent_at_end: int | None = None
    received: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    start_s: float = 0.0


def pct(xs: list[float], q: float) -> float | None:
    """The ``q`` quantile (nearest rank) of ``xs``."""
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, int(round(q * len(s))) - 1))]


def fit_growth(ts: list[float], ys: list[float]) -> float:
    """Rise of the least-squares line through (ts, ys) from the first to the last t."""
    n = len(ts)
    if n < 2:
        return 0.0
    mt, my = sum(ts) / n, sum(ys) / n
    var = sum((t - mt) ** 2 for t in ts)
    if var == 0:
        return 0.0
    slope = sum((t - mt) * (y - my) for t, y in zip(ts, ys)) / var
    return slope * (ts[-1] - ts[0])


def state_bytes(state_dir: Path) -> tuple[int, int]:
    """(database file, write-ahead log) bytes of the daemon's state database."""
    def size(name: str) -> int:
        try:
            return (state_dir / name).stat().st_size
        except OSError:
            return 0
    return size("state.db"), size("state.db-wal")


def process_sample(pid: int) -> dict[str, int | float]:
    proc = psutil.Process(pid)
    with proc.oneshot():
        return {"rss_mib": round(proc.memory_info().rss / 2**20, 2), "fds": proc.num_fds(),
                "threads": proc.num_threads(),
                "children": len(proc.children(recursive=True))}


# ---------------------------------------------------------------------------- the run
class Soak:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rng = random.Random(args.seed)
        self.work = Path(tempfile.mkdtemp(prefix="malletrain-soak-"))
        self.work.chmod(0o755)
        self.sent_dir, self.ckpt_dir, self.finish_dir, self.out_dir = (
            self.work / "sent", self.work / "ckpt", self.work / "finish", self.work / "out")
        for d in (self.sent_dir, self.ckpt_dir, self.finish_dir, self.out_dir):
            d.mkdir()
            d.chmod(0o777)
        self.cluster = LocalCluster(nodes=args.nodes, root=self.work / "cluster")
        daemon_settings: dict[str, Any] = {"poll_interval_s": args.poll_s,
                                           "journal_max_events": args.journal_max_events}
        if args.retention_s is not None:
            daemon_settings["finished_job_retention_s"] = args.retention_s
        self.daemon = LocalDaemon(self.cluster, root=self.work / "daemon",
                                  settings={"daemon": daemon_settings})
        self.churn = Churn(self.cluster, max_nodes=3, every_s=args.churn_every_s,
                           seed=args.seed, from_return=True)
        self.jobs: dict[str, Job] = {}
        self.samples: list[dict[str, Any]] = []
        self.lives: list[Life] = []
        self.restarts: list[dict[str, float]] = []
        self.revival_checks: list[tuple[float, str]] = []
        self.unexpected_exits = 0
        self.status_failures = 0
        self.t0 = 0.0
        self.n_submitted = 0
        self.n_cancelled = 0
        self.suspects: set[str] = set()
        self.lock = threading.Lock()

    # -- clock ------------------------------------------------------------------------------
    def now(self) -> float:
        return time.monotonic() - self.t0

    # -- jobs -------------------------------------------------------------------------------
    def submit_standin(self) -> None:
        script = job_script(self.daemon, self.sent_dir, self.ckpt_dir, self.args.launcher_poll_s,
                            worker_args=("--finish-dir", str(self.finish_dir)))
        i = self.n_submitted = self.n_submitted + 1
        job = self.cluster.sbatch("--qos=malletrain", "-N", "1-4", "--comment=profile=no",
                                  "-o", "/dev/null", "--chdir=/tmp", f"--job-name=load-soak{i}",
                                  script=script)
        self.jobs[job] = Job(job, "standin", self.now())

    def submit_torch(self) -> None:
        steps = self.rng.randint(*self.args.torch_steps)
        command = [sys.executable, "bench/soak_torch.py", "--sent-dir", str(self.sent_dir),
                   "--", "--steps", str(steps), "--batch", "8", "--step-sleep-s", "0.2",
                   "--checkpoint-every-s", "60", "--log-every", "50"]
        script = self.daemon.training_script(command, self.ckpt_dir, poll_s=self.args.launcher_poll_s)
        i = self.n_submitted = self.n_submitted + 1
        job = self.cluster.sbatch("--qos=malletrain", "-N", "1-2", "--comment=profile=no",
                                  "--open-mode=append", "-o", f"{self.out_dir}/task-%A_%a.out",
                                  f"--job-name=load-torch{i}", script=script)
        self.jobs[job] = Job(job, "torch", self.now())
        say(f"torch job {job}: {steps} steps")

    def live(self, kind: str) -> list[Job]:
        return [j for j in self.jobs.values() if j.kind == kind and j.ended is None
                and j.finished is None and j.cancelled is None]

    def elastic_step(self) -> str:
        """Submit, finish or cancel one stand-in job, keeping about ``--elastic-jobs``."""
        live = self.live("standin")
        old = [j for j in live if self.now() - j.submitted > 2 * self.args.elastic_every_s]
        if len(live) < self.args.elastic_jobs or not old:
            self.submit_standin()
            return "submit"
        job = self.rng.choice(old)
        if self.rng.random() < 0.5:
            (self.finish_dir / job.id).touch()
            job.finished = self.now()
            return f"finish {job.id}"
        self.cluster.run(["scancel", job.id], check=False)
        job.cancelled = self.now()
        self.n_cancelled += 1
        self.revival_checks.append((job.cancelled + self.args.poll_s, job.id))
        return f"cancel {job.id}"

    def check_revivals(self) -> None:
        due = [(t, j) for t, j in self.revival_checks if t <= self.now()]
        self.revival_checks = [(t, j) for t, j in self.revival_checks if t > self.now()]
        for _, jid in due:
            lines = squeue(self.cluster, "-r", "-j", jid, "-o", "%i %T")
            active = [line for line in lines if line.split()[-1] in ACTIVE]
            if active:
                self.jobs[jid].revived = "; ".join(active)
                say(f"REVIVED: job {jid} one poll interval after scancel: {'; '.join(active)}")

    def check_jobs(self) -> dict[str, int]:
        """Ends, torch completions and lost jobs, from one squeue of every task and the
        daemon's job list."""
        states: dict[str, list[str]] = {}
        for line in squeue(self.cluster, "-r", "-t", "all", "-o", "%F %T"):
            parts = line.split()
            if len(parts) == 2 and parts[0] in self.jobs:
                states.setdefault(parts[0], []).append(parts[1])
        try:
            done_in_daemon = {r["job"] for r in self.daemon.query("jobs", state="done")["jobs"]}
        except Exception as exc:  # noqa: BLE001 - a daemon being restarted
            say(f"jobs failed: {exc}")
            done_in_daemon = set()
        for job in self.jobs.values():
            if job.ended is not None:
                continue
            seen = states.get(job.id, [])
            if job.kind == "torch" and job.finished is None and "COMPLETED" in seen:
                job.finished = self.now()
                say(f"torch job {job.id} completed its steps")
            told = job.finished is not None or job.cancelled is not None
            if not any(s in ACTIVE for s in seen):
                job.ended = self.now()
                if not told and not job.lost:
                    job.lost = f"no active task left (states: {sorted(set(seen)) or 'gone'})"
                    say(f"LOST: job {job.id}: {job.lost}")
            elif job.id in done_in_daemon and not told and not job.lost:
                # Twice in a row: a job that completed between the squeue and the daemon's
                # answer shows its completion at the next sample.
                if job.id in self.suspects:
                    job.lost = "done in the daemon while Slurm still runs it"
                    say(f"LOST: job {job.id}: {job.lost}")
                self.suspects.add(job.id)
            else:
                self.suspects.discard(job.id)
        return {"active_jobs": sum(1 for j in self.jobs.values() if j.ended is None)}

    # -- the daemon -------------------------------------------------------------------------
    def start_daemon(self) -> None:
        took = self.daemon.start()  # returns once the API listens: reports are bound before
        self.lives.append(Life(start=self.now(), sent_at_start=sent_reports(self.sent_dir),
                               start_s=round(took, 2)))

    def close_life(self) -> None:
        """Count the current daemon's reports (status first, then the workers' counts)."""
        life = self.lives[-1]
        try:
            rep = self.daemon.query("status").get("intake", {}).get("reports", {})
            life.received = int(rep.get("received", 0))
            life.dropped = {k: int(v) for k, v in rep.get("dropped", {}).items()}
        except Exception as exc:  # noqa: BLE001 - the daemon died: its counts are lost
            say(f"status before the stop failed: {exc}")
        life.sent_at_end = sent_reports(self.sent_dir)
        life.end = self.now()

    def restart_daemon(self) -> None:
        t = self.now()
        self.close_life()
        self.daemon.stop()
        down = time.monotonic()
        self.start_daemon()
        self.restarts.append({"t": round(t, 1), "down_s": round(time.monotonic() - down, 2)})
        say(f"daemon restarted at {t:.0f} s (down {self.restarts[-1]['down_s']} s)")

    def sample(self) -> None:
        pid = self.daemon.proc.pid if self.daemon.proc is not None else None
        if not self.daemon.running() or pid is None:
            self.unexpected_exits += 1
            say(f"daemon not running at {self.now():.0f} s: {self.daemon.log_tail(5)}")
            self.close_life()
            self.daemon.kill()
            self.start_daemon()
            return
        s: dict[str, Any] = {"t": round(self.now(), 1), **process_sample(pid)}
        db, wal = state_bytes(self.daemon.root / "state")
        s.update(db_bytes=db + wal, wal_bytes=wal)
        t0 = time.monotonic()
        try:
            st = self.daemon.query("status")
            s["status_ms"] = round((time.monotonic() - t0) * 1e3, 1)
            s["journal_rows"] = st.get("journal", {}).get("rows")
            s["compactions"] = st.get("journal", {}).get("compactions")
            s["jobs"] = st["jobs"]
            s["forgotten"] = st["engine"].get("forgotten")
            s["cycle_ms"] = round(st["daemon"]["last_cycle_ms"], 1)
            s["reports_received"] = st.get("intake", {}).get("reports", {}).get("received")
        except Exception as exc:  # noqa: BLE001 - counted, the soak goes on
            self.status_failures += 1
            say(f"status failed: {exc}")
        s.update(self.check_jobs())
        s["worker_tasks"] = elastic_tasks(self.cluster)[0]
        s["load1"] = float(Path("/proc/loadavg").read_text().split()[0])
        self.samples.append(s)

    # -- the whole soak ---------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        a = self.args
        r = a.duration_s / 6
        restart_at = [r, 2 * r, 5 * r]
        window = (2 * r + r / 2, 5 * r)
        say(f"starting a {a.nodes}-node local cluster in {self.work}")
        self.cluster.start()
        try:
            self.t0 = time.monotonic()
            self.start_daemon()
            for _ in range(a.torch_jobs):
                self.submit_torch()
            for _ in range(a.elastic_jobs):
                self.submit_standin()
            self.churn.start()
            next_sample = next_elastic = next_progress = 0.0
            while self.now() < a.duration_s:
                if restart_at and self.now() >= restart_at[0]:
                    restart_at.pop(0)
                    self.restart_daemon()
                if self.now() >= next_elastic:
                    next_elastic = self.now() + a.elastic_every_s
                    self.elastic_step()
                self.check_revivals()
                if self.now() >= next_sample:
                    next_sample = self.now() + a.sample_s
                    self.sample()
                    while len(self.live("torch")) < a.torch_jobs:
                        self.submit_torch()
                if self.now() >= next_progress:
                    next_progress = self.now() + 60.0
                    partial = REPO / "bench-output" / "soak-partial.json"
                    partial.parent.mkdir(exist_ok=True)
                    partial.write_text(json.dumps({"samples": self.samples,
                                                   "restarts": self.restarts}))
                    s = self.samples[-1] if self.samples else {}
                    say(f"{self.now():.0f}/{a.duration_s:.0f} s: rss {s.get('rss_mib')} MiB, "
                        f"fds {s.get('fds')}, threads {s.get('threads')}, journal "
                        f"{s.get('journal_rows')} rows, db {s.get('db_bytes', 0) / 2**20:.2f} "
                        f"MiB, jobs {s.get('jobs')}, {s.get('worker_tasks')} worker tasks, "
                        f"{len(self.churn.delays)} prod starts, load {s.get('load1')}")
                time.sleep(0.2)
            while self.revival_checks:
                self.check_revivals()
                time.sleep(0.2)
            self.churn.stop_event.set()
            self.churn.join(90)
            self.sample()
            say("ending the elastic jobs")
            for job in self.jobs.values():
                if job.ended is None and job.finished is None and job.cancelled is None:
                    job.cancelled = self.now()
            after_first, left = end_elastic(self.cluster, 120.0)
            time.sleep(2.0)
            self.close_life()
            daemon_errors = sum(1 for line in self.daemon.log_text().splitlines()
                                if " ERROR " in line)
        finally:
            self.churn.stop_event.set()
            self.daemon.stop()
            self.cluster.stop()
        return self.result(window, after_first, left, daemon_errors)

    # -- figures ----------------------------------------------------------------------------
    def result(self, window: tuple[float, float], after_first: int, left: int,
               daemon_errors: int) -> dict[str, Any]:
        a = self.args
        reports = report_balance([vars(life) for life in self.lives],
                                 final_counts(self.daemon.log_text()))
        starts = [d for _, d in self.churn.delays]
        return {
            "duration_s": a.duration_s, "nodes": a.nodes, "seed": a.seed,
            "settings": {"poll_interval_s": a.poll_s, "journal_max_events": a.journal_max_events,
                         "finished_job_retention_s": a.retention_s, "elastic_jobs": a.elastic_jobs,
                         "torch_jobs": a.torch_jobs, "elastic_every_s": a.elastic_every_s,
                         "churn_every_s": a.churn_every_s, "sample_s": a.sample_s,
                         "launcher_poll_s": a.launcher_poll_s},
            "window_s": [round(window[0], 1), round(window[1], 1)],
            "restarts": self.restarts, "unexpected_daemon_exits": self.unexpected_exits,
            "status_failures": self.status_failures, "daemon_errors": daemon_errors,
            "jobs": {
                "submitted": {k: sum(1 for j in self.jobs.values() if j.kind == k)
                              for k in ("standin", "torch")},
                "finished": sum(1 for j in self.jobs.values() if j.finished is not None),
                "cancelled_during_run": self.n_cancelled,
                "lost": [{"job": j.id, "kind": j.kind, "why": j.lost}
                         for j in self.jobs.values() if j.lost],
                "revived": [{"job": j.id, "tasks": j.revived}
                            for j in self.jobs.values() if j.revived],
                "left_after_first_scancel": after_first, "left_at_end": left},
            "reports": reports,
            "prod": {"submitted": len(self.churn.delays) + self.churn.unstarted,
                     "unstarted_60s": self.churn.unstarted, "n": len(starts),
                     "p50_s": round(pct(starts, 0.5) or 0, 3) if starts else None,
                     "p99_s": round(pct(starts, 0.99) or 0, 3) if starts else None,
                     "max_s": round(max(starts), 3) if starts else None,
                     "delays": [[round(t - self.t0, 1), round(d, 3)]
                                for t, d in self.churn.delays]},
            "samples": self.samples,
        }


# ---------------------------------------------------------------------------- reports
FINAL = re.compile(r"final intake counts: reports received (\d+), dropped (\{[^}]*\})")


def final_counts(log_text: str) -> list[tuple[int, dict[str, int]]]:
    """Each daemon life's final report counts, in order: the line malletraind logs once its
    report socket is closed (a life that was killed has none)."""
    return [(int(m.group(1)), {k: int(v) for k, v in json.loads(m.group(2)).items()})
            for m in FINAL.finditer(log_text)]


def report_balance(lives: list[dict[str, Any]],
                   finals: list[tuple[int, dict[str, int]]]) -> dict[str, Any]:
    """Reports sent against received and dropped over the whole run, and per daemon life.

    A life's counts are its final ones (logged after its socket closed) where every life
    logged them, else its last ``status``. What no daemon received or dropped is lost unless it
    was sent while a daemon was stopping or starting (between a life's last count of the
    workers' sends and the next life's API answering: the socket was closed for part of it);
    lost = not received − sent while restarting, at least 0. Per life: the reports the workers
    recorded sending during it less those it received or dropped (a report sent during a
    restart and received by the next daemon makes that life's figure negative; they cancel
    in the total)."""
    exact = len(finals) == len(lives)
    counts = [finals[i] if exact else (lv["received"], lv["dropped"])
              for i, lv in enumerate(lives)]
    received = sum(c[0] for c in counts)
    dropped: dict[str, int] = {}
    for _, d in counts:
        for k, v in d.items():
            dropped[k] = dropped.get(k, 0) + v
    sent = (lives[-1]["sent_at_end"] or 0) if lives else 0
    down = sum(nxt["sent_at_start"] - (cur["sent_at_end"] or nxt["sent_at_start"])
               for cur, nxt in zip(lives, lives[1:]))
    missing = sent - received - sum(dropped.values())
    per_life = [(lv["sent_at_end"] or lv["sent_at_start"]) - lv["sent_at_start"] - c[0]
                - sum(c[1].values()) for lv, c in zip(lives, counts)]
    return {"sent": sent, "received": received, "dropped": dropped, "counts_final": exact,
            "not_received": missing, "sent_while_restarting": down,
            "unaccounted_per_life": per_life, "lost": max(0, missing - down), "lives": lives}


# ---------------------------------------------------------------------------- judgement
def judge(r: dict[str, Any]) -> dict[str, Any]:
    """Flatness over the judged window and every target, from the samples alone."""
    lo, hi = r["window_s"]
    win = [s for s in r["samples"] if lo <= s["t"] < hi and s.get("rss_mib") is not None]
    out: dict[str, Any] = {"samples_in_window": len(win)}
    if len(win) < 4:
        out["flat"] = None
        return out
    mid = (lo + hi) / 2
    first = [s for s in win if s["t"] < mid]
    second = [s for s in win if s["t"] >= mid]

    def series(key: str) -> dict[str, Any]:
        ys = [float(s[key]) for s in win if s.get(key) is not None]
        t = [s["t"] for s in win if s.get(key) is not None]
        if not ys:
            return {}
        mean = statistics.fmean(ys)
        return {"first": ys[0], "last": ys[-1], "min": min(ys), "max": max(ys),
                "mean": round(mean, 2), "fit_growth": round(fit_growth(t, ys), 2),
                "fit_growth_pct": round(100 * fit_growth(t, ys) / mean, 2) if mean else 0.0,
                "max_first_half": max((float(s[key]) for s in first if s.get(key) is not None),
                                      default=None),
                "max_second_half": max((float(s[key]) for s in second
                                        if s.get(key) is not None), default=None)}

    for key in ("rss_mib", "fds", "threads", "children", "journal_rows", "db_bytes"):
        out[key] = series(key)
    rss, db, rows = out["rss_mib"], out["db_bytes"], out["journal_rows"]
    bound = r["settings"]["journal_max_events"]
    per_cycle = 2000  # generous: one cycle's events (reports of every chief, polls, ticks)
    out["rss_flat"] = rss["fit_growth"] <= RSS_GROWTH_MAX * rss["mean"]
    out["journal_flat"] = bool(db and rows and rows["max"] <= bound + per_cycle
                               and db["max_second_half"] is not None
                               and db["max_second_half"]
                               <= (1 + DB_PEAK_GROWTH_MAX) * db["max_first_half"])
    # Descriptors and threads follow the load of the moment (launchers connected, API
    # clients, a command's pipes), so one peak is no leak: they are judged like memory, by
    # the trend of the window (a leak grows it), with one descriptor or thread of slack.
    out["fds_threads_flat"] = all(
        out[k] and out[k]["fit_growth"] <= max(1.0, RSS_GROWTH_MAX * out[k]["mean"])
        for k in ("fds", "threads"))
    out["flat"] = out["rss_flat"] and out["journal_flat"]
    prod_ok = r["prod"]["p99_s"] is not None and r["prod"]["p99_s"] <= PROD_P99_MAX_S
    out["targets"] = {
        "memory_and_journal_flat": out["flat"],
        "no_lost_jobs": not r["jobs"]["lost"], "no_revived_jobs": not r["jobs"]["revived"],
        "no_lost_reports": r["reports"]["lost"] == 0,
        "prod_p99_within_1_5_s": prod_ok}
    return out


# ---------------------------------------------------------------------------- output
def plot(r: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples = r["samples"]
    t = [s["t"] / 60 for s in samples]
    panels = [("rss_mib", "daemon RSS (MiB)"), ("fds", "open file descriptors"),
              ("threads", "threads"), ("children", "child processes"),
              ("journal_rows", "journal rows"), ("db_bytes", "state database on disk (MiB)")]
    fig, axes = plt.subplots(4, 2, figsize=(11, 11), sharex=True)
    lo, hi = (x / 60 for x in r["window_s"])
    for ax, (key, title) in zip(axes.flat, panels):
        ys = [s.get(key) for s in samples]
        if key == "db_bytes":
            ys = [None if y is None else y / 2**20 for y in ys]
        ax.plot(t, [float("nan") if y is None else y for y in ys], lw=1)
        ax.set_title(title, fontsize=10)
        ax.axvspan(lo, hi, color="tab:green", alpha=0.08)
        for rs in r["restarts"]:
            ax.axvline(rs["t"] / 60, color="tab:red", lw=0.8, ls="--")
    ax = axes.flat[6]
    d = r["prod"]["delays"]
    ax.plot([x[0] / 60 for x in d], [x[1] for x in d], ".", ms=2)
    ax.axhline(PROD_P99_MAX_S, color="tab:orange", lw=0.8)
    ax.set_title("prod job start delay (s)", fontsize=10)
    ax = axes.flat[7]
    ax.plot(t, [s.get("worker_tasks") for s in samples], lw=1, label="worker tasks")
    ax.plot(t, [sum((s.get("jobs") or {}).values()) or float("nan") for s in samples], lw=1,
            label="jobs in the daemon's state")
    ax.legend(fontsize=8)
    ax.set_title("elastic work", fontsize=10)
    for ax in axes[-1]:
        ax.set_xlabel("minutes (red: daemon restarts; green: judged window)")
    fig.suptitle(f"MalleTrain soak: {r['nodes']} nodes, {r['duration_s'] / 60:.0f} min "
                 f"({r.get('date', '')})", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def section(r: dict[str, Any], plot_name: str, json_name: str = "soak.json") -> str:
    j = r["judgement"]
    rep, jobs, prod, st = r["reports"], r["jobs"], r["prod"], r["settings"]
    counted = ("each life's final counts, logged once its socket closed"
               if rep.get("counts_final") else "each life's last `status`")
    lo, hi = r["window_s"]

    def row(name: str, key: str, unit: str, scale: float = 1.0, digits: int = 1) -> str:
        x = j.get(key) or {}
        if not x:
            return f"| {name} | – | – | – | – |"
        def f(v: float) -> str:
            return f"{v / scale:.{digits}f}"

        u = f" {unit}" if unit else ""
        return (f"| {name} | {f(x['first'])} → {f(x['last'])}{u} | {f(x['min'])} – "
                f"{f(x['max'])}{u} | {f(x['fit_growth'])}{u} ({x['fit_growth_pct']:+.1f} %)"
                f" | {f(x['max_first_half'])} / {f(x['max_second_half'])}{u} |")

    yes = {True: "yes", False: "**no**", None: "n/a"}
    t = j.get("targets", {})
    drops = ", ".join(f"{k}: {v}" for k, v in rep["dropped"].items()) or "none"
    lost = "; ".join(f"{x['job']} ({x['kind']}): {x['why']}" for x in jobs["lost"]) or "none"
    revived = "; ".join(f"{x['job']}: {x['tasks']}" for x in jobs["revived"]) or "none"
    restarts = ", ".join(f"{x['t'] / 60:.0f} min ({x['down_s']} s down)" for x in r["restarts"])
    loads = sorted(s["load1"] for s in r["samples"] if s.get("load1") is not None)
    load = (f" The machine's 1-min load over the samples (the cluster, the soak and whatever "
            f"else ran on the host): median {statistics.median(loads):.1f}, max {loads[-1]:.1f}."
            if loads else "")
    return "\n".join([
        BEGIN,
        f"Measured {r['date']} on {r['machine']}, with `{r['command']}` (one run; test timings "
        f"bf_interval=1, batch_sched_delay=0; daemon poll {st['poll_interval_s']:g} s, "
        f"`journal_max_events = {st['journal_max_events']}` so that the journal's bound is "
        "reached several times in the judged window, finished-job retention "
        f"{st['finished_job_retention_s'] or 600:g} s).",
        "",
        f"Load: {r['nodes']} virtual nodes for {r['duration_s'] / 60:.0f} min; about "
        f"{st['elastic_jobs']} elastic stand-in jobs (`-N 1-4`, profiling off; the real "
        "`malletrain-run` launcher with examples/standin_torchrun.py and "
        "examples/standin_worker.py, a signed report every 0.5 s) and "
        f"{st['torch_jobs']} real torch jobs (`-N 1-2`, examples/train_elastic.py, gloo, each "
        "training a random number of steps, 0.2 s apart, and replaced when it ends: "
        f"{jobs['submitted']['torch'] - st['torch_jobs']} replaced in this run); every "
        f"{st['elastic_every_s']:g} s one stand-in job is submitted, finished or scancelled "
        f"({jobs['submitted']['standin']} stand-in and {jobs['submitted']['torch']} torch jobs "
        f"submitted, {jobs['finished']} finished); a 1–3-node prod job every "
        f"{st['churn_every_s']:g} s preempting workers ({prod['submitted']} in all). The "
        f"daemon was restarted (SIGTERM, then a fresh start on its state) at {restarts}; "
        f"flatness is judged on the samples (every {st['sample_s']:g} s) from {lo / 60:.0f} to "
        f"{hi / 60:.0f} min: the stretch without restarts, less its first "
        f"{(lo - r['restarts'][1]['t']) / 60 if len(r['restarts']) > 1 else 0:.1f} min of "
        f"warm-up.{load} Samples: bench/results/{json_name}; plot (below): "
        f"[bench/results/{plot_name}](bench/results/{plot_name}).",
        "",
        f"![soak: RSS, file descriptors, threads, child processes, journal, state database, "
        f"prod start delay over time](bench/results/{plot_name})",
        "",
        "| judged window | first → last | min – max | fitted growth over the window | "
        "max 1st / 2nd half |",
        "|---|---|---|---|---|",
        row("daemon RSS", "rss_mib", "MiB"),
        row("open file descriptors", "fds", "", digits=0),
        row("threads", "threads", "", digits=0),
        row("child processes", "children", "", digits=0),
        row("journal rows", "journal_rows", "", digits=0),
        row("state database on disk (file + log)", "db_bytes", "MiB", scale=2**20, digits=2),
        "",
        f"How flatness is judged: memory is flat when the least-squares line through the RSS "
        f"samples of the window rises by at most {RSS_GROWTH_MAX:.0%} of their mean; the "
        "journal is flat when its rows never exceed `journal_max_events` plus one cycle's "
        "events and the largest state database of the window's second half is at most "
        f"{DB_PEAK_GROWTH_MAX:.0%} above the largest of its first half (compaction makes a "
        "sawtooth, through which a line means little). File descriptors and threads follow "
        "the load of the moment (launchers connected, API clients, a command's pipes), so they "
        f"are judged by the same line: a rise of at most {RSS_GROWTH_MAX:.0%} of their mean, or "
        "1, whichever is larger; the max of each half is shown beside it.",
        "",
        "| target | result | met |",
        "|---|---|---|",
        f"| memory flat after warm-up | RSS fitted growth {j['rss_mib']['fit_growth']:+.1f} MiB "
        f"({j['rss_mib']['fit_growth_pct']:+.1f} %) | {yes[j.get('rss_flat')]} |",
        f"| journal flat | ≤ {j['journal_rows']['max']:.0f} rows; database peak "
        f"{j['db_bytes']['max_first_half'] / 2**20:.2f} → "
        f"{j['db_bytes']['max_second_half'] / 2**20:.2f} MiB | {yes[j.get('journal_flat')]} |",
        f"| file descriptors and threads flat | fds {j['fds']['min']:.0f}–{j['fds']['max']:.0f} "
        f"(fitted growth {j['fds']['fit_growth']:+.1f}), threads {j['threads']['min']:.0f}–"
        f"{j['threads']['max']:.0f} (fitted growth {j['threads']['fit_growth']:+.1f}) | "
        f"{yes[j.get('fds_threads_flat')]} |",
        f"| 0 lost jobs | {len(jobs['lost'])} | {yes[t.get('no_lost_jobs')]} |",
        f"| 0 revived jobs (task PENDING/RUNNING {st['poll_interval_s']:g} s after `scancel`) | "
        f"{len(jobs['revived'])} of {jobs['cancelled_during_run']} cancelled | "
        f"{yes[t.get('no_revived_jobs')]} |",
        f"| 0 lost reports | {rep['sent']} sent, {rep['received']} received, dropped: {drops}; "
        f"not received: {rep['not_received']}, of which at most "
        f"{rep['sent_while_restarting']} were sent while a daemon stopped or started; per "
        f"daemon life (sent − received − dropped): "
        f"{', '.join(str(g) for g in rep['unaccounted_per_life'])}; lost: "
        f"{rep['lost']} | {yes[t.get('no_lost_reports')]} |",
        f"| prod start delay p99 ≤ {PROD_P99_MAX_S} s (sbatch returned → RUNNING) | p50 "
        f"{prod['p50_s']} s, p99 {prod['p99_s']} s, max {prod['max_s']} s (n = {prod['n']}, "
        f"{prod['unstarted_60s']} not started within 60 s) | "
        f"{yes[t.get('prod_p99_within_1_5_s')]} |",
        "",
        f"Lost: {lost}. Revived: {revived}. Daemon log lines at ERROR: {r['daemon_errors']}; "
        f"unexpected daemon exits: {r['unexpected_daemon_exits']}; `status` calls that failed: "
        f"{r['status_failures']}. At the end the remaining elastic jobs were scancelled: "
        f"{jobs['left_after_first_scancel']} still queued 5 s later, {jobs['left_at_end']} at "
        "the end. Reports are counted over the whole run: what the workers recorded sending against "
        f"what the daemons received or dropped ({counted}); "
        "lost is what no daemon received less what was sent while a daemon was stopping or "
        "starting (between the workers' count at a stop and the next daemon's API answering; "
        "its socket is bound before that, so some of those are received after all), at least "
        "0. Per life, a report sent during a restart and received by the next daemon makes "
        "that life's figure negative and the previous one's positive; they cancel in the "
        "total. A worker killed between sending and recording undercounts by one.",
        END])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--duration-s", type=float, default=3600.0)
    p.add_argument("--nodes", type=int, default=32)
    p.add_argument("--elastic-jobs", type=int, default=10, help="stand-in jobs kept alive")
    p.add_argument("--torch-jobs", type=int, default=2, help="real torch jobs kept alive")
    p.add_argument("--torch-steps", type=int, nargs=2, default=(1500, 4000),
                   metavar=("MIN", "MAX"), help="steps of each torch job (0.2 s apart)")
    p.add_argument("--elastic-every-s", type=float, default=15.0,
                   help="one stand-in job submitted, finished or cancelled this often")
    p.add_argument("--churn-every-s", type=float, default=4.0, help="prod submission period")
    p.add_argument("--poll-s", type=float, default=2.0, help="daemon.poll_interval_s")
    p.add_argument("--launcher-poll-s", type=float, default=3.0, help="launcher check-in")
    p.add_argument("--journal-max-events", type=int, default=5000,
                   help="daemon.journal_max_events (low: compacted several times an hour)")
    p.add_argument("--retention-s", type=float, default=None,
                   help="daemon.finished_job_retention_s (default: the daemon's, 600 s)")
    p.add_argument("--sample-s", type=float, default=10.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--quick", action="store_true",
                   help="5 minutes, restarts every 50 s, retention 60 s (for trials)")
    p.add_argument("--results", type=Path, help="where the JSON with every sample goes "
                   "(default bench/results/soak.json; with --quick bench-output/soak-quick.json)")
    p.add_argument("--json", action="store_true", help="print only the JSON (one line)")
    p.add_argument("--markdown", metavar="FILE", help="rewrite the soak section of FILE")
    p.add_argument("--from-json", metavar="FILE", help="no run: the JSON of a previous run")
    args = p.parse_args(argv)
    if args.quick:
        args.duration_s = min(args.duration_s, 300.0)
        args.elastic_every_s = min(args.elastic_every_s, 8.0)
        args.torch_steps = (300, 600)
        if args.retention_s is None:
            args.retention_s = 60.0
    if args.nodes < 8 or args.duration_s < 60 or args.elastic_jobs < 1 or args.sample_s <= 0:
        p.error("--nodes must be ≥ 8, --duration-s ≥ 60, --elastic-jobs ≥ 1, --sample-s > 0")
    results = args.results or (REPO / "bench-output" / "soak-quick.json" if args.quick
                               else RESULTS / "soak.json")
    if args.from_json:
        result = json.loads(Path(args.from_json).read_text())
        results = Path(args.from_json)
    else:
        result = Soak(args).run()
        flags = list(argv if argv is not None else sys.argv[1:])
        result["command"] = "python -m bench.soak " + shlex.join(flags)
        result["machine"] = machine()
        result["date"] = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    result["judgement"] = judge(result)
    results.parent.mkdir(parents=True, exist_ok=True)
    if not args.from_json:
        results.write_text(json.dumps(result, indent=None) + "\n")
    png = results.with_suffix(".png")
    try:
        plot(result, png)
    except ImportError as exc:
        say(f"no plot ({exc}): run with a Python that has matplotlib")
    if args.markdown:
        replace_section(Path(args.markdown), BEGIN, END, section(result, png.name, results.name),
                        "Soak: one hour on a local Slurm cluster")
    summary = {k: v for k, v in result.items() if k != "samples"}
    summary["prod"] = {k: v for k, v in result["prod"].items() if k != "delays"}
    print(json.dumps(summary, indent=None if args.json else 1))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
