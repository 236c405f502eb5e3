"""MalleTrain under load on a real local Slurm cluster: reports and hooks counted, latency timed.

    python -m bench.load                              # 64 nodes, 100 jobs; prints JSON
    python -m bench.load --markdown BENCHMARKS.md     # and rewrites the load section there
    python -m bench.load --quick                      # 16 nodes, 20 jobs, short phases

One local cluster (test timings), one ``malletraind`` and:

* **elastic jobs** (``sbatch --qos=malletrain -N 1-2 --comment=profile=no``: profiling off),
  whose tasks run ``malletrain-run --poll-s 3`` with examples/standin_torchrun.py as torchrun
  and examples/standin_worker.py as the training command. The workers are stand-ins: real
  Slurm tasks and real launchers, but a loop that sends a signed progress report every
  0.5 s instead of training (two cores cannot run a hundred real trainers). Each worker
  records how many reports it sent; the daemon counts what it received and dropped.
* **prod churn**: a thread submits a 1- to 3-node prod job every few seconds (``sleep``);
  Slurm preempts workers for it. Its start delay runs from ``sbatch`` returning to squeue
  showing it RUNNING.
* **a hook flood** from a separate process (``bench/load.py --sender``): valid ``job_end``
  and ``nodes_free`` datagrams for jobs and nodes the daemon does not know, and one in ten
  malformed, at each stated rate for ``--flood-s`` seconds, sent without blocking (a
  datagram refused because the socket's queue is full is counted as refused, not sent).

Phases: warm-up (until 80 % of the nodes run a worker task and 80 % of those jobs'
chiefs report), then ``idle`` (no flood),
then one phase per flood rate. In every phase the bench asks the daemon for ``status`` over
its API every 0.5 s: the round trip, the daemon's last cycle time and its hook counters.

Over 400 lines on purpose: the flood senders, the churn, the probes and the section share one
run's record and its phases; the soak (:mod:`bench.soak`) reuses the churn and the job script
from here.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

if __name__ == "__main__" and not __package__:  # started as a file; bench/ is a package
    sys.exit("run it as a module from the repository's root: python -m bench.load "
             + " ".join(sys.argv[1:]))
from bench.e2e import machine, p95  # noqa: E402
from bench.sections import replace_section, say  # noqa: E402
from devtools.localcluster import LocalCluster  # noqa: E402
from devtools.localcluster.daemon import LocalDaemon  # noqa: E402
from malletrain_core.wire import hooks as protocol  # noqa: E402

BEGIN, END = "<!-- load:begin -->", "<!-- load:end -->"
MALFORMED_EVERY = 10


# ---------------------------------------------------------------------------- the sender
def send_flood(path: str, rate: float, seconds: float) -> dict[str, int]:
    """Send hook datagrams to ``path`` at ``rate`` per second for ``seconds``; the counts."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    counts = {"valid": 0, "malformed": 0, "refused": 0}
    t0 = time.monotonic()
    i = 0
    while True:
        due = t0 + i / rate
        now = time.monotonic()
        if due - t0 >= seconds:
            break
        if due > now:
            time.sleep(due - now)
        bad = i % MALFORMED_EVERY == MALFORMED_EVERY - 1
        if bad:
            data = b'{"v": 1, "kind": "job_end", "job": ' + str(i).encode()
        elif i % 2:
            data = protocol.encode(protocol.JobEnd(src="load", t=time.time(), job=f"9{i}"))
        else:
            data = protocol.encode(protocol.NodesFree(src="load", t=time.time(),
                                                      nodes=(f"ghost{i % 97}",)))
        try:
            sock.sendto(data, socket.MSG_DONTWAIT, path)
            counts["malformed" if bad else "valid"] += 1
        except BlockingIOError:
            counts["refused"] += 1
        i += 1
    sock.close()
    counts["elapsed_ms"] = int((time.monotonic() - t0) * 1e3)
    return counts


