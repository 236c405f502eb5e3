"""Where a prod job's start on MalleTrain's workers spends its time, from PBS's own logs.

    python -m bench.pbs_prod_trace [--submissions 30] [--plain] [--out trace.txt]

bench/e2e_pbs.py's phase 2 (and, with ``--plain``, phase 3) on a fresh complex whose daemons
log with microsecond timestamps (``PBS_LOG_HIGHRES_TIMESTAMP=1``): one-node prod jobs, one at a
time, each preempting a worker. For every submission it prints the delay from ``qsub`` to
qstat showing it running and the server, scheduler and mom log lines (PBS's per-request
lines left out) between the submission and the start, as offsets from the submission, so that
a slow start shows which step waited.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

if __name__ == "__main__" and not __package__:  # started as a file; bench/ is a package
    sys.exit("run it as a module from the repository's root: python -m bench.pbs_prod_trace "
             + " ".join(sys.argv[1:]))
from bench.e2e_common import wait  # noqa: E402
from bench.e2e_pbs import IDLE, MOMS, QUIET, ended, running_subjobs, state_of  # noqa: E402
from bench.sections import say  # noqa: E402
from devtools.localcluster.pbs import PbsComplex  # noqa: E402
from devtools.localcluster.pbs_helpers import complex_root, start_daemon  # noqa: E402

NOISE = ("tpp_mbox_read", "request received from", "Type 0 request", "Compiling script file",
         "Server@pbsserver;Svr;Server@pbsserver;attributes")


class TracedComplex(PbsComplex):
    """The test complex, its daemons logging with microseconds."""

    def _conf_text(self, home: Path, node: str | None) -> str:
        return super()._conf_text(home, node) + "PBS_LOG_HIGHRES_TIMESTAMP=1\n"


def log_lines(cx: PbsComplex) -> list[tuple[float, str, str]]:
    """(epoch seconds, which log, line) of every server, scheduler and mom log line."""
    sources = [("server", cx.home() / "server_logs"), ("sched", cx.home() / "sched_logs")]
    sources += [(f"mom {n}", cx.home(n) / "mom_logs") for n in cx.node_names]
    out = []
    for name, folder in sources:
        for path in sorted(folder.glob("*")):
            for line in path.read_text(errors="replace").splitlines():
                stamp = line.split(";", 1)[0]
                try:
                    t = datetime.strptime(stamp, "%m/%d/%Y %H:%M:%S.%f").timestamp()
                except ValueError:
                    continue
                if not any(n in line for n in NOISE):
                    out.append((t, name, line.split(";", 1)[1]))
    return sorted(out)


def starts(cx: PbsComplex, n: int, ready: Any) -> list[tuple[str, float, float]]:
    """(prod job id, wall-clock submission, seconds to running) for ``n`` one-node prod
    jobs, each submitted once ``ready()`` holds."""
    done = []
    for _ in range(n):
        ready()
        t_wall, t0 = time.time(), time.monotonic()
        prod = cx.qsub("-q", "prod", "-l", "select=1:ncpus=2", *QUIET, script="sleep 1\n")
        t1 = wait("prod running", lambda p=prod: state_of(cx, p) in ("R", "E", "F", "X"), 60,
                  0.05)
        done.append((prod, t_wall, t1 - t0))
        wait("prod ended", lambda p=prod: ended(cx, p), 60, 0.2)
    return done


def report(title: str, runs: list[tuple[str, float, float]],
           lines: list[tuple[float, str, str]]) -> str:
    delays = [d for _, _, d in runs]
    text = [f"== {title}: median {statistics.median(delays):.2f} s, all "
            + ", ".join(f"{d:.2f}" for d in delays)]
    for prod, t_wall, delay in runs:
        text.append(f"-- {prod}: running {delay:.2f} s after qsub")
        text += [f"  {t - t_wall:+7.3f} {src:7s} {line}" for t, src, line in lines
                 if t_wall - 0.05 <= t <= t_wall + delay + 0.05]
    return "\n".join(text)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--submissions", type=int, default=30)
    ap.add_argument("--plain", action="store_true",
                    help="also the baseline: plain preemptable jobs on the same nodes")
    ap.add_argument("--out", type=Path, help="write the trace here (default: stdout)")
    args = ap.parse_args()
    cx = TracedComplex(moms=MOMS, root=complex_root())
    cx.start()
    cx.install_malletrain(freq_s=3)
    cx.qmgr("set server acl_roots = root")  # as bench/e2e_pbs.py: jobs submitted as root
    daemon = start_daemon(cx, poll_s=2.0, in_server_ns=True,
                          extra_toml="[profiler]\nwindow_s = 15.0\n")
    plain: list[tuple[str, float, float]] = []
    try:
        blocker = cx.qsub("-q", "prod", "-l", f"select={MOMS - IDLE}:ncpus=2", "-l",
                          "place=scatter", *QUIET, script="sleep 100000\n")
        wait("blocker running", lambda: state_of(cx, blocker) == "R", 60)
        standin = cx.qsub("-q", "malletrain", "-J", f"1-{IDLE}", "-l", "select=1:ncpus=2",
                          *QUIET, "-v", "MALLETRAIN_PROFILE=0", script="exec sleep 100000\n")
        say(f"{args.submissions} prod jobs preempting MalleTrain's stand-in workers")
        with_mt = starts(cx, args.submissions, lambda: wait(
            "all idle nodes harvested", lambda: running_subjobs(cx, standin, IDLE) == IDLE,
            90, 0.2))
        daemon.stop()
        if args.plain:
            cx.run(["qdel", "-Wforce", standin])
            wait("workers gone", lambda: ended(cx, standin), 60, 0.5)
            say(f"{args.submissions} prod jobs preempting plain preemptable jobs")
            jobs = [cx.qsub("-q", "preemptable", "-l", "select=1:ncpus=2", *QUIET,
                            script="sleep 100000\n") for _ in range(IDLE)]
            plain = starts(cx, args.submissions, lambda: wait(
                "plain jobs on all idle nodes",
                lambda: sum(state_of(cx, j) == "R" for j in jobs) == IDLE, 90, 0.2))
        lines = log_lines(cx)
    finally:
        daemon.stop()
        cx.stop()
        shutil.rmtree(cx.root, ignore_errors=True)
    text = report("prod starts on MalleTrain's workers", with_mt, lines)
    if plain:
        text += "\n" + report("prod starts on plain preemptable jobs", plain, lines)
    if args.out:
        args.out.write_text(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
