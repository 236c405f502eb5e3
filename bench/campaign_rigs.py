"""The clusters the fault campaign (bench/campaign.py) runs on: a local Slurm cluster or a
local OpenPBS complex, one malletraind, in-place training jobs whose checkpoint folders are
small tmpfs mounts of their own (so that a full checkpoint folder is a real ENOSPC), and the
handles the faults need: the jobs' running tasks, their launcher and training processes, the
daemon, prod jobs, the tasks a job lost and the grants the daemon timed out."""

from __future__ import annotations

import contextlib
import random
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.e2e_paths import lost_tasks
from bench.sections import say
from devtools.localcluster import LocalCluster
from devtools.localcluster import faults as slurm_faults
from devtools.localcluster.daemon import LocalDaemon
from devtools.localcluster.procs import kill

REPO = Path(__file__).resolve().parents[1]
BATCH = 8
TRAIN = [sys.executable, "tests/workers/inplace_train.py", "--batch", str(BATCH),
         "--sleep", "0.15", "--checkpoint-every-s", "4"]
CKFS_SIZE = "4m"
"""A checkpoint folder's tmpfs: a checkpoint of the test model takes a few dozen KB."""
LAUNCHER, TRAINER = "malletrain_core.worker.launcher", "inplace_train.py"


def pids_of(marker: str, env_match: dict[str, str], unless: str = "") -> list[int]:
    """Processes whose command line holds ``marker`` (and not ``unless``: the launcher's
    holds the training command too) and whose environment has every ``env_match`` item (a
    value ending in ``*``: a prefix)."""
    found = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            cmd = (p / "cmdline").read_bytes()
            if marker.encode() not in cmd or (unless and unless.encode() in cmd):
                continue
            raw = (p / "environ").read_bytes()
        except OSError:
            continue
        env = dict(item.decode(errors="replace").split("=", 1) for item in raw.split(b"\0")
                   if b"=" in item)
        if all(env.get(k, "").startswith(v[:-1]) if v.endswith("*") else env.get(k) == v
               for k, v in env_match.items()):
            found.append(int(p.name))
    return found


def mount_tmpfs(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={CKFS_SIZE},mode=0777",
                    "campaign-ckpt", str(path)], check=True, capture_output=True)


def umount(path: Path) -> None:
    subprocess.run(["umount", "-l", str(path)], check=False, capture_output=True)


class Rig:
    """What both batch systems give the campaign; ``jobs`` are the elastic jobs' ids as their
    output files name them (``task-JOB_INDEX.out``)."""

    name = ""
    stalled_line = re.compile(r"$^")
    classes: tuple[str, ...] = ()

    def __init__(self, nodes: int, jobs: int, max_nodes: int) -> None:
        self.nodes, self.njobs, self.max_nodes = nodes, jobs, max_nodes
        self.work = Path(tempfile.mkdtemp(prefix=f"malletrain-campaign-{self.name}-",
                                          dir=self._base()))
        self.work.chmod(0o755)
        self.outdir = self.work / "out"
        self.outdir.mkdir()
        self.outdir.chmod(0o777)
        self.jobs: list[str] = []
        self.ckfs: dict[str, Path] = {}
        self.mounts: list[Path] = []
        self.prods: list[str] = []

    def _base(self) -> str | None:
        return None

    def add_job(self) -> str:
        """Submit one more in-place job, its checkpoint folder on a tmpfs of its own."""
        ckfs = self.work / f"ckfs{len(self.mounts)}"
        mount_tmpfs(ckfs)
        self.mounts.append(ckfs)
        job = self._submit(ckfs)
        self.jobs.append(job)
        self.ckfs[job] = ckfs
        return job

    def replace_job(self, job: str) -> str:
        """A job that ended: another one takes its place (the campaign goes on)."""
        self.jobs.remove(job)
        return self.add_job()

    def stop(self) -> None:
        """The daemon, then the batch system (whichever started), then the tmpfs mounts."""
        for name in ("daemon", "cluster", "cx"):
            part = getattr(self, name, None)
            if part is not None:
                with contextlib.suppress(Exception):
                    part.stop()
        for path in self.mounts:
            umount(path)

    def daemon_log(self) -> str:
        raise NotImplementedError

    def stalled(self, log: str) -> list[str]:
        """The daemon's lines for grants whose task was not running by the grant deadline."""
        return [" ".join(m.groups()) for m in self.stalled_line.finditer(log)]

    # each backend's own
    def start(self) -> None:
        raise NotImplementedError

    def _submit(self, ckfs: Path) -> str:
        raise NotImplementedError

    def running(self, job: str) -> dict[str, str]:
        """Running tasks of ``job``: task index → node."""
        raise NotImplementedError

    def task_env(self, job: str, index: str) -> dict[str, str]:
        raise NotImplementedError

    def alive(self, job: str) -> bool:
        raise NotImplementedError

    def lost(self, job: str) -> list[str]:
        raise NotImplementedError

    def kill_daemon(self) -> None:
        raise NotImplementedError

    def start_daemon(self) -> None:
        raise NotImplementedError

    def prod(self, nodes: int, seconds: int) -> None:
        raise NotImplementedError

    def prods_active(self) -> int:
        raise NotImplementedError


