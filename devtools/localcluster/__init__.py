"""A real multi-node Slurm cluster on one host: the embedded default, the tests' cluster.

Debian's Slurm is built with multiple-slurmd support: one ``slurmd -N nXX`` per virtual node,
each on its own port, all on 127.0.0.1, with a private munged (own key, own socket). Ports
are derived from a *port base* (slurmctld = base, slurmdbd = base + 1, MariaDB = base + 2,
node i = base + 2 + i), so several clusters can run side by side on one host. Everything
lives under one root directory; :meth:`LocalCluster.stop` stops only the processes named by
its PID files (and checks that each still is the process it started).

Two modes: ``partition`` (a ``prod`` partition with PriorityTier=10 preempts ``preemptable``,
no accounting) and ``accounting`` (MariaDB + slurmdbd, a ``malletrain`` QOS, preempt/qos; see
:mod:`devtools.localcluster.accounting`).

Kept in one module (over 400 lines) on purpose: the cluster's start, stop and state file
follow one another over one set of paths and ports.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import string
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from malletrain_core.backends.slurm.backend import grant_timeout_for, hole_margin_for
from malletrain_core.backends.slurm.parse import parse_scontrol_show_job
from malletrain_core.errors import CommandError, ConfigError, MalleTrainError
from malletrain_core.runner import CommandRunner, Result

from ..waiting import NotReached, wait_until
from .procs import (
    PORT_RANGE,
    ClusterError,
    PhaseClock,
    choose_port_base,
    comm,
    kill,
    munge_dir_for,
    pid_alive,
    port_free,
    start_or_clean_up,
)
from .releases import Release, release

REPO = Path(__file__).resolve().parents[2]
TEMPLATE = REPO / "slurm_conf" / "local" / "slurm.conf.in"
JOB_SUBMIT_LUA = REPO / "plugin" / "job_submit.lua"
EPILOG = REPO / "plugin" / "epilog_slurmctld"
MODES = ("partition", "accounting")
PIDFILE_GRACE_S = 15.0


@dataclass(frozen=True)
class Timings:
    """The scheduler settings that decide how fast things happen."""

    cred_expire_s: int
    bf_interval_s: int
    batch_sched_delay_s: int
    kill_wait_s: int
    bf_resolution_s: int = 60
    """The backfill plan's time step (Slurm's default 60 s)."""

    @property
    def hole_margin_s(self) -> int:
        """What the daemon must take off a planned hole (``slurm.hole_margin_s``)."""
        return hole_margin_for(self.bf_resolution_s, self.bf_interval_s)

    @property
    def grant_timeout_s(self) -> int:
        """How long a granted task may take to start (``slurm.grant_timeout_s``)."""
        return grant_timeout_for(self.bf_interval_s, self.batch_sched_delay_s,
                                 self.kill_wait_s)


TEST_TIMINGS = Timings(cred_expire_s=10, bf_interval_s=1, batch_sched_delay_s=0, kill_wait_s=2,
                       bf_resolution_s=1)
SITE_TIMINGS = Timings(cred_expire_s=120, bf_interval_s=30, batch_sched_delay_s=3,
                       kill_wait_s=30)
"""Slurm's own defaults (cred_expire, bf_interval, KillWait) and a common batch_sched_delay."""


@dataclass
class StartReport:
    """What :meth:`LocalCluster.start` did and how long each phase took (seconds)."""

    already_running: bool
    port_base: int
    phases_s: dict[str, float] = field(default_factory=dict)

    @property
    def total_s(self) -> float:
        return sum(self.phases_s.values())


def default_root() -> Path:
    """``$MALLETRAIN_CLUSTER_DIR``, else ``.cluster`` under the checkout."""
    env = os.environ.get("MALLETRAIN_CLUSTER_DIR")
    return Path(env) if env else REPO / ".cluster"


