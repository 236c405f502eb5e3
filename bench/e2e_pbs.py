"""End-to-end timings of MalleTrain on a real local OpenPBS complex (``bench/e2e.py
--batch-system pbs`` runs this).

    python -m bench.e2e --batch-system pbs --json
    python -m bench.e2e --batch-system pbs --markdown BENCHMARKS.md

One run, one complex (server and 8 moms in network namespaces, test timings: queue kill_delay
2 s, mom poll 1-2 s), one malletraind in the server's namespace (poll 2 s, hooks on, profiler
window 15 s), in three phases, the same as Slurm's:

1. **rescales, real torch** — a prod job holds 4 nodes, so 4 stay idle; one elastic job
   (``-J 1-4``, examples/train_elastic.py, gloo DDP, profiling off) trains on them. Each round
   a 2-node prod job preempts two workers (PBS requeues them): ``shrink_s`` runs from the prod
   job running to the first training step at world size 2; when it ends, ``grow_s`` runs from
   its end to the first step at world size 4. Times come from qstat and the workers' own
   output, polled every 0.2 s.
2. **prod start on MalleTrain's workers** — stand-in workers (a sleeping script) hold the 4
   idle nodes; one-node prod jobs are submitted one at a time and each must preempt a worker:
   the delay from ``qsub`` returning to qstat showing it running (polled every 50 ms).
3. **prod start on plain preemptable jobs** — the same submissions with the daemon stopped
   and 4 ordinary jobs of the ``preemptable`` queue on the same nodes: PBS's own requeue
   preemption, the baseline.

``hook_to_action_ms`` is the daemon's own measurement (``malletrain status``).
"""

from __future__ import annotations

import shutil
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

from bench.e2e_common import EpochWatcher, p95, timing_rows, wait  # noqa: E402
from bench.sections import host, replace_section, say  # noqa: E402
from devtools.localcluster.pbs import PbsComplex  # noqa: E402
from devtools.localcluster.pbs_helpers import complex_root, start_daemon, subjob  # noqa: E402
from malletrain_core.worker.client import UnixClient  # noqa: E402

BEGIN, END = "<!-- e2e-pbs:begin -->", "<!-- e2e-pbs:end -->"
MOMS, IDLE = 8, 4
TRAIN = [sys.executable, "examples/train_elastic.py", "--steps", "0", "--batch", "16",
         "--step-sleep-s", "0.05", "--checkpoint-every-s", "20", "--log-every", "1"]
QUIET = ("-o", "/dev/null", "-e", "/dev/null")


def state_of(cx: PbsComplex, job: str) -> str:
    """R, Q, E, F... ('' when PBS has no record)."""
    return str(cx.jobs(job, subjobs=False).get(job, {}).get("job_state", ""))


def ended(cx: PbsComplex, job: str) -> bool:
    return state_of(cx, job) in ("F", "X", "")


def running_subjobs(cx: PbsComplex, array: str, size: int) -> int:
    states = cx.jobs(*(subjob(array, i) for i in range(1, size + 1)))
    return sum(1 for v in states.values() if v.get("job_state") == "R")


def training_script(outdir: Path, command: list[str] = TRAIN, inplace: bool = False) -> str:
    """A subjob's script: ``malletrain-run [--inplace] -- command``, its output appended to
    ``outdir/task-<array>_<index>.out``."""
    launcher = " ".join([sys.executable, "-m", "malletrain_core.worker.launcher", "--poll-s",
                         "1", *(["--inplace"] if inplace else [])])
    return (f"#!/bin/bash\ncd {REPO}\nexport PYTHONPATH=.\nn=${{PBS_ARRAY_ID%%[*}}\n"
            f'exec >> {outdir}/task-"$n"_"$PBS_ARRAY_INDEX".out 2>&1\n'
            f'exec {launcher} --checkpoint-dir {outdir}/ckpt-"$n" -- {" ".join(command)}\n')