class SlurmRig(Rig):
    """A local Slurm cluster (test timings), one malletraind, in-place jobs of ``-N 1-MAX``."""

    name = "slurm"
    stalled_line = re.compile(r"grant of (\S+) to job (\S+) \(task (\S+)\) not running after")
    classes = ("daemon_kill", "launcher_kill", "train_kill", "slurmd_kill", "slurmctld_restart",
               "ckpt_full", "sigstop")

    def start(self) -> None:
        self.cluster = LocalCluster(nodes=self.nodes, root=self.work / "cluster")
        self.cluster.start()
        # the campaign makes tasks fail on purpose: a job must not be stopped for it
        self.daemon = LocalDaemon(self.cluster, root=self.work / "daemon", settings={
            "profiler": {"enabled": False},
            "slurm": {"task_failures_max": 100000}})
        self.daemon.start()
        for _ in range(self.njobs):
            self.add_job()

    def _submit(self, ckfs: Path) -> str:
        script = self.daemon.training_script(TRAIN, ckfs, inplace=True)
        script = script.replace("\n", f"\nexport PYTHONPATH={shlex.quote(str(REPO))}\n", 1)
        return self.cluster.sbatch("--qos=malletrain", "-N", f"1-{self.max_nodes}",
                                   "--open-mode=append", "--comment=profile=no",
                                   "-o", f"{self.outdir}/task-%A_%a.out", script=script)

    def _q(self, *argv: str) -> str:
        return self.cluster.run(list(argv), check=False, timeout_s=20).stdout

    def running(self, job: str) -> dict[str, str]:
        out = self._q("squeue", "-h", "-r", "-j", job, "-t", "R", "-o", "%i|%N")
        rows = [ln.split("|") for ln in out.splitlines() if "|" in ln]
        return {i.split("_", 1)[1]: n for i, n in rows if "_" in i and n}

    def task_env(self, job: str, index: str) -> dict[str, str]:
        return {"SLURM_ARRAY_JOB_ID": job, "SLURM_ARRAY_TASK_ID": index}

    def alive(self, job: str) -> bool:
        return bool(self._q("squeue", "-h", "-j", job, "-o", "%i").strip())

    def lost(self, job: str) -> list[str]:
        return lost_tasks(self.cluster, job)

    def daemon_log(self) -> str:
        return self.daemon.log_text()

    def kill_daemon(self) -> None:
        self.daemon.kill()

    def start_daemon(self) -> None:
        self.daemon.start()

    def prod(self, nodes: int, seconds: int) -> None:
        self.prods.append(self.cluster.sbatch("-p", "prod", "-N", str(nodes), "-o", "/dev/null",
                                              "--wrap", f"sleep {seconds}"))

    def prods_active(self) -> int:
        if not self.prods:
            return 0
        out = self._q("squeue", "-h", "-j", ",".join(self.prods), "-o", "%i")
        self.prods = [p for p in self.prods if p in out.split()]
        return len(self.prods)

    # node faults
    def kill_slurmd(self, node: str) -> int:
        pid = slurm_faults.slurmd_pid(self.cluster, node)
        if pid is None:
            raise RuntimeError(f"slurmd of {node} is not running")
        kill(pid, signal.SIGKILL)
        return pid

    def start_slurmd(self, node: str) -> None:
        if slurm_faults.slurmd_pid(self.cluster, node) is None:
            self.cluster.run(self.cluster.release.daemon_argv(
                "slurmd", "-N", node, "-f", str(self.cluster.conf_path)))
        state = self._q("sinfo", "-h", "-n", node, "-o", "%T").strip()
        if state.startswith(("down", "drain", "fail")):
            self.cluster.run(["scontrol", "update", f"NodeName={node}", "State=RESUME"],
                             check=False)

    def restart_controller(self, down_s: float) -> None:
        slurm_faults.stop_controller(self.cluster)
        time.sleep(down_s)
        slurm_faults.start_controller(self.cluster)