# ---------------------------------------------------------------------------- helpers
def job_script(daemon: LocalDaemon, sent_dir: Path, ckpt_dir: Path, poll_s: float,
               worker_args: tuple[str, ...] = ()) -> str:
    exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in daemon.job_env.items())
    torchrun = shlex.join([sys.executable, str(REPO / "examples" / "standin_torchrun.py")])
    launcher = [sys.executable, "-m", "malletrain_core.worker.launcher", "--poll-s", str(poll_s),
                "--torchrun", torchrun, "--checkpoint-dir"]
    worker = [sys.executable, str(REPO / "examples" / "standin_worker.py"), "--sent-dir",
              str(sent_dir), "--interval-s", "0.5", *worker_args]
    ckpt = f'{shlex.quote(str(ckpt_dir))}/ckpt-"$SLURM_ARRAY_JOB_ID"'
    return (f"#!/bin/bash\n{exports}cd {shlex.quote(str(REPO))}\n"
            f"exec {shlex.join(launcher)} {ckpt} -- {shlex.join(worker)}\n")


def squeue(cluster: LocalCluster, *args: str) -> list[str]:
    out = cluster.run(["squeue", "-h", *args], check=False).stdout
    return [line for line in out.splitlines() if line.strip()]


def elastic_tasks(cluster: LocalCluster) -> tuple[int, int]:
    """Running worker tasks of the bench's elastic jobs, and how many jobs they belong to
    (``%F``, the array's id: ``%A`` is each task's own id)."""
    lines = squeue(cluster, "-r", "-t", "R", "-o", "%F %j")
    ours = [line.split()[0] for line in lines if " load" in line]
    return len(ours), len(set(ours))


def recent_reporters(sent_dir: Path, within_s: float) -> int:
    now = time.time()
    n = 0
    for path in sent_dir.glob("*.*.*"):
        try:
            n += now - path.stat().st_mtime < within_s
        except OSError:
            pass
    return n


def sent_reports(sent_dir: Path) -> int:
    total = 0
    for path in sent_dir.glob("*.*.*"):
        if not path.name.startswith("."):
            try:
                total += int(path.read_text() or 0)
            except (OSError, ValueError):
                pass
    return total


def end_elastic(cluster: LocalCluster, timeout_s: float) -> tuple[int, int]:
    """scancel the bench's elastic jobs (again every 5 s); how many were left after the first
    round (a job that outlives its scancel) and at the end.

    Jobs are named by their array's base id (``%F``): Slurm 22.05's scancel ignores the own
    job id of an array task that was split from its array (``%A``; slurmctld logs "invalid
    JobId" and scancel still exits 0), so a task left running would never be cancelled."""
    deadline = time.monotonic() + timeout_s
    rounds = 0
    after_first = 0
    while True:
        left = sorted({line.split()[0] for line in squeue(cluster, "-o", "%F %j")
                       if " load" in line})
        if rounds == 1:
            after_first = len(left)
            if left:
                say(f"still queued 5 s after scancel: {' '.join(left)}")
        if not left or time.monotonic() >= deadline:
            return after_first, len(left)
        rounds += 1
        cluster.run(["scancel", *left], check=False)
        t0 = time.monotonic()
        while time.monotonic() - t0 < 5.0 and any(
                " load" in line for line in squeue(cluster, "-o", "%A %j")):
            time.sleep(0.5)


def unix_qlen() -> int | None:
    """net.unix.max_dgram_qlen: how many datagrams the kernel queues on the hook socket."""
    try:
        return int(Path("/proc/sys/net/unix/max_dgram_qlen").read_text())
    except (OSError, ValueError):
        return None


def stats(xs: list[float]) -> dict[str, float | int | None]:
    if not xs:
        return {"n": 0, "median": None, "p95": None, "max": None}
    return {"n": len(xs), "median": round(statistics.median(xs), 1), "p95": round(p95(xs), 1),
            "max": round(max(xs), 1)}


