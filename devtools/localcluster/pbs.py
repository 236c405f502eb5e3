"""A real OpenPBS complex on one host, in network namespaces: the real-PBS tests' cluster.

PBS refuses loopback addresses, and a test may not add addresses to the host's own interfaces,
so the complex lives in network namespaces that :meth:`PbsComplex.start` creates and
:meth:`PbsComplex.stop` removes:

* ``<prefix>-s``: pbs_server (with its PostgreSQL datastore), pbs_sched and pbs_comm, on a
  bridge holding the server's address;
* ``<prefix>-m<i>``: one ``pbs_mom`` each, a host of its own with its own address, joined to
  the server's bridge by a veth pair whose two ends both live in namespaces.

Every namespace gets its own ``/etc/hosts`` (``/etc/netns/<ns>/hosts``, which ``ip netns
exec`` mounts over ``/etc/hosts``) naming the server and every mom; the host's own name maps
to the namespace's address there, since PBS ignores the loopback one. Nothing in the host's
namespace can reach these addresses (the host's 127.0.0.1 is not reachable from inside either):
PBS commands run *inside* the server's namespace, through the wrapper scripts in
``<root>/bin`` (``ip netns exec <prefix>-s ... qstat "$@"``); ``. <root>/env.sh`` puts them
first on PATH, which is all malletraind and the tests need. The hooks reach the daemon through
a unix socket, a file path, which works across network namespaces.

Queues: ``preemptable`` (the default) and ``prod`` (priority 200, above the scheduler's
``preempt_queue_prio`` of 150, so its jobs preempt), with ``preempt_order = R``: preempted jobs
are requeued. Each mom is one node (``n01``...) of ``cpus_per_node`` CPUs.

Built by ``scripts/build-openpbs.sh`` into ``build/openpbs/install``; needs root (namespaces,
pbs_iff). Ports are PBS's defaults (15001-15004, 17001): each namespace has its own. The
datastore's port is derived from the root, as PostgreSQL's unix socket lives in a directory
all namespaces share; so several complexes run side by side with distinct roots.

Kept in one module (over 400 lines) on purpose: the complex's set-up steps (namespaces,
datastore, server, moms, queues, hooks) run in order over one set of paths and addresses.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from malletrain_core.errors import CommandError, ConfigError, MalleTrainError
from malletrain_core.runner import CommandRunner, Result

from ..waiting import NotReached, wait_until
from .procs import ClusterError, PhaseClock, comm, kill, start_or_clean_up

REPO = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO / "scripts" / "build-openpbs.sh"
DEFAULT_EXEC = REPO / "build" / "openpbs" / "install"
SERVER_NAME = "pbsserver"
SUBNET = "198.18.0"
"""RFC 2544's benchmarking range: only ever configured inside this complex's namespaces."""
SERVER_ADDR = f"{SUBNET}.1"
COMMANDS = ("qsub", "qstat", "qdel", "qrun", "qrerun", "qhold", "qrls", "qalter", "qsig",
            "qselect", "qmove", "qorder", "qmgr", "pbsnodes", "pbs_rstat", "pbs_rsub",
            "pbs_rdel", "pbs_release_nodes", "tracejob", "printjob", "pbs_python", "pbsdsh")
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class Timings:
    """The settings that decide how fast a killed job's node comes back (seconds)."""

    kill_delay_s: int
    """Queue ``kill_delay``: SIGTERM to SIGKILL. The mom reports a killed job over only then
    (or at its next poll), even when the job exited at once (measured, docs/pbs.md)."""
    min_check_poll_s: int
    max_check_poll_s: int
    """The mom's ``$min_check_poll`` / ``$max_check_poll``."""
    scheduler_iteration_s: int


TEST_TIMINGS = Timings(kill_delay_s=2, min_check_poll_s=1, max_check_poll_s=2,
                       scheduler_iteration_s=10)
SITE_TIMINGS = Timings(kill_delay_s=10, min_check_poll_s=10, max_check_poll_s=120,
                       scheduler_iteration_s=600)
"""OpenPBS 23.06's defaults."""