def rescales(cx: PbsComplex, address: str, work: Path, rounds: int) -> tuple[list[float],
                                                                             list[float]]:
    outdir = work / "out"
    outdir.mkdir()
    array = cx.qsub("-q", "malletrain", "-J", f"1-{IDLE}", "-l", "select=1:ncpus=2", *QUIET,
                    "-v", f"MALLETRAIN_PROFILE=0,MALLETRAIN_DAEMON={address}",
                    script=training_script(outdir))
    watch = EpochWatcher(outdir, array.split("[", 1)[0])
    t0 = time.monotonic()
    watch.wait_world(IDLE, t0, 300)
    say(f"elastic job {array} trains on {IDLE} nodes after {time.monotonic() - t0:.1f} s")
    grows, shrinks = [], []
    for r in range(rounds):
        prod = cx.qsub("-q", "prod", "-l", "select=2:ncpus=2", "-l", "place=scatter", *QUIET,
                       script="sleep 25\n")
        t_run = wait("prod running", lambda p=prod: state_of(cx, p) == "R", 60)
        shrinks.append(watch.wait_world(IDLE - 2, t_run, 180) - t_run)
        t_end = wait("prod ended", lambda p=prod: ended(cx, p), 90)
        grows.append(watch.wait_world(IDLE, t_end, 180) - t_end)
        say(f"round {r + 1}/{rounds}: shrink {shrinks[-1]:.1f} s, grow {grows[-1]:.1f} s")
    cx.run(["qdel", array])
    wait("training job gone", lambda: ended(cx, array), 60, 0.5)
    return grows, shrinks


def prod_starts(cx: PbsComplex, n: int, before: Any,
                ends: list[float] | None = None) -> list[float]:
    """``n`` one-node prod jobs one after the other; ``ends`` gets when each was seen ended."""
    delays: list[float] = []
    for i in range(n):
        before()
        t0 = time.monotonic()
        prod = cx.qsub("-q", "prod", "-l", "select=1:ncpus=2", *QUIET, script="sleep 1\n")
        t1 = wait("prod running", lambda p=prod: state_of(cx, p) in ("R", "E", "F", "X"), 60)
        delays.append(t1 - t0)
        t2 = wait("prod ended", lambda p=prod: ended(cx, p), 60, 0.2)
        if ends is not None:
            ends.append(t2)
        if (i + 1) % 10 == 0:
            say(f"  {i + 1}/{n} prod jobs, median start {statistics.median(delays):.2f} s")
    return delays


def run(submissions: int, rounds: int) -> dict[str, Any]:
    cx = PbsComplex(moms=MOMS, root=complex_root())
    work = Path(tempfile.mkdtemp(prefix="e2e-", dir=cx.root))
    say(f"starting a PBS complex of {MOMS} moms in {cx.root}")
    cx.start()
    cx.install_malletrain(freq_s=3)
    cx.qmgr("set server acl_roots = root")  # the torch of this machine: a root-only Python
    daemon = start_daemon(cx, poll_s=2.0, in_server_ns=True,
                          extra_toml="[profiler]\nwindow_s = 15.0\n")
    failed: dict[str, str] = {}
    grows: list[float] = []
    shrinks: list[float] = []
    with_mt: list[float] = []
    without: list[float] = []
    regrow: list[float] = []
    status: dict[str, Any] = {"daemon": {}}

    def phase(name: str, body: Any) -> None:
        try:
            body()
        except (TimeoutError, RuntimeError, ValueError) as exc:
            failed[name] = str(exc).splitlines()[0]
            say(f"{name} FAILED: {failed[name]} (the other phases go on)")

    try:
        blocker = cx.qsub("-q", "prod", "-l", f"select={MOMS - IDLE}:ncpus=2", "-l",
                          "place=scatter", *QUIET, script="sleep 100000\n")
        wait("blocker running", lambda: state_of(cx, blocker) == "R", 60)

        def phase1() -> None:
            say("phase 1: rescales of a real torch job")
            g, s = rescales(cx, daemon.address, work, rounds)
            grows.extend(g)
            shrinks.extend(s)

        def phase2() -> None:
            say(f"phase 2: {submissions} prod jobs preempting MalleTrain's stand-in workers")
            standin = cx.qsub("-q", "malletrain", "-J", f"1-{IDLE}", "-l", "select=1:ncpus=2",
                              *QUIET, "-v", "MALLETRAIN_PROFILE=0",
                              script="exec sleep 100000\n")
            last_end: list[float] = []

            def harvested() -> None:
                t = wait("all idle nodes harvested",
                         lambda: running_subjobs(cx, standin, IDLE) == IDLE, 90, 0.05)
                if last_end:
                    regrow.append(round(t - last_end[-1], 2))

            with_mt.extend(prod_starts(cx, submissions, harvested, last_end))
            with UnixClient(str(daemon.root / "api.sock"), timeout_s=10) as client:
                status.update(client.call("status"))
            cx.run(["qdel", "-Wforce", standin])
            wait("workers gone", lambda: ended(cx, standin), 60, 0.5)

        phase("phase 1", phase1)
        phase("phase 2", phase2)
        daemon.stop()

        def phase3() -> None:
            say(f"phase 3: {submissions} prod jobs preempting plain preemptable jobs")
            plain = [cx.qsub("-q", "preemptable", "-l", "select=1:ncpus=2", *QUIET,
                             script="sleep 100000\n") for _ in range(IDLE)]
            without.extend(prod_starts(cx, submissions, lambda: wait(
                "plain jobs on all idle nodes",
                lambda: sum(state_of(cx, j) == "R" for j in plain) == IDLE, 90, 0.2)))

        phase("phase 3", phase3)
    finally:
        daemon.stop()
        cx.stop()
        shutil.rmtree(cx.root, ignore_errors=True)
    hook = status["daemon"].get("hook_to_action_ms", {})

    def med(xs: list[float]) -> float | None:
        return statistics.median(xs) if xs else None

    return {
        "moms": MOMS, "completed": not failed, "failed": failed,
        "regrow_after_prod_s": {"median": med(regrow), "max": max(regrow) if regrow else None},
        "grow_s": med(grows), "shrink_s": med(shrinks),
        "hook_to_action_ms": hook.get("median"),
        "prod_start_s": {"with_malletrain": med(with_mt),
                         "plain_preemptable": med(without),
                         "with_malletrain_p95": p95(with_mt) if with_mt else None,
                         "plain_preemptable_p95": p95(without) if without else None},
        "grow_s_all": [round(x, 2) for x in grows],
        "shrink_s_all": [round(x, 2) for x in shrinks],
        "with_malletrain_all": [round(x, 2) for x in with_mt],
        "plain_preemptable_all": [round(x, 2) for x in without],
        "hook_to_action_ms_p95": hook.get("p95"), "hook_to_action_count": hook.get("count"),
        "submissions": submissions, "rounds": rounds,
    }