class LocalCluster:
    """One Slurm cluster of ``nodes`` virtual nodes under ``root`` (see the module doc)."""

    def __init__(self, nodes: int = 16, mode: str = "partition", site_defaults: bool = False,
                 root: str | Path | None = None, port_base: int | None = None,
                 cpus_per_node: int = 2, hook_socket: str | Path | None = None,
                 slurm: str | Release | None = None, extra_conf: Sequence[str] = (),
                 node_epilog_s: float = 0.0) -> None:
        if not 1 <= nodes <= 512:
            raise ConfigError(f"nodes={nodes}: give between 1 and 512 virtual nodes")
        if mode not in MODES:
            raise ConfigError(f"mode={mode!r}: choose one of {', '.join(MODES)}")
        if cpus_per_node < 1:
            raise ConfigError(f"cpus_per_node={cpus_per_node}: give at least 1")
        if not 0 <= node_epilog_s <= 600:
            raise ConfigError(f"node_epilog_s={node_epilog_s!r}: give between 0 (no node "
                              "Epilog) and 600 seconds")
        self.nodes = nodes
        self.mode = mode
        self.site_defaults = site_defaults
        self.timings = SITE_TIMINGS if site_defaults else TEST_TIMINGS
        self.root = Path(root).resolve() if root is not None else default_root().resolve()
        self.port_base = port_base
        self.cpus_per_node = cpus_per_node
        self.release = slurm if isinstance(slurm, Release) else release(slurm)
        self.extra_conf = tuple(extra_conf)  # slurm.conf lines added at the end
        self.node_epilog_s = float(node_epilog_s)
        """Seconds of the node ``Epilog`` (a sleep, as a site's health check takes) slurmd runs
        at every job's end on each of its nodes; 0: none, Slurm's default."""
        self.run_dir = self.root / "run"
        self.conf_path = self.root / "etc" / "slurm.conf"
        self.hook_socket = Path(hook_socket) if hook_socket else self.run_dir / "hook.sock"
        self.munge_dir = munge_dir_for(self.root)
        self.munge_socket = self.munge_dir / "munge.socket.2"
        width = max(2, len(str(nodes)))
        self.node_names = [f"n{i:0{width}d}" for i in range(1, nodes + 1)]

    # ------------------------------------------------------------------ environment, commands
    @property
    def env(self) -> dict[str, str]:
        """The environment for Slurm commands against this cluster."""
        env = dict(os.environ)
        env["SLURM_CONF"] = str(self.conf_path)
        env["MALLETRAIN_HOOK_SOCKET"] = str(self.hook_socket)
        return self.release.env(env)

    def runner(self, timeout_s: float = 30.0) -> CommandRunner:
        return CommandRunner(timeout_s=timeout_s, env=self.env)

    def run(self, argv: Sequence[str], *, user: str | None = None, check: bool = True,
            timeout_s: float = 30.0, input: str | None = None) -> Result:
        """Run a Slurm command against this cluster, as ``user`` (through runuser) if given."""
        argv = list(argv)
        if user is not None:
            if self.release.bin_dir is not None and (self.release.bin_dir / argv[0]).is_file():
                argv[0] = str(self.release.bin_dir / argv[0])  # runuser may reset PATH
            argv = ["runuser", "-u", user, "--", "env", f"SLURM_CONF={self.conf_path}", *argv]
        return self.runner(timeout_s).run(argv, check=check, input=input)

    def sbatch(self, *args: str, user: str | None = None, script: str | None = None) -> str:
        """Submit (``--parsable``); returns the job id. ``script`` goes to sbatch's stdin."""
        res = self.run(["sbatch", "--parsable", *args], user=user, input=script)
        return res.stdout.strip().split(";", 1)[0]

    def show_jobs(self, job: str) -> list[dict[str, str]]:
        """``scontrol -o show job`` as one dict per job record (array tasks: one each)."""
        return parse_scontrol_show_job(self.run(["scontrol", "-o", "show", "job", job]).stdout)

    # ------------------------------------------------------------------ state
    @property
    def _state_file(self) -> Path:
        return self.root / "cluster.json"

    def _settings(self) -> dict[str, object]:
        epilog = {"node_epilog_s": self.node_epilog_s} if self.node_epilog_s else {}
        return {"nodes": self.nodes, "mode": self.mode, "site_defaults": self.site_defaults,
                "cpus_per_node": self.cpus_per_node, "slurm": self.release.name, **epilog}

    def _pidfiles(self) -> list[tuple[Path, str]]:
        """Every PID file this cluster may have written, with the marker that proves the
        process is ours, in stop order (slurmd, slurmctld, slurmdbd, mariadbd, munged)."""
        pids = self.run_dir / "pids"
        conf = str(self.conf_path)
        files = [(f, conf) for f in sorted(pids.glob("slurmd-*.pid"))]
        files += [(pids / "slurmctld.pid", conf), (pids / "slurmdbd.pid", conf),
                  (self.run_dir / "mysql" / "mariadbd.pid", str(self.run_dir / "mysql")),
                  (pids / "munged.pid", str(self.munge_socket))]
        return files

    def _pid(self, path: Path, marker: str) -> int | None:
        try:
            pid = int(path.read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if pid_alive(pid, marker) else None

    def is_running(self) -> bool:
        """Whether this cluster's slurmctld is up."""
        return self._pid(self.run_dir / "pids" / "slurmctld.pid", str(self.conf_path)) is not None

    # ------------------------------------------------------------------ start
    def start(self, timeout_s: float = 60.0) -> StartReport:
        """Start the cluster and wait until every node is idle; idempotent."""
        if os.geteuid() != 0:
            raise ClusterError("the local cluster runs its Slurm daemons as root "
                               "(SlurmUser=root, one slurmd per node): run it as root")
        if self.is_running():
            saved = json.loads(self._state_file.read_text())
            if saved.get("settings") != self._settings():
                raise ClusterError(f"a cluster with {saved.get('settings')} already runs in "
                                   f"{self.root}; stop it first or choose another root")
            self.port_base = int(saved["port_base"])
            return StartReport(True, self.port_base)
        for path, marker in self._pidfiles():
            if self._pid(path, marker) is not None:
                raise ClusterError(f"a daemon of an earlier cluster still runs ({path}); "
                                   f"run stop.sh with MALLETRAIN_CLUSTER_DIR={self.root}")
        if self.port_base is None:
            self.port_base = choose_port_base(self.nodes + 3)
        else:
            taken = [p for p in range(self.port_base, self.port_base + self.nodes + 3)
                     if not port_free(p)]
            if taken:
                raise ClusterError(f"port base {self.port_base}: port(s) {taken[:5]} in use "
                                   "(another cluster?); choose another base or let one be "
                                   "chosen")
        self.release.check_installed()
        self.release.write_wrappers()
        self.release.sync_users()
        report = StartReport(False, self.port_base)
        start_or_clean_up(lambda: self._start(report, timeout_s), self.dump, self.stop)
        return report

    def _start(self, report: StartReport, timeout_s: float) -> None:
        phase = PhaseClock(report.phases_s)

        shutil.rmtree(self.run_dir, ignore_errors=True)
        shutil.rmtree(self.munge_dir, ignore_errors=True)
        for sub in ("state", "log", "pids", *(f"spool/{n}" for n in self.node_names)):
            (self.run_dir / sub).mkdir(parents=True, exist_ok=True)
        self.munge_dir.mkdir(mode=0o711, parents=True)
        (self.root / "etc").mkdir(parents=True, exist_ok=True)
        self._start_munge()
        phase("munged")
        self._write_config()
        self._state_file.write_text(json.dumps(
            {"settings": self._settings(), "port_base": self.port_base}, indent=1) + "\n")
        (self.root / "env.sh").write_text(f"export SLURM_CONF={self.conf_path}\n"
                                          f"export MALLETRAIN_HOOK_SOCKET={self.hook_socket}\n")
        if self.mode == "accounting":
            from .accounting import start_accounting
            start_accounting(self)
            phase("accounting")
        runner = self.runner()
        runner.run(self.release.daemon_argv("slurmctld", "-f", str(self.conf_path)))
        for name in self.node_names:
            runner.run(self.release.daemon_argv("slurmd", "-N", name, "-f", str(self.conf_path)))
        phase("daemons")
        self.wait_idle(timeout_s)
        phase("nodes_idle")

    def _start_munge(self) -> None:
        self.start_munged(new_key=True)

    def start_munged(self, new_key: bool = False) -> None:
        """Start this cluster's munged (with a fresh random key when ``new_key``: at start-up;
        the fault tests restart it with the same key)."""
        key = self.munge_dir / "munge.key"
        if new_key or not key.exists():
            key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        self.munge_dir.chmod(0o711)
        CommandRunner().run([
            "munged", f"--socket={self.munge_socket}", f"--key-file={key}",
            f"--pid-file={self.run_dir / 'pids' / 'munged.pid'}",
            f"--log-file={self.run_dir / 'log' / 'munged.log'}",
            f"--seed-file={self.munge_dir / 'munged.seed'}"])

    def render_config(self) -> str:
        """The slurm.conf text of this cluster (ports from the port base)."""
        if self.port_base is None:
            raise ClusterError("render_config needs a port base")
        if not TEMPLATE.is_file():
            raise ClusterError(f"{TEMPLATE} is missing: run from a MalleTrain source checkout")
        base = self.port_base
        nodes = "\n".join(f"NodeName={n} NodeHostname=localhost NodeAddr=127.0.0.1 "
                          f"Port={base + 3 + i}" for i, n in enumerate(self.node_names))
        if self.mode == "accounting":
            accounting = "\n".join([
                "AccountingStorageType=accounting_storage/slurmdbd",
                "AccountingStorageHost=127.0.0.1", f"AccountingStoragePort={base + 1}",
                f"AccountingStoragePass={self.munge_socket}",
                "AccountingStorageEnforce=associations,limits,qos"])
        else:
            accounting = "AccountingStorageType=accounting_storage/none"
        text = string.Template(TEMPLATE.read_text()).substitute(
            cluster_name=f"mt{base}", host=socket.gethostname().split(".")[0],
            ctld_port=base, munge_socket=self.munge_socket, run=self.run_dir,
            accounting=accounting, epilog=self.root / "etc" / "epilog_slurmctld",
            preempt_type="preempt/qos" if self.mode == "accounting" else
            "preempt/partition_prio", cpus_per_node=self.cpus_per_node, node_lines=nodes,
            **{k: v for k, v in asdict(self.timings).items()})
        extra = self.release.conf_lines()
        text = f"{text}# Slurm {self.release.name}\n{extra}\n" if extra else text
        if self.node_epilog_s > 0:
            text += f"Epilog={self.root / 'etc' / 'node_epilog'}\n"
        return text + "".join(f"{line}\n" for line in self.extra_conf)

    def _write_config(self) -> None:
        etc = self.root / "etc"
        self.conf_path.write_text(self.render_config())
        for name, content in self.release.extra_files().items():
            (etc / name).write_text(content)
        (etc / "job_submit.lua").write_text(render_job_submit(keep_qos=self.mode == "accounting"))
        # slurmctld gives its scripts no environment of its own: pin the socket path here.
        epilog = etc / "epilog_slurmctld"
        epilog.write_text(f"#!/bin/sh\nMALLETRAIN_HOOK_SOCKET={self.hook_socket} "
                          f"exec {EPILOG}\n")
        epilog.chmod(0o755)
        if self.node_epilog_s > 0:
            node_epilog = etc / "node_epilog"
            node_epilog.write_text(f"#!/bin/sh\nexec sleep {self.node_epilog_s:g}\n")
            node_epilog.chmod(0o755)

    # ------------------------------------------------------------------ waiting, dumping
    def wait_for(self, what: str, check: Callable[[], bool], timeout_s: float,
                 interval_s: float = 0.1) -> float:
        """Poll ``check`` until true; returns the seconds waited, raises ClusterError (with a
        dump of sinfo/squeue/logs) after ``timeout_s``."""
        t0 = time.monotonic()
        try:
            wait_until(what, check, timeout_s, interval_s, ignore=(CommandError,),
                       detail=self.dump)
        except NotReached as exc:
            raise ClusterError(str(exc)) from None
        return time.monotonic() - t0

    def wait_idle(self, timeout_s: float = 60.0) -> float:
        """Wait until every node is idle (no job, responding); returns the seconds waited.

        slurmctld writes its PID file some time after its parent returned (seconds on a
        loaded host, through a chroot): only a controller still missing after
        ``PIDFILE_GRACE_S`` counts as dead."""
        t0 = time.monotonic()

        def all_idle() -> bool:
            if not self.is_running():
                if time.monotonic() - t0 < PIDFILE_GRACE_S:
                    return False
                raise ClusterError(f"slurmctld is not running\n{self.dump()}")
            out = self.run(["sinfo", "-h", "-N", "-p", "preemptable", "-t", "idle", "-o",
                            "%N"], timeout_s=10).stdout
            return len(set(out.split())) >= self.nodes
        return self.wait_for(f"all {self.nodes} nodes idle", all_idle, timeout_s)

    def dump(self, log_lines: int = 40) -> str:
        """sinfo, squeue and the tail of every daemon log: what to read after a failure."""
        parts = [] if self.is_running() else [f"(slurmctld of {self.root} is not running)"]
        for argv in (["sinfo", "-N", "-p", "preemptable", "-o", "%N %T %E"],
                     ["squeue", "-a", "-o", "%i %P %T %N %r %l %u"]) * bool(not parts):
            try:
                res = self.run(argv, check=False, timeout_s=10)
                parts.append(f"$ {' '.join(argv)}\n{res.stdout}{res.stderr}")
            except CommandError as exc:
                parts.append(f"$ {' '.join(argv)}\n{exc}")
        for log in sorted((self.run_dir / "log").glob("*.log")):
            lines = log.read_text(errors="replace").splitlines()
            if log.name.startswith(("slurmd-", "munged")):  # only errors, less PMIx noise
                lines = [ln for ln in lines if "error" in ln.lower() and "MPI" not in ln
                         and "pmix" not in ln.lower()]
                if not lines:
                    continue
            parts.append(f"--- {log} (last {log_lines} lines)\n" + "\n".join(lines[-log_lines:]))
        return "\n".join(parts)

    # ------------------------------------------------------------------ stop
    def stop(self, timeout_s: float = 20.0) -> float:
        """Cancel every job, then stop the daemons this cluster started (by PID file, each
        checked to be ours); returns the seconds it took. Safe to call when nothing runs."""
        t0 = time.monotonic()
        if self.is_running():
            try:
                ids = self.run(["squeue", "-h", "-o", "%F"], timeout_s=10).stdout.split()
                if ids:
                    self.run(["scancel", *sorted(set(ids))], check=False, timeout_s=10)
                    self.wait_for("jobs gone", lambda: not self.run(
                        ["squeue", "-h", "-t", "R,CG,S", "-o", "%i"]).stdout.strip(), 15)
            except MalleTrainError as exc:
                print(f"stop: could not cancel jobs ({exc}); stopping daemons anyway",
                      file=sys.stderr)
        files = self._pidfiles()
        slurm = [f for f in files if f[0].name.startswith(("slurmd-", "slurmctld"))]
        for group in (slurm, *([f] for f in files if f not in slurm)):
            self._terminate(group, timeout_s)
        if self.munge_dir.parent != self.run_dir:
            shutil.rmtree(self.munge_dir, ignore_errors=True)
        for proc in Path("/proc").iterdir():  # stepds outliving their slurmd
            if proc.name.isdigit() and comm(proc) == "slurmstepd" and \
                    pid_alive(int(proc.name), f"SLURM_CONF={self.conf_path}"):
                kill(int(proc.name), signal.SIGKILL)
        return time.monotonic() - t0

    def _terminate(self, pidfiles: list[tuple[Path, str]], timeout_s: float) -> None:
        """TERM every live process of the group at once, then wait; KILL what outlives it."""
        live = [(pid, marker) for path, marker in pidfiles
                if (pid := self._pid(path, marker)) is not None]
        for pid, _ in live:
            kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while any(pid_alive(p, m) for p, m in live) and time.monotonic() < deadline:
            time.sleep(0.05)
        for pid, marker in live:
            if pid_alive(pid, marker):
                kill(pid, signal.SIGKILL)


def render_job_submit(keep_qos: bool = False, source: Path = JOB_SUBMIT_LUA) -> str:
    """The project's job_submit.lua with its ``KEEP_QOS`` setting filled in."""
    text = source.read_text()
    old = "local KEEP_QOS = false"
    if old not in text:
        raise ClusterError(f"{source}: no line '{old}' to configure")
    return text.replace(old, f"local KEEP_QOS = {'true' if keep_qos else 'false'}", 1)


__all__ = ["PORT_RANGE", "SITE_TIMINGS", "TEST_TIMINGS", "ClusterError", "LocalCluster",
           "StartReport", "Timings", "choose_port_base", "default_root", "munge_dir_for",
           "pid_alive", "port_free", "render_job_submit"]