class Churn(threading.Thread):
    """Submits prod jobs every ``every_s`` and records each one's start delay (from before
    ``sbatch`` ran, or with ``from_return`` from when it returned)."""

    def __init__(self, cluster: LocalCluster, max_nodes: int, every_s: float,
                 seed: int, from_return: bool = False) -> None:
        super().__init__(daemon=True)
        self.cluster, self.max_nodes, self.every_s = cluster, max_nodes, every_s
        self.from_return = from_return
        self.rng = random.Random(seed)
        self.delays: list[tuple[float, float]] = []  # (submitted, delay s)
        self.unstarted = 0
        self.stop_event = threading.Event()

    def run(self) -> None:
        while not self.stop_event.is_set():
            k = self.rng.randint(1, self.max_nodes)
            hold = self.rng.uniform(3.0, 8.0)
            t0 = time.monotonic()
            try:
                job = self.cluster.sbatch("-p", "prod", "-N", str(k), "-o", "/dev/null",
                                          "--wrap", f"sleep {hold:.1f}")
            except Exception as exc:  # noqa: BLE001 - reported, the bench goes on
                say(f"prod sbatch failed: {exc}")
                self.stop_event.wait(self.every_s)
                continue
            t_ret = time.monotonic() if self.from_return else t0
            started = None
            while time.monotonic() - t0 < 60 and not self.stop_event.is_set():
                state = squeue(self.cluster, "-j", job, "-o", "%T")
                if not state or state[0] in ("RUNNING", "COMPLETING", "COMPLETED"):
                    started = time.monotonic()
                    break
                time.sleep(0.1)
            if started is None:
                self.unstarted += 1
            else:
                self.delays.append((t0, started - t_ret))
            self.stop_event.wait(max(0.0, self.every_s - (time.monotonic() - t0)))


def probe(daemon: LocalDaemon, seconds: float) -> dict[str, Any]:
    """Ask ``status`` every 0.5 s for ``seconds``: round trips, cycle times, last answer."""
    rtts, cycles, failures = [], [], 0
    last: dict[str, Any] = {}
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        t0 = time.monotonic()
        try:
            last = daemon.query("status")
            rtts.append((time.monotonic() - t0) * 1e3)
            cycles.append(float(last["daemon"]["last_cycle_ms"]))
        except Exception as exc:  # noqa: BLE001 - an unanswered status is the finding
            failures += 1
            say(f"status failed: {exc}")
        time.sleep(max(0.0, 0.5 - (time.monotonic() - t0)))
    return {"rtts": rtts, "cycles": cycles, "failures": failures, "last": last}


def hooks_of(status: dict[str, Any]) -> tuple[int, int, int, int]:
    """(received, malformed dropped, dropped at the daemon's full queue, all dropped) hook
    datagrams so far."""
    h = status.get("intake", {}).get("hooks", {})
    dropped = h.get("dropped", {})
    return (int(h.get("received", 0)), int(dropped.get("malformed datagram", 0)),
            int(dropped.get("queue overflow", 0)), int(sum(dropped.values())))