class PbsRig(Rig):
    """A local OpenPBS complex (server and moms in network namespaces), one malletraind in
    the server's namespace, in-place jobs of ``-J 1-MAX``."""

    name = "pbs"
    stalled_line = re.compile(r"grant of (\S+) to job (\S+): subjob (\S+) not running after")
    classes = ("daemon_kill", "launcher_kill", "train_kill", "ckpt_full", "sigstop")
    QUIET = ("-o", "/dev/null", "-e", "/dev/null")

    def _base(self) -> str | None:
        from devtools.localcluster.pbs_helpers import complex_root
        self.root = complex_root()
        return str(self.root)

    def start(self) -> None:
        from devtools.localcluster.pbs import PbsComplex
        from devtools.localcluster.pbs_helpers import start_daemon
        self.cx = PbsComplex(moms=self.nodes, root=self.root)
        self.cx.start()
        self.cx.install_malletrain(freq_s=3)
        self.cx.qmgr("set server acl_roots = root")
        self.daemon = start_daemon(self.cx, poll_s=2.0, in_server_ns=True,
                                   extra_toml="[profiler]\nenabled = false\n")
        self.arrays: dict[str, str] = {}
        for _ in range(self.njobs):
            self.add_job()

    def _submit(self, ckfs: Path) -> str:
        from devtools.localcluster.pbs_helpers import job_number
        launcher = " ".join([sys.executable, "-m", LAUNCHER, "--poll-s", "1", "--inplace"])
        script = (f"#!/bin/bash\ncd {REPO}\nexport PYTHONPATH={REPO}\nn=${{PBS_ARRAY_ID%%[*}}\n"
                  f'exec >> {self.outdir}/task-"$n"_"$PBS_ARRAY_INDEX".out 2>&1\n'
                  f'exec {launcher} --checkpoint-dir {ckfs}/ckpt-"$n" -- {shlex.join(TRAIN)}\n')
        array = self.cx.qsub("-q", "malletrain", "-J", f"1-{self.max_nodes}", "-l",
                             "select=1:ncpus=2", *self.QUIET, "-v",
                             f"MALLETRAIN_PROFILE=0,MALLETRAIN_DAEMON={self.daemon.address}",
                             script=script)
        num = job_number(array)
        self.arrays[num] = array
        return num

    def _subjobs(self, job: str) -> dict[str, dict[str, Any]]:
        from devtools.localcluster.pbs_helpers import subjob
        array = self.arrays[job]
        try:
            got = self.cx.jobs(*(subjob(array, i) for i in range(1, self.max_nodes + 1)))
        except Exception:  # a qstat that failed: no view this time
            return {}
        return {k.split("[", 1)[1].split("]", 1)[0]: dict(v) for k, v in got.items()}

    def running(self, job: str) -> dict[str, str]:
        return {i: str(v.get("exec_vnode", "")).strip("()").split(":", 1)[0]
                for i, v in self._subjobs(job).items() if v.get("job_state") == "R"}

    def task_env(self, job: str, index: str) -> dict[str, str]:
        return {"PBS_JOBID": f"{job}[{index}]*"}

    def alive(self, job: str) -> bool:
        try:
            st = self.cx.jobs(self.arrays[job], subjobs=False).get(self.arrays[job], {})
        except Exception:
            return True
        return st.get("job_state") not in ("F", "X", None)

    def lost(self, job: str) -> list[str]:
        return [f"{job}[{i}] {v.get('job_state')} exit {v.get('Exit_status', '?')}"
                for i, v in self._subjobs(job).items() if v.get("job_state") in ("X", "F")]

    def daemon_log(self) -> str:
        try:
            return self.daemon.log.read_text(errors="replace")
        except OSError:
            return ""

    def kill_daemon(self) -> None:
        self.daemon.kill()

    def start_daemon(self) -> None:
        self.daemon.restart()

    def prod(self, nodes: int, seconds: int) -> None:
        self.prods.append(self.cx.qsub("-q", "prod", "-l", f"select={nodes}:ncpus=2", "-l",
                                       "place=scatter", *self.QUIET,
                                       script=f"sleep {seconds}\n"))

    def prods_active(self) -> int:
        if not self.prods:
            return 0
        try:
            got = self.cx.jobs(*self.prods, subjobs=False)
        except Exception:
            return len(self.prods)
        self.prods = [p for p in self.prods
                      if got.get(p, {}).get("job_state") not in ("F", "X", None)]
        return len(self.prods)


class Churn(threading.Thread):
    """Prod jobs of 1-2 nodes, 10-40 s each, every 4-10 s, at most two at a time."""

    def __init__(self, rig: Rig, seed: int) -> None:
        super().__init__(daemon=True)
        self.rig, self.rng, self.done = rig, random.Random(seed), threading.Event()
        self.submitted = 0

    def run(self) -> None:
        while not self.done.is_set():
            try:
                if self.rig.prods_active() < 2:
                    self.rig.prod(self.rng.choice((1, 1, 2)), self.rng.randint(10, 40))
                    self.submitted += 1
            except Exception as exc:  # a controller being restarted: try again later
                say(f"churn: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}")
            self.done.wait(self.rng.uniform(4, 10))