def machine() -> str:
    return host("OpenPBS 23.06.06")


def section(r: dict[str, Any], command: str) -> str:
    p = r["prod_start_s"]
    slow = sum(1 for x in r["with_malletrain_all"] if x > p["plain_preemptable_p95"] + 1.0)
    date = r.get("date") or datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return "\n".join([
        BEGIN,
        f"Measured {date} on {r.get('machine') or machine()}, with `{command}` (one run; a "
        f"complex of {r['moms']} moms in network namespaces, test timings: queue kill_delay "
        "2 s, mom poll 1-2 s; malletraind polling every 2 s, profiler window 15 s).",
        "",
        "| what | median | p95 / all |",
        "|---|---|---|",
        *timing_rows(r),
        *([f"| prod job ended → its vnode running a worker again (phase 2, n = "
           f"{r['submissions'] - 1}) | {r['regrow_after_prod_s']['median']:.2f} s | max "
           f"{r['regrow_after_prod_s']['max']:.2f} s |"] if "regrow_after_prod_s" in r else []),
        f"| prod job start, MalleTrain's workers on its node (n = {r['submissions']}) | "
        f"{p['with_malletrain']:.2f} s | {p['with_malletrain_p95']:.2f} s |",
        f"| prod job start, plain preemptable jobs on the same nodes (n = {r['submissions']})"
        f" | {p['plain_preemptable']:.2f} s | {p['plain_preemptable_p95']:.2f} s |",
        "",
        f"Prod start on MalleTrain's workers minus on plain preemptable jobs: "
        f"{p['with_malletrain'] - p['plain_preemptable']:+.2f} s (median), "
        f"{p['with_malletrain_p95'] - p['plain_preemptable_p95']:+.2f} s (p95); all "
        f"starts on MalleTrain's workers: {', '.join(f'{x:.2f}' for x in r['with_malletrain_all'])}"
        " s. Both are PBS's own preemption by requeue (the queue's kill_delay, the mom's "
        "report, the next scheduling cycle), and MalleTrain runs no step of it; the starts on "
        f"its workers more than 1 s above the plain p95 ({slow} of {r['submissions']}) were "
        "not explained in this run (not seen on plain jobs). Grow and shrink include a torchrun "
        "restart of every worker from the last checkpoint (gloo, a small CNN on CPU); a grow "
        "also waits for the checkpoint the running epoch takes before the membership "
        "changes, and, after a preemption, for the end of the profiler's window at the "
        "smaller size. The workers run as root (`acl_roots`): the torch of this machine is "
        "in a Python only root may execute.",
        END])


def write_markdown(path: Path, body: str) -> None:
    replace_section(path, BEGIN, END, body, "End to end on a local OpenPBS complex")