# ---------------------------------------------------------------------------- the run
def run(nodes: int, jobs: int, rates: list[float], flood_s: float, idle_s: float,
        churn_every_s: float, poll_s: float, warmup_max_s: float) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="malletrain-load-"))
    work.chmod(0o755)
    sent_dir, ckpt_dir = work / "sent", work / "ckpt"
    for d in (sent_dir, ckpt_dir):
        d.mkdir()
        d.chmod(0o777)
    cluster = LocalCluster(nodes=nodes, root=work / "cluster")
    say(f"starting a {nodes}-node local cluster in {work}")
    cluster.start()
    daemon = LocalDaemon(cluster, root=work / "daemon",
                         settings={"daemon": {"poll_interval_s": 2.0}})
    churn = Churn(cluster, max_nodes=3, every_s=churn_every_s, seed=1)
    phases: list[dict[str, Any]] = []
    try:
        daemon.start()
        script = job_script(daemon, sent_dir, ckpt_dir, poll_s)
        t0 = time.monotonic()
        for i in range(jobs):
            cluster.sbatch("--qos=malletrain", "-N", "1-2", "--comment=profile=no",
                           "-o", "/dev/null", "--chdir=/tmp", f"--job-name=load{i}",
                           script=script)
        submit_s = time.monotonic() - t0
        say(f"{jobs} elastic jobs submitted in {submit_s:.1f} s")
        target = int(0.8 * nodes)
        deadline = time.monotonic() + warmup_max_s
        while time.monotonic() < deadline:
            tasks, running_jobs = elastic_tasks(cluster)
            if tasks >= target and recent_reporters(sent_dir, 3.0) >= 0.8 * running_jobs:
                break
            time.sleep(1.0)
        warm_tasks, warm_jobs = elastic_tasks(cluster)
        warm = recent_reporters(sent_dir, 3.0)
        warmup_s = time.monotonic() - t0
        say(f"{warm_tasks} worker tasks of {warm_jobs} jobs running, {warm} jobs reporting, "
            f"after {warmup_s:.1f} s")
        churn.start()
        for rate in [0.0, *rates]:
            seconds = idle_s if rate == 0 else flood_s
            before = daemon.query("status")
            t_start = time.monotonic()
            sender = None
            if rate:
                sender = subprocess.Popen(
                    [sys.executable, "-m", "bench.load", "--sender", str(cluster.hook_socket),
                     "--rate", str(rate), "--seconds", str(seconds)],
                    stdout=subprocess.PIPE, text=True, cwd=REPO)
            probed = probe(daemon, seconds)
            flood = {"valid": 0, "malformed": 0, "refused": 0}
            if sender is not None:
                out, _ = sender.communicate(timeout=seconds + 60)
                flood = json.loads(out)
            time.sleep(1.0)  # the daemon drains what is queued
            after = daemon.query("status")
            recv0, bad0, over0, drop0 = hooks_of(before)
            recv1, bad1, over1, drop1 = hooks_of(after)
            starts = [d for t, d in churn.delays if t >= t_start]
            phase = {
                "rate_per_s": rate, "seconds": seconds, "sent": flood,
                "hooks_received": recv1 - recv0, "malformed_dropped": bad1 - bad0,
                "hooks_dropped": drop1 - drop0, "queue_overflow": over1 - over0,
                "status_rtt_ms": stats(probed["rtts"]), "status_failures": probed["failures"],
                "cycle_ms": stats(probed["cycles"]),
                "cycles": after["daemon"]["cycles"] - before["daemon"]["cycles"],
                "prod_start_s": stats(starts),
                "hook_to_action_ms_cumulative": after["daemon"].get("hook_to_action_ms"),
                "reporting_jobs": recent_reporters(sent_dir, 3.0),
                "worker_tasks": elastic_tasks(cluster)[0],
            }
            phases.append(phase)
            say(f"phase {rate:g}/s: {json.dumps(phase)}")
        churn.stop_event.set()
        churn.join(90)
        # Reports: end the workers first so nothing is in flight when counting.
        elastic_after_first, elastic_left = end_elastic(cluster, 120.0)
        time.sleep(2.0)
        final = daemon.query("status")
        sent = sent_reports(sent_dir)
        rep = final.get("intake", {}).get("reports", {})
        received = int(rep.get("received", 0))
        rep_dropped = dict(rep.get("dropped", {}))
        dlog = daemon.log_tail(400)
    finally:
        churn.stop_event.set()
        daemon.stop()
        cluster.stop()
    accounted = received + sum(rep_dropped.values())
    all_starts = [d for _, d in churn.delays]
    return {
        "nodes": nodes, "jobs": jobs, "submit_s": round(submit_s, 1),
        "warm_tasks": warm_tasks, "warm_jobs": warm_jobs,
        "warm_reporting": warm, "warmup_s": round(warmup_s, 1), "profiling": "off (--comment=profile=no)",
        "reports": {"sent": sent, "received": received, "dropped": rep_dropped,
                    "unaccounted": sent - accounted,
                    "loss_pct": round(100.0 * max(0, sent - accounted) / sent, 3)
                    if sent else None},
        "phases": phases,
        "prod": {"submitted": len(churn.delays) + churn.unstarted,
                 "unstarted_60s": churn.unstarted, "start_s": {
                     k: (round(v, 2) if isinstance(v, float) else v)
                     for k, v in {"n": len(all_starts),
                                  "median": statistics.median(all_starts) if all_starts
                                  else None,
                                  "p95": p95(all_starts) if all_starts else None}.items()}},
        "unix_dgram_qlen": unix_qlen(), "elastic_left_after_scancel": elastic_left,
        "elastic_left_after_first_scancel": elastic_after_first,
        "daemon_errors": sum(1 for line in dlog.splitlines() if " ERROR " in line),
    }


