"""Capture the golden Slurm outputs that tests/test_slurm_*.py replay.

Starts a private 4-node local cluster (the project's slurm.conf and job_submit.lua), plays
one elastic job's life — submit, grow, admin hold, preemption, shrink, a backfill plan, a
time-out, scancel — and after each step stores exactly what SlurmBackend's poll reads
(``<step>.sinfo``, ``<step>.squeue``, ``<step>.plan``) under ``<version>/`` beside this file,
e.g. ``22.05/``. From 24.11 on (``squeue --json`` honours its filters there) also the JSON forms
of two moments: ``06_planned.squeue.json`` (``squeue --json``, the same query as the text)
and ``show_job.json`` (``scontrol show job --json``, beside ``show_job.txt``). Run it as root
on a machine with Slurm installed, once per Slurm version:

    python3 tests/golden/slurm/capture.py            # about two minutes (a 1-minute time-out)

Then check that the replay tests still describe what Slurm did.
"""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))

from devtools.localcluster import LocalCluster  # noqa: E402
from malletrain_core.backends.slurm import parse as sp  # noqa: E402
from malletrain_core.backends.slurm.release import SlurmRelease  # noqa: E402

SCRIPT = "#!/bin/sh\nexec sleep 600\n"


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="mt-golden-") as tmp:
        cluster = LocalCluster(nodes=4, root=tmp)
        cluster.start()
        try:
            version = cluster.run(["sinfo", "--version"]).stdout.split()[-1]
            dest = HERE / ".".join(version.split(".")[:2])
            dest.mkdir(exist_ok=True)
            play(cluster, dest, SlurmRelease.parse(version).json_filters)
            print(f"captured Slurm {version} into {dest.relative_to(HERE.parents[2])}")
        finally:
            cluster.stop()
    return 0


def play(c: LocalCluster, dest: Path, json_forms: bool) -> None:
    def cap(step: str) -> None:
        for suffix, argv in (
                ("sinfo", ["sinfo", "-h", "-N", "-p", "preemptable", "-o", sp.SINFO_FORMAT]),
                ("squeue", ["squeue", "-h", "-r", "-t", "all", "-p", "preemptable",
                            "-O", sp.SQUEUE_FORMAT]),
                ("plan", ["squeue", "-h", "-t", "PD", "--start", "-o", sp.PLAN_FORMAT])):
            (dest / f"{step}.{suffix}").write_text(c.run(argv).stdout)

    def state(task: str) -> str:
        return c.run(["squeue", "-h", "-j", task, "-t", "all", "-o", "%T|%r|%N"]).stdout.strip()

    def wait(task: str, pattern: str, timeout_s: float = 30) -> None:
        c.wait_for(f"{task} {pattern}", lambda: re.match(pattern, state(task)) is not None,
                   timeout_s)

    def grow(task: str, node: str, minutes: int) -> None:
        c.run(["scontrol", "update", f"JobId={task}", f"ReqNodeList={node}", "StartTime=now",
               f"TimeLimit={minutes}"])
        c.run(["scontrol", "release", task])

    sb = ("-o", "/dev/null", "--chdir=/")
    a = c.sbatch("--qos=malletrain", "-N", "1-3", *sb, script=SCRIPT)
    b = c.sbatch("--qos=malletrain", "-N", "2-2", "--comment=model=resnet50,profile=no", *sb,
                 script=SCRIPT)
    c.sbatch("-p", "prod", "-w", "n01", "-t", "30", *sb, script=SCRIPT)
    wait(f"{b}_1", "PENDING")
    cap("01_submitted")
    grow(f"{a}_0", "n02", 60)
    grow(f"{a}_1", "n03", 60)
    wait(f"{a}_0", "RUNNING")
    wait(f"{a}_1", "RUNNING")
    cap("02_running_unheld")
    c.run(["scontrol", "hold", f"{a}_[0-1]"])
    cap("03_running")
    p2 = c.sbatch("-p", "prod", "-w", "n03", "-t", "30", *sb, script=SCRIPT)
    wait(f"{a}_1", "PENDING")
    wait(p2, "RUNNING")
    cap("04_preempted")
    c.run(["scontrol", "requeuehold", f"{a}_0"])
    wait(f"{a}_0", "PENDING")
    cap("05_shrunk")
    res = c.run(["scontrol", "release", f"{a}_[7,8]"], check=False)
    (dest / "07_release_errors.stderr").write_text(res.stderr)
    (dest / "show_job.txt").write_text(c.run(["scontrol", "-o", "show", "job", f"{a}_0"]).stdout)
    if json_forms:
        (dest / "show_job.json").write_text(c.run(["scontrol", "show", "job", "--json",
                                                   f"{a}_0"]).stdout)
    p3 = c.sbatch("-p", "prod", "-N", "4", "-t", "30", *sb, script=SCRIPT)
    c.wait_for("nodes planned", lambda: "planned" in c.run(
        ["sinfo", "-h", "-N", "-p", "preemptable", "-o", "%T"]).stdout, 30)
    cap("06_planned")
    if json_forms:
        (dest / "06_planned.squeue.json").write_text(c.run(
            ["squeue", "--json", "-r", "-t", "all", "-p", "preemptable"]).stdout)
    c.run(["scancel", p3, p2])
    c.wait_for("n03 idle", lambda: c.run(["sinfo", "-h", "-n", "n03", "-o", "%T"]).stdout.strip()
               == "idle", 30)
    grow(f"{a}_0", "n02", 60)
    grow(f"{a}_2", "n04", 1)
    wait(f"{a}_2", "RUNNING")
    wait(f"{a}_0", "RUNNING")
    c.run(["scontrol", "hold", f"{a}_[0,2]"])
    cap("08_before_timeout")
    wait(f"{a}_2", "TIMEOUT", timeout_s=120)
    cap("09_timeout")
    c.run(["scontrol", "requeuehold", f"{a}_2"])
    wait(f"{a}_2", "PENDING")
    cap("10_timeout_requeued")
    c.run(["scancel", a])
    wait(f"{a}_0", "CANCELLED")
    cap("11_cancelled")


if __name__ == "__main__":
    sys.exit(main())
