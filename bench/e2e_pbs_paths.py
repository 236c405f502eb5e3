"""In-place pauses on a real OpenPBS complex: bench/e2e.py's phase 4 (bench/e2e_paths.py) for PBS.

    python -m bench.e2e_pbs_paths --json
    python -m bench.e2e_pbs_paths --markdown BENCHMARKS.md

A complex of 8 moms (test timings: queue kill_delay 2 s, mom poll 1-2 s), a prod job holding
4 of them, one malletraind in the server's namespace (poll 2 s, hooks on, profiler off,
``allocator.min_share = 1``), and one in-place job of ``-J 1-4`` on the 4 idle vnodes
(tests/workers/inplace_train.py under ``malletrain-run --inplace``, gloo, a step every
0.05 s or so). ``--rounds`` rounds of:

* **preemption** 4 → 3: a one-vnode prod job pinned to one of the job's vnodes (PBS requeues
  that subjob: ``preempt_order = R``);
* **grow** 3 → 4: the prod job is deleted;
* **planned shrink** 4 → 2: a second MalleTrain job (a stand-in that sleeps) takes its share;
* **grow** 2 → 4: the stand-in is deleted.

Per change, as on Slurm: the *pause* of the members that lived through it (the gap between
their last step before and their first after, the median over them), the *steps lost*, and for
a grow *node idle → training* (from qstat showing the prod job or stand-in gone to the first
step at the larger world size).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from bench.e2e_common import wait
from bench.e2e_paths import STANDIN, TRAIN, summarize, world_epoch
from bench.e2e_pbs import ended, state_of, training_script
from bench.sections import host, replace_section, say
from devtools.localcluster.pbs import PbsComplex
from devtools.localcluster.pbs_helpers import complex_root, job_number, start_daemon, subjob
from devtools.runlogs.inplace_logs import read

BEGIN, END = "<!-- e2e-pbs-inplace:begin -->", "<!-- e2e-pbs-inplace:end -->"
MOMS, IDLE = 8, 4
QUIET = ("-o", "/dev/null", "-e", "/dev/null")


def running(cx: PbsComplex, array: str, size: int) -> list[str]:
    """The vnodes of ``array``'s running subjobs."""
    got = cx.jobs(*(subjob(array, i) for i in range(1, size + 1)))
    return sorted(str(v.get("exec_vnode", "")).strip("()").split(":", 1)[0]
                  for v in got.values() if v.get("job_state") == "R")


class Timeline(threading.Thread):
    """What qstat shows of the job's subjobs every 0.05 s (state, substate), each change with
    its wall-clock time: how PBS's requeue of a preempted subjob looks to a poll."""

    def __init__(self, cx: PbsComplex, array: str, out: list[tuple[float, str, str, str]]):
        super().__init__(daemon=True)
        self.cx, self.array, self.out, self.done = cx, array, out, threading.Event()
        self.start()

    def run(self) -> None:
        last: dict[str, tuple[str, str]] = {}
        while not self.done.wait(0.05):
            try:
                got = self.cx.jobs(*(subjob(self.array, i) for i in range(1, IDLE + 1)))
            except Exception:  # noqa: BLE001 - a failed qstat: no sample this time
                continue
            t = time.time()
            for k, v in got.items():
                now = (str(v.get("job_state")), str(v.get("substate")))
                if last.get(k) != now:
                    last[k] = now
                    self.out.append((round(t, 3), k.split("[", 1)[1].split("]", 1)[0], *now))

    def stop(self) -> None:
        self.done.set()
        self.join(5)


def one_job(cx: PbsComplex, address: str, work: Path, rounds: int) -> dict[str, Any]:
    outdir = work / "out-inplace"
    outdir.mkdir()
    outdir.chmod(0o777)
    array = cx.qsub("-q", "malletrain", "-J", f"1-{IDLE}", "-l", "select=1:ncpus=2", *QUIET,
                    "-v", f"MALLETRAIN_PROFILE=0,MALLETRAIN_DAEMON={address}",
                    script=training_script(outdir, TRAIN, inplace=True))
    num = job_number(array)

    def at_world(world: int, after: int, timeout_s: float = 240.0) -> int:
        return world_epoch(outdir, num, world, after, lambda: len(running(cx, array, IDLE)),
                           timeout_s)

    e = at_world(IDLE, -1, 300)
    say(f"in-place job {array} trains on {IDLE} vnodes (epoch {e})")
    load = [os.getloadavg()[0]]
    done: dict[str, list[tuple[int, int, float | None]]] = {"preempt": [], "grow": [],
                                                           "shrink": []}

    def to(world: int, kind: str, t_idle: float | None = None) -> None:
        nonlocal e
        nxt = at_world(world, e)
        done[kind].append((e, nxt, t_idle))
        e = nxt

    def free(other: str) -> float:
        """Delete ``other``; the wall-clock time qstat shows it gone."""
        cx.run(["qdel", "-Wforce", other])
        wait(f"job {other} gone", lambda: ended(cx, other), 60, 0.05)
        return time.time()

    timeline: list[tuple[float, str, str, str]] = []
    for r in range(rounds):
        vnode = running(cx, array, IDLE)[-1]
        watch = Timeline(cx, array, timeline) if r == 0 else None
        prod = cx.qsub("-q", "prod", "-l", f"select=1:ncpus=2:vnode={vnode}", *QUIET,
                       script="sleep 100000\n")
        to(IDLE - 1, "preempt")
        if watch is not None:
            watch.stop()
        to(IDLE, "grow", free(prod))
        standin = cx.qsub("-q", "malletrain", "-J", "1-2", "-l", "select=1:ncpus=2", *QUIET,
                          "-v", "MALLETRAIN_PROFILE=0", script=STANDIN)
        to(IDLE - 2, "shrink")
        to(IDLE, "grow", free(standin))
        load.append(os.getloadavg()[0])
        say(f"round {r + 1}/{rounds} done")
    lost = [f"{k} {v.get('job_state')} exit {v.get('Exit_status', '?')}"
            for k, v in cx.jobs(*(subjob(array, i) for i in range(1, IDLE + 1))).items()
            if v.get("job_state") in ("X", "F")]
    cx.run(["qdel", "-Wforce", array])
    wait("training job gone", lambda: ended(cx, array), 60, 0.5)
    out = summarize(read(outdir, num), {}, done, load)
    out.pop("preempt_paths"), out.pop("grow_paths"), out.pop("shrink_paths")
    out["lost_subjobs"] = lost
    out["preempt_timeline"] = timeline
    return out