# ---------------------------------------------------------------------------- output
def section(r: dict[str, Any]) -> str:
    rep = r["reports"]
    rows = []
    for ph in r["phases"]:
        s = ph["sent"]
        rate = "none (idle)" if not ph["rate_per_s"] else f"{ph['rate_per_s']:g}/s"
        rtt, cyc, prod = ph["status_rtt_ms"], ph["cycle_ms"], ph["prod_start_s"]
        rows.append(
            f"| {rate} | {s['valid']} / {s['malformed']} / {s['refused']} | "
            f"{ph['hooks_received']} / {ph['malformed_dropped']} | "
            f"{rtt['median']} / {rtt['p95']} ms ({ph['status_failures']} failed) | "
            f"{cyc['median']} / {cyc['p95']} ms | {ph['cycles']} | "
            f"{prod['median'] if prod['median'] is not None else '–'} / "
            f"{prod['p95'] if prod['p95'] is not None else '–'} s (n = {prod['n']}) |")
    h2a = (r["phases"][-1].get("hook_to_action_ms_cumulative") or {}) if r["phases"] else {}
    p = r["prod"]["start_s"]
    drops = ", ".join(f"{k}: {v}" for k, v in rep["dropped"].items()) or "none"
    overflow = sum(ph.get("queue_overflow", 0) for ph in r["phases"])
    return "\n".join([
        BEGIN,
        f"Measured {r['date']} on {r['machine']}, with `{r['command']}` (one run; test "
        "timings bf_interval=1, batch_sched_delay=0; daemon poll 2 s).",
        "",
        f"{r['jobs']} elastic jobs (`-N 1-2`, profiling off) on {r['nodes']} virtual nodes; "
        f"{r['warm_tasks']} worker tasks of {r['warm_jobs']} jobs were running ({r['warm_reporting']} "
        f"jobs' chiefs reporting) {r['warmup_s']:.0f} s after the submissions, when the phases "
        "began. **The workers are "
        "stand-ins**: real Slurm tasks running the real `malletrain-run` launcher (check-in "
        "every 3 s), with examples/standin_torchrun.py in place of torchrun and "
        "examples/standin_worker.py — a loop that sends a signed progress report every 0.5 s "
        "— in place of training; no torch runs.",
        "",
        f"Progress reports: {rep['sent']} sent by the workers, {rep['received']} accepted by "
        f"the daemon, dropped by it: {drops}; unaccounted (lost): {rep['unaccounted']} "
        f"({rep['loss_pct']} %). A report is dropped when its job's launch is no longer "
        "running (it arrived after a preemption ended the epoch); a worker killed between "
        "sending a report and recording it undercounts its sent reports by one, so "
        "unaccounted can be slightly negative.",
        "",
        "| hook flood | sent valid / malformed / refused | daemon received / malformed "
        "dropped | `status` round trip median / p95 | cycle time median / p95 | cycles | "
        "prod job start median / p95 |",
        "|---|---|---|---|---|---|---|",
        *rows,
        "",
        f"Prod jobs (1–3 nodes, every few seconds, preempting workers): {r['prod']['submitted']}"
        f" submitted, {r['prod']['unstarted_60s']} not started within 60 s, start delay "
        f"median {p['median']} s, p95 {p['p95']} s over the whole run. Hook → batch-system "
        f"command (daemon's own measurement over the run, n = {h2a.get('count', 0)}): median "
        f"{h2a.get('median', float('nan')):.0f} ms, p95 {h2a.get('p95', float('nan')):.0f} ms. "
        f"Daemon log lines at ERROR: {r['daemon_errors']}.",
        "",
        "The flood comes from a separate process; one datagram in ten is malformed, the rest "
        "are valid `job_end`/`nodes_free` messages for jobs and nodes the daemon does not know "
        "(each wakes a reconciling poll that finds nothing to do). Received counts include "
        "the real hooks Slurm sent in the same window, so they may exceed what the flood sent; "
        "\"refused\" counts datagrams the kernel would not queue (the sender never blocks, like "
        "the real hooks). The kernel queues at most net.unix.max_dgram_qlen = "
        f"{r.get('unix_dgram_qlen', '?')} datagrams on the hook socket here; the daemon "
        "reads the socket continuously on a thread of its own (at a raised priority where "
        "it may) into an in-memory queue (dropped there for overflow: "
        f"{overflow}), so a datagram is refused only when that thread does not get a core "
        "for as long as the kernel's queue lasts at the flood's rate (10 ms at 1000/s with "
        "10 slots): the cluster's processes and any other load of the machine (the 1-min "
        "load above) share the cores. Nothing queued was lost. A refused hook costs at most "
        "one poll interval, as "
        "the reconciling poll reads Slurm itself; raise the sysctl on a busy site. The "
        "`status` round trip is the API answering while the daemon works.",
        "",
        "At the end the bench scancels the elastic jobs (by array id) every 5 s for up to "
        f"120 s: {r.get('elastic_left_after_first_scancel', '?')} were still queued 5 s after "
        f"the first scancel, {r['elastic_left_after_scancel']} at the end.",
        END])