@dataclass
class StartReport:
    """What :meth:`PbsComplex.start` did and how long each phase took (seconds)."""

    already_running: bool
    phases_s: dict[str, float] = field(default_factory=dict)

    @property
    def total_s(self) -> float:
        return sum(self.phases_s.values())


def default_root() -> Path:
    """``$MALLETRAIN_PBS_DIR``, else ``.cluster/pbs`` under the checkout."""
    env = os.environ.get("MALLETRAIN_PBS_DIR")
    return Path(env) if env else REPO / ".cluster" / "pbs"


def _netns_dir(name: str) -> Path:
    return Path("/etc/netns") / name


class PbsComplex:
    """An OpenPBS server, scheduler, comm and ``moms`` moms under ``root`` (see module doc)."""

    def __init__(self, moms: int = 8, root: str | Path | None = None,
                 exec_dir: str | Path | None = None, cpus_per_node: int = 2,
                 hook_socket: str | Path | None = None, site_defaults: bool = False) -> None:
        if not 1 <= moms <= 200:
            raise ConfigError(f"moms={moms}: give between 1 and 200 moms")
        if cpus_per_node < 1:
            raise ConfigError(f"cpus_per_node={cpus_per_node}: give at least 1")
        self.moms = moms
        self.cpus_per_node = cpus_per_node
        self.site_defaults = site_defaults
        self.timings = SITE_TIMINGS if site_defaults else TEST_TIMINGS
        self.root = Path(root).resolve() if root is not None else default_root().resolve()
        self.exec_dir = Path(exec_dir).resolve() if exec_dir is not None else DEFAULT_EXEC
        self.hook_socket = Path(hook_socket) if hook_socket else self.root / "hook.sock"
        digest = hashlib.sha1(str(self.root).encode()).hexdigest()[:6]
        self.prefix = f"mtpbs{digest}"
        # PostgreSQL's unix socket (/var/run/postgresql/.s.PGSQL.<port>) is shared by every
        # namespace: each complex's datastore gets a port of its own.
        self.datastore_port = 20000 + int(digest, 16) % 10000
        self.server_ns = f"{self.prefix}-s"
        self.node_names = [f"n{i:02d}" for i in range(1, moms + 1)]
        self.mom_ns = {n: f"{self.prefix}-m{i}" for i, n in enumerate(self.node_names, 1)}
        self.addr = {SERVER_NAME: SERVER_ADDR}
        self.addr.update({n: f"{SUBNET}.{10 + i}" for i, n in enumerate(self.node_names, 1)})
        self.bin_dir = self.root / "bin"
        self.conf_path = self.root / "etc" / "pbs.conf"
        self.job_key_file = self.root / "job.key"
        """The site key of launchers' job secrets (no munge in the complex; docs/pbs.md)."""

    # ------------------------------------------------------------------ paths, commands
    @property
    def namespaces(self) -> list[str]:
        return [self.server_ns, *self.mom_ns.values()]

    def home(self, node: str | None = None) -> Path:
        """PBS_HOME of the server (``node`` None) or of one mom."""
        return self.root / ("server" if node is None else f"mom-{node}")

    def mom_conf(self, node: str) -> Path:
        return self.root / "etc" / f"pbs.conf.{node}"

    @property
    def env(self) -> dict[str, str]:
        """The environment for PBS commands against this complex (wrappers first on PATH)."""
        env = dict(os.environ)
        env["PATH"] = f"{self.bin_dir}:{env.get('PATH', SYSTEM_PATH)}"
        env["PBS_CONF_FILE"] = str(self.conf_path)
        env["MALLETRAIN_HOOK_SOCKET"] = str(self.hook_socket)
        return env

    def runner(self, timeout_s: float = 30.0) -> CommandRunner:
        return CommandRunner(timeout_s=timeout_s, env=self.env)

    def netns_argv(self, ns: str, conf: Path, argv: Sequence[str],
                   user: str | None = None) -> list[str]:
        """``argv`` run inside namespace ``ns`` with PBS's environment (as ``user`` if given)."""
        env = ["env", f"PBS_CONF_FILE={conf}", f"PATH={self.exec_dir / 'bin'}:"
               f"{self.exec_dir / 'sbin'}:{SYSTEM_PATH}"]
        if user is not None:
            return ["ip", "netns", "exec", ns, "runuser", "-u", user, "--", *env, *argv]
        return ["ip", "netns", "exec", ns, *env, *argv]

    def run(self, argv: Sequence[str], *, user: str | None = None, check: bool = True,
            timeout_s: float = 30.0, input: str | None = None) -> Result:
        """Run a PBS command in the server's namespace, as ``user`` (runuser) if given."""
        return CommandRunner(timeout_s=timeout_s).run(
            self.netns_argv(self.server_ns, self.conf_path, argv, user), check=check,
            input=input)

    def qmgr(self, *directives: str) -> None:
        for d in directives:
            res = self.run(["qmgr", "-c", d], check=False)
            if res.returncode != 0:
                raise ClusterError(f"qmgr -c '{d}' failed: {(res.stderr or res.stdout).strip()}")

    def qsub(self, *args: str, user: str | None = None, script: str = "sleep 600\n") -> str:
        """Submit (``script`` on stdin); returns the job id."""
        return self.run(["qsub", *args], user=user, input=script).stdout.strip()

    def jobs(self, *ids: str, subjobs: bool = True) -> dict[str, dict[str, object]]:
        """``qstat -f -F json`` (history included) as {job id: attributes}."""
        argv = ["qstat", "-x", "-f", "-F", "json"] + (["-t"] if subjobs else []) + list(ids)
        res = self.run(argv, check=False)
        if not res.stdout.strip():
            return {}
        return dict(json.loads(res.stdout).get("Jobs", {}))

    def nodes(self) -> dict[str, dict[str, object]]:
        """``pbsnodes -av -F json`` as {node: attributes}."""
        out = self.run(["pbsnodes", "-av", "-F", "json"]).stdout
        return dict(json.loads(out).get("nodes", {}))

    # ------------------------------------------------------------------ state
    @property
    def _state_file(self) -> Path:
        return self.root / "complex.json"

    def _settings(self) -> dict[str, object]:
        return {"moms": self.moms, "cpus_per_node": self.cpus_per_node,
                "exec": str(self.exec_dir), "site_defaults": self.site_defaults}

    def _ns_exists(self, ns: str) -> bool:
        return (Path("/run/netns") / ns).exists()

    def ns_pids(self, ns: str) -> list[int]:
        """Processes living in namespace ``ns`` (all of them are this complex's)."""
        if not self._ns_exists(ns):
            return []
        res = CommandRunner(timeout_s=10).run(["ip", "netns", "pids", ns], check=False)
        return [int(p) for p in res.stdout.split() if p.isdigit()]

    def server_pid(self) -> int | None:
        try:
            pid = int((self.home() / "server_priv" / "server.lock").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None
        return pid if pid in self.ns_pids(self.server_ns) else None

    def is_running(self) -> bool:
        """Whether this complex's pbs_server is up (in this complex's server namespace)."""
        return self.server_pid() is not None

    # ------------------------------------------------------------------ start
    def check_built(self) -> None:
        if not (self.exec_dir / "sbin" / "pbs_server.bin").is_file():
            raise ClusterError(f"OpenPBS is not built in {self.exec_dir}: run "
                               f"scripts/build-openpbs.sh (make setup-pbs) first")

    def check_root(self) -> None:
        """PBS_HOME must be reachable by the datastore's owner (postgres) and job owners, and
        PBS refuses a PBS_HOME below a directory others may write (even /tmp, sticky)."""
        for p in (self.root, *self.root.parents):
            if not p.exists():
                continue
            mode = p.stat().st_mode
            if not mode & 0o001:
                raise ClusterError(f"{p} is not searchable by other users (mode "
                                   f"{mode & 0o777:o}); PBS's datastore user and job owners "
                                   "must reach PBS_HOME: choose another root")
            if mode & 0o002 or (p != self.root and p.stat().st_uid != 0):
                raise ClusterError(f"{p} is writable by others or not owned by root; PBS "
                                   "refuses such a PBS_HOME (chk_file_sec): choose a root "
                                   "outside /tmp, e.g. under the checkout's .cluster/")

    def start(self, timeout_s: float = 120.0) -> StartReport:
        """Create the namespaces, start every daemon, configure the queues and wait until every
        node is free; idempotent."""
        if os.geteuid() != 0:
            raise ClusterError("the local PBS complex creates network namespaces and runs PBS's "
                               "daemons as root: run it as root")
        self.check_built()
        if self.is_running():
            saved = json.loads(self._state_file.read_text())
            if saved.get("settings") != self._settings():
                raise ClusterError(f"a complex with {saved.get('settings')} already runs in "
                                   f"{self.root}; stop it first or choose another root")
            return StartReport(True)
        self.stop()  # leftovers of a complex that died
        report = StartReport(False)
        start_or_clean_up(lambda: self._start(report, timeout_s), self.dump, self.stop)
        return report

    def _start(self, report: StartReport, timeout_s: float) -> None:
        phase = PhaseClock(report.phases_s)

        for sub in ("server", "etc", "bin", *(f"mom-{n}" for n in self.node_names)):
            shutil.rmtree(self.root / sub, ignore_errors=True)
        (self.root / "etc").mkdir(parents=True)
        self.bin_dir.mkdir()
        self.check_root()
        self.root.chmod(0o755)
        for name in ("pbs_iff", "pbs_rcp"):  # authenticate non-root users' commands
            path = self.exec_dir / "sbin" / name
            os.chown(path, 0, 0)
            path.chmod(0o4755)
        self._make_network()
        phase("network")
        self._write_config()
        self._state_file.write_text(json.dumps({"settings": self._settings(),
                                                "prefix": self.prefix}, indent=1) + "\n")
        self._init_d(self.server_ns, self.conf_path, "start")
        phase("server")
        pids: dict[str, int] = {}
        for node in self.node_names:
            self._init_d(self.mom_ns[node], self.mom_conf(node), "start")
            config = self.home(node) / "mom_priv" / "config"
            with config.open("a") as fh:  # no sshd here: deliver job output with cp
                fh.write("$usecp *:/ /\n")
                if not self.site_defaults:
                    fh.write(f"$min_check_poll {self.timings.min_check_poll_s}\n"
                             f"$max_check_poll {self.timings.max_check_poll_s}\n")
            pids[node] = self._lock_pid(self.home(node) / "mom_priv" / "mom.lock")
            kill(pids[node], signal.SIGHUP)
        # A mom that gets the SIGHUP before it has set its handler dies of it, silently (seen
        # once under load: its node stayed state-unknown). Its config is written now, so a
        # second start needs no SIGHUP.
        time.sleep(1.0)
        for node, pid in pids.items():
            if comm(Path(f"/proc/{pid}")) != "pbs_mom":
                print(f"local PBS: pbs_mom of {node} died at start-up; starting it again",
                      file=sys.stderr)
                self._init_d(self.mom_ns[node], self.mom_conf(node), "start")
        phase("moms")
        self._configure()
        phase("configure")
        self.wait_free(timeout_s)
        phase("nodes_free")

    def _lock_pid(self, path: Path, timeout_s: float = 10.0) -> int:
        """The PID a PBS daemon writes into its lock file (shortly after it forks)."""
        pid = 0

        def written() -> bool:
            nonlocal pid
            pid = int(path.read_text().split()[0])
            return True
        try:
            self.wait_for(f"{path} written", written, timeout_s, interval_s=0.05)
        except ClusterError:
            raise ClusterError(f"{path}: no PID written within {timeout_s:g} s") from None
        return pid

    def _ip(self, *args: str, ns: str | None = None) -> None:
        argv = ["ip", *(["-n", ns] if ns else []), *args]
        CommandRunner(timeout_s=15).run(argv)

    def _make_network(self) -> None:
        for ns in self.namespaces:
            self._ip("netns", "add", ns)
            self._ip("link", "set", "lo", "up", ns=ns)
        s = self.server_ns
        self._ip("link", "add", "br0", "type", "bridge", ns=s)
        self._ip("addr", "add", f"{SERVER_ADDR}/24", "dev", "br0", ns=s)
        self._ip("link", "set", "br0", "up", ns=s)
        for i, node in enumerate(self.node_names, 1):
            m = self.mom_ns[node]
            # Both ends created inside namespaces: the host's namespace never holds either.
            self._ip("link", "add", f"v{i}", "type", "veth", "peer", "name", "eth0", "netns", m,
                     ns=s)
            self._ip("link", "set", f"v{i}", "master", "br0", "up", ns=s)
            self._ip("addr", "add", f"{self.addr[node]}/24", "dev", "eth0", ns=m)
            self._ip("link", "set", "eth0", "up", ns=m)
        host = os.uname().nodename.split(".")[0]
        names = "".join(f"{a} {n}\n" for n, a in self.addr.items())
        for ns, me in ((s, SERVER_NAME), *((self.mom_ns[n], n) for n in self.node_names)):
            d = _netns_dir(ns)
            d.mkdir(parents=True, exist_ok=True)
            (d / "hosts").write_text(f"127.0.0.1 localhost\n::1 localhost\n{names}"
                                     f"{self.addr[me]} {host}\n")

    def _conf_text(self, home: Path, node: str | None) -> str:
        server = node is None
        lines = {
            "PBS_SERVER": SERVER_NAME, "PBS_EXEC": str(self.exec_dir), "PBS_HOME": str(home),
            "PBS_START_SERVER": int(server), "PBS_START_SCHED": int(server),
            "PBS_START_COMM": int(server), "PBS_START_MOM": int(not server),
            "PBS_CORE_LIMIT": "unlimited", "PBS_SCP": "/usr/bin/scp",
            "PBS_SERVER_HOST_NAME": SERVER_NAME, "PBS_LEAF_NAME": node or SERVER_NAME,
            "PBS_DATA_SERVICE_PORT": self.datastore_port,
        }
        if node is not None:
            lines["PBS_MOM_NODE_NAME"] = node
        return "".join(f"{k}={v}\n" for k, v in lines.items())

    def _write_config(self) -> None:
        self.conf_path.write_text(self._conf_text(self.home(), None))
        for node in self.node_names:
            self.mom_conf(node).write_text(self._conf_text(self.home(node), node))
        for cmd in COMMANDS:
            wrapper = self.bin_dir / cmd
            wrapper.write_text(
                "#!/bin/sh\n# Runs PBS's command inside the complex's server namespace.\n"
                f'[ "$(id -u)" = 0 ] || {{ echo "{cmd}: the local PBS complex is reached '
                'through ip netns exec, which needs root" >&2; exit 2; }\n'
                f"exec {' '.join(self.netns_argv(self.server_ns, self.conf_path, [cmd]))}"
                ' "$@"\n')
            wrapper.chmod(0o755)
        (self.root / "env.sh").write_text(
            f"export PATH={self.bin_dir}:$PATH\nexport PBS_CONF_FILE={self.conf_path}\n"
            f"export MALLETRAIN_HOOK_SOCKET={self.hook_socket}\n")

    def _init_d(self, ns: str, conf: Path, action: str) -> None:
        script = self.exec_dir / "libexec" / "pbs_init.d"
        res = CommandRunner(timeout_s=120).run(self.netns_argv(ns, conf, [str(script), action]),
                                               check=False)
        if res.returncode != 0:
            raise ClusterError(f"pbs_init.d {action} in {ns} failed (exit {res.returncode}):\n"
                               f"{res.stdout}{res.stderr}\n{self.dump()}")

    def _configure(self) -> None:
        ncpus = self.cpus_per_node
        self.qmgr(
            "set server job_history_enable = true",
            f"set server scheduler_iteration = {self.timings.scheduler_iteration_s}",
            "create queue preemptable queue_type = execution",
            "set queue preemptable enabled = true",
            "set queue preemptable started = true",
            f"set queue preemptable kill_delay = {self.timings.kill_delay_s}",
            "set server default_queue = preemptable",
            "create queue prod queue_type = execution",
            "set queue prod priority = 200",
            "set queue prod enabled = true",
            "set queue prod started = true",
            "delete queue workq",
            "set sched preempt_order = R",
            *(f"create node {n} resources_available.ncpus = {ncpus}" for n in self.node_names),
        )

    def install_malletrain(self, freq_s: int = 30, max_nodes: int = 0,
                           socket: str | Path | None = None) -> Result:
        """The administrator's steps of docs/pbs.md on this complex: MalleTrain's queues
        (``malletrain`` routing to ``mt_preemptable``, enabled but not started), the
        scheduler's ``preempt_prio`` with ``queue_softlimits``, then ``pbs_hooks/install.sh``
        through this complex's qmgr, with a job key (``mt_launch``: launchers authenticate by
        their job's secret, as no munged runs here). Idempotent."""
        def exists(queue: str) -> bool:
            return self.run(["qstat", "-Q", queue], check=False).returncode == 0
        if not exists("mt_preemptable"):
            self.qmgr("create queue mt_preemptable queue_type = execution")
        self.qmgr("set queue mt_preemptable enabled = true",
                  "set queue mt_preemptable started = false",
                  f"set queue mt_preemptable kill_delay = {self.timings.kill_delay_s}",
                  "set queue mt_preemptable max_run_soft = [o:PBS_ALL=0]")
        if not exists("malletrain"):
            self.qmgr("create queue malletrain queue_type = route")
        self.qmgr("set queue malletrain route_destinations = mt_preemptable",
                  "set queue malletrain enabled = true", "set queue malletrain started = true",
                  'set sched preempt_prio = "express_queue, normal_jobs, queue_softlimits"')
        env = dict(os.environ, QMGR=str(self.bin_dir / "qmgr"))
        argv = ["bash", str(REPO / "pbs_hooks" / "install.sh"), "--socket",
                str(socket or self.hook_socket), "--freq", str(freq_s), "--max-nodes",
                str(max_nodes), "--job-key-file", str(self.job_key_file)]
        return CommandRunner(timeout_s=60, env=env).run(argv)

    # ------------------------------------------------------------------ waiting, dumping
    def wait_for(self, what: str, check: Callable[[], bool], timeout_s: float,
                 interval_s: float = 0.2) -> float:
        """Poll ``check`` until true; returns the seconds waited, raises ClusterError (with a
        dump) after ``timeout_s``."""
        t0 = time.monotonic()
        try:
            wait_until(what, check, timeout_s, interval_s,
                       ignore=(CommandError, OSError, ValueError, IndexError), detail=self.dump)
        except NotReached as exc:
            raise ClusterError(str(exc)) from None
        return time.monotonic() - t0

    def wait_free(self, timeout_s: float = 60.0) -> float:
        """Wait until every node is free (no job, mom up); returns the seconds waited."""
        def all_free() -> bool:
            nodes = self.nodes()
            return len(nodes) >= self.moms and all(
                v.get("state") == "free" and not v.get("jobs") for v in nodes.values())
        return self.wait_for(f"all {self.moms} nodes free", all_free, timeout_s)

    def dump(self, log_lines: int = 30) -> str:
        """pbsnodes, qstat and the tail of the daemon logs: what to read after a failure."""
        parts = []
        if self.is_running():
            for argv in (["pbsnodes", "-aSj"], ["qstat", "-answ1x"]):
                try:
                    res = self.run(argv, check=False, timeout_s=10)
                    parts.append(f"$ {' '.join(argv)}\n{res.stdout}{res.stderr}")
                except CommandError as exc:
                    parts.append(f"$ {' '.join(argv)}\n{exc}")
        else:
            parts.append(f"(pbs_server of {self.root} is not running)")
        homes = [self.home(), *(self.home(n) for n in self.node_names)]
        for home in homes:
            for sub in ("server_logs", "sched_logs", "comm_logs", "mom_logs"):
                logs = sorted((home / sub).glob("*")) if (home / sub).is_dir() else []
                if logs:
                    lines = logs[-1].read_text(errors="replace").splitlines()
                    parts.append(f"--- {logs[-1]} (last {log_lines} lines)\n"
                                 + "\n".join(lines[-log_lines:]))
        return "\n".join(parts)

    # ------------------------------------------------------------------ stop
    def stop(self, timeout_s: float = 30.0) -> float:
        """Delete every job, stop every daemon, kill whatever still lives in the complex's
        namespaces, and remove them; returns the seconds it took. Safe when nothing runs."""
        t0 = time.monotonic()
        if self.is_running():
            try:
                ids = self.run(["qselect"], timeout_s=10, check=False).stdout.split()
                if ids:
                    self.run(["qdel", "-Wforce", *ids], check=False, timeout_s=20)
            except MalleTrainError as exc:
                print(f"stop: could not delete jobs ({exc}); stopping daemons anyway",
                      file=sys.stderr)
        # Moms (and any job left) first, all at once: a mom ends its jobs on SIGTERM.
        self._kill_ns(list(self.mom_ns.values()), timeout_s)
        if self.ns_pids(self.server_ns):  # qterm, then the scheduler, comm and datastore
            self._init_d_quietly(self.server_ns, self.conf_path)
        self._kill_ns([self.server_ns], timeout_s)
        for ns in self.namespaces:
            if self._ns_exists(ns):
                CommandRunner(timeout_s=15).run(["ip", "netns", "del", ns], check=False)
            shutil.rmtree(_netns_dir(ns), ignore_errors=True)
        return time.monotonic() - t0

    def _init_d_quietly(self, ns: str, conf: Path) -> None:
        if not conf.is_file():
            return
        try:
            script = self.exec_dir / "libexec" / "pbs_init.d"
            CommandRunner(timeout_s=60).run(self.netns_argv(ns, conf, [str(script), "stop"]),
                                            check=False)
        except CommandError as exc:
            print(f"stop: pbs_init.d stop in {ns}: {exc}", file=sys.stderr)

    def _kill_ns(self, namespaces: list[str], timeout_s: float) -> None:
        """TERM every process in ``namespaces``, then KILL what outlives ``timeout_s``."""
        def pids() -> list[int]:
            return [p for ns in namespaces for p in self.ns_pids(ns)]
        for pid in pids():
            kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while pids() and time.monotonic() < deadline:
            time.sleep(0.1)
        for pid in pids():
            kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while pids() and time.monotonic() < deadline:
            time.sleep(0.05)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m devtools.localcluster.pbs start|stop|status|dump``."""
    p = argparse.ArgumentParser(prog="localcluster.pbs",
                                description="A real OpenPBS complex on one host, in network "
                                            "namespaces.")
    p.add_argument("action", choices=("start", "stop", "status", "dump"))
    p.add_argument("--moms", type=int, default=8, help="separate pbs_moms, one node each")
    p.add_argument("--root", default=None, help="default: $MALLETRAIN_PBS_DIR or ./.cluster/pbs")
    p.add_argument("--site-defaults", action="store_true",
                   help="PBS's own kill_delay and mom poll (10 s, 10-120 s) and scheduler "
                        "iteration (600 s) instead of the tests' 2 s, 1-2 s and 10 s")
    p.add_argument("--malletrain", action="store_true",
                   help="also create MalleTrain's queues and install its hooks (install.sh)")
    args = p.parse_args(argv)
    try:
        cx = PbsComplex(moms=args.moms, root=args.root, site_defaults=args.site_defaults)
        if args.action == "start":
            rep = cx.start()
            if rep.already_running:
                print(f"PBS complex in {cx.root} is already running")
            else:
                phases = ", ".join(f"{k} {v:.2f} s" for k, v in rep.phases_s.items())
                print(f"started server + {cx.moms} moms in {rep.total_s:.2f} s ({phases})")
            if args.malletrain:
                print(cx.install_malletrain().stdout.strip())
            print(f"use it with: . {cx.root / 'env.sh'}")
        elif args.action == "stop":
            was = cx.is_running()
            elapsed = cx.stop()
            print(f"stopped in {elapsed:.2f} s" if was else "not running (leftovers removed)")
        elif args.action == "status":
            print("running" if cx.is_running() else "not running")
            return 0 if cx.is_running() else 3
        else:
            print(cx.dump())
    except MalleTrainError as exc:
        print(f"localcluster.pbs: error: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