def run(rounds: int, keep: bool = False, log_level: str = "info") -> dict[str, Any]:
    cx = PbsComplex(moms=MOMS, root=complex_root())
    work = Path(tempfile.mkdtemp(prefix="e2e-paths-", dir=cx.root))
    work.chmod(0o755)
    say(f"starting a PBS complex of {MOMS} moms in {cx.root}")
    cx.start()
    cx.install_malletrain(freq_s=3)
    cx.qmgr("set server acl_roots = root")  # the torch of this machine: a root-only Python
    daemon = start_daemon(cx, poll_s=2.0, in_server_ns=True,
                          extra_toml="[profiler]\nenabled = false\n"
                                     "[allocator]\nmin_share = 1.0\n", log_level=log_level)
    try:
        blocker = cx.qsub("-q", "prod", "-l", f"select={MOMS - IDLE}:ncpus=2", "-l",
                          "place=scatter", *QUIET, script="sleep 100000\n")
        wait("blocker running", lambda: state_of(cx, blocker) == "R", 60)
        r = one_job(cx, daemon.address, work, rounds)
    finally:
        daemon.stop()
        cx.stop()
        if keep:
            say(f"kept the complex's folder (the daemon's log, the workers' output): {cx.root}")
        else:
            shutil.rmtree(cx.root, ignore_errors=True)
    return {"moms": MOMS, "idle": IDLE, "rounds": rounds, "inplace": r}


def machine() -> str:
    return host("OpenPBS 23.06.06")


def section(r: dict[str, Any], command: str) -> str:
    p = r["inplace"]

    def row(what: str, key: str) -> str:
        xs = p[f"{key}_pause_s_all"]
        return (f"| {what} | {p[f'{key}_pause_s']:.3f} s | {', '.join(f'{x:.3f}' for x in xs)}"
                f" | {max(p[f'{key}_steps_lost_all'])} |")

    return "\n".join([
        BEGIN,
        f"Measured {r['date']} on {r['machine']}, with `{command}` (a complex of {r['moms']} "
        "moms in network namespaces, test timings: queue kill_delay 2 s, mom poll 1-2 s; "
        "malletraind polling every 2 s, hooks on; one in-place job of `-J 1-4`, "
        "tests/workers/inplace_train.py, gloo).",
        "",
        "| change (in place) | pause, median | all | steps lost, most |",
        "|---|---:|---|---:|",
        row("one-vnode preemption 4 → 3 (PBS requeues the subjob)", "preempt"),
        row("grow 3 → 4 and 2 → 4", "grow"),
        row("planned shrink 4 → 2", "shrink"),
        "",
        f"Grow, vnode free (qstat) → first step at the larger size: median "
        f"{p['idle_to_training_s']:.2f} s (all: "
        f"{', '.join(f'{x:.2f}' for x in p['idle_to_training_s_all'])} s). 1-min load "
        f"{', '.join(str(x) for x in p['load_1min'])}; subjobs lost for good: "
        f"{len(p['lost_subjobs'])}.",
        END])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3, help="preempt/grow/shrink/grow rounds")
    p.add_argument("--json", action="store_true", help="print only the JSON")
    p.add_argument("--markdown", metavar="FILE", help="rewrite this section of FILE")
    p.add_argument("--keep", action="store_true",
                   help="keep the complex's folder: the daemon's log, the workers' output")
    p.add_argument("--log-level", default="info", choices=("debug", "info"),
                   help="the daemon's log level (with --keep: debug shows every poll)")
    a = p.parse_args(argv)
    if os.geteuid() != 0:
        print("bench.e2e_pbs_paths: needs root (network namespaces, pbs_iff): run it as root "
              "after `MALLETRAIN_PBS=1 bash scripts/setup-machine.sh`", file=sys.stderr)
        return 2
    r = run(a.rounds, a.keep, a.log_level)
    r["date"] = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    r["machine"] = machine()
    command = "python -m bench.e2e_pbs_paths" + (f" --rounds {a.rounds}" if a.rounds != 3
                                                 else "")
    if a.markdown:
        replace_section(Path(a.markdown), BEGIN, END, section(r, command),
                        "In-place pauses on a local OpenPBS complex")
    print(json.dumps(r) if a.json else section(r, command))
    return 0


if __name__ == "__main__":
    sys.exit(main())