def write_markdown(path: Path, body: str) -> None:
    replace_section(path, BEGIN, END, body, "Load on a local Slurm cluster")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=64)
    p.add_argument("--jobs", type=int, default=100)
    p.add_argument("--rates", default="200,1000", help="hook datagrams per second, per phase")
    p.add_argument("--flood-s", type=float, default=20.0, help="seconds of each flood phase")
    p.add_argument("--idle-s", type=float, default=20.0, help="seconds of the idle phase")
    p.add_argument("--churn-every-s", type=float, default=4.0, help="prod submission period")
    p.add_argument("--poll-s", type=float, default=3.0, help="launcher check-in period")
    p.add_argument("--warmup-max-s", type=float, default=150.0,
                   help="longest wait for the workers before the phases begin")
    p.add_argument("--quick", action="store_true",
                   help="16 nodes, 20 jobs, 5 s phases, 60 s warm-up at most (for the test)")
    p.add_argument("--json", action="store_true", help="print only the JSON")
    p.add_argument("--markdown", metavar="FILE", help="rewrite the load section of FILE")
    p.add_argument("--from-json", metavar="FILE", help="no run: the JSON of a previous run")
    p.add_argument("--sender", metavar="SOCKET", help=argparse.SUPPRESS)
    p.add_argument("--rate", type=float, help=argparse.SUPPRESS)
    p.add_argument("--seconds", type=float, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.sender:
        print(json.dumps(send_flood(args.sender, args.rate, args.seconds)))
        return 0
    if args.quick:
        args.nodes, args.jobs, args.flood_s, args.idle_s = 16, 20, 5.0, 5.0
        args.warmup_max_s = 60.0
    try:
        rates = [float(x) for x in args.rates.split(",") if x.strip()]
    except ValueError:
        p.error(f"--rates {args.rates!r}: give comma-separated numbers, e.g. 200,1000")
    if args.nodes < 4 or args.jobs < 1 or any(r <= 0 for r in rates) or args.flood_s <= 0:
        p.error("--nodes must be ≥ 4, --jobs ≥ 1, --rates and --flood-s > 0")
    if args.from_json:
        result = json.loads(Path(args.from_json).read_text())
    else:
        result = run(args.nodes, args.jobs, rates, args.flood_s, args.idle_s,
                     args.churn_every_s, args.poll_s, args.warmup_max_s)
        flags = list(argv if argv is not None else sys.argv[1:])
        result["command"] = "python -m bench.load " + shlex.join(flags)
        result["machine"] = machine()
        result["date"] = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    if args.markdown:
        write_markdown(Path(args.markdown), section(result))
    print(json.dumps(result, indent=None if args.json else 1))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
