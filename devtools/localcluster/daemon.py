"""``malletraind`` beside a :class:`~devtools.localcluster.LocalCluster`.

Used by the integration tests, ``bench/e2e.py`` and the demo: a config file under the
cluster's root (state, sockets and log there too), the API and the report listener on a free
loopback port, the cluster's private munged, and helpers to start, kill and restart the
daemon process and to write the batch scripts of elastic training jobs.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from malletrain_core.backends.slurm.backend import epilog_margin_for
from malletrain_core.errors import MalleTrainError

from ..waiting import wait_until
from . import REPO, LocalCluster

EPOCH_PORTS = (61000, 65535)
EPOCH_PORT_SPAN = 200
"""torchrun master ports of one local daemon: a random window above Linux's ephemeral range
(32768-60999) and the local clusters' ports, as every virtual node is this one host."""


def free_port(host: str = "127.0.0.1") -> int:
    """A port free for both TCP (API) and UDP (reports) on ``host``."""
    for _ in range(50):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as tcp:
            tcp.bind((host, 0))
            port = int(tcp.getsockname()[1])
            try:
                with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
                    udp.bind((host, port))
            except OSError:
                continue
            return port
    raise MalleTrainError(f"no port free for both TCP and UDP on {host}")


View = tuple[dict[str, set[str]], set[str]]
"""(elastic job -> the nodes it runs on, the nodes free of elastic work) as one side sees them:
the batch system (read with its own commands) or the daemon (:func:`daemon_view`)."""


class Queried(Protocol):
    """A daemon the tests read through its API (``LocalDaemon``, the PBS tests' ``Daemon``)."""

    def query(self, op: str) -> Any: ...


def daemon_view(daemon: Queried, job_key: Callable[[str], str] = str) -> View:
    """The daemon's :data:`View` as its API says; ``job_key`` turns its job ids into the
    batch system's (PBS's ``12[].server`` into ``12``)."""
    held: dict[str, set[str]] = {}
    free = set()
    for rec in daemon.query("nodes")["nodes"]:
        if rec["state"] == "held":
            held.setdefault(job_key(str(rec["job"])), set()).add(rec["node"])
        else:
            free.add(rec["node"])
    return held, free


def view_differences(batch_system: str, batch: View, daemon: Queried,
                     job_key: Callable[[str], str] = str) -> str:
    """Empty when the daemon's nodes and jobs equal ``batch`` (the batch system's view), else
    every difference in one line."""
    b_held, b_free = batch
    d_held, d_free = daemon_view(daemon, job_key)
    problems = [f"job {j}: {batch_system} runs it on {sorted(b_held.get(j, ()))}, the daemon "
                f"holds {sorted(d_held.get(j, ()))}"
                for j in sorted(set(b_held) | set(d_held))
                if b_held.get(j, set()) != d_held.get(j, set())]
    if b_free != d_free:
        problems.append(f"free nodes: {batch_system} {sorted(b_free)}, the daemon "
                        f"{sorted(d_free)}")
    jobs = {job_key(str(j["job"])): j for j in daemon.query("jobs")["jobs"]}
    problems += [f"job {j}: the daemon's jobs say {jobs[j]['nodes']} nodes, {batch_system} "
                 f"runs {len(nodes)}" for j, nodes in sorted(b_held.items())
                 if j in jobs and jobs[j]["nodes"] != len(nodes)]
    return "; ".join(problems)


def wait_views_agree(differ: Callable[[], str], batch_system: str, timeout_s: float) -> None:
    """Wait until the daemon's view of its nodes and jobs equals the batch system's on two reads
    1.2 s apart; ``differ()`` says how they differ ("" when they agree). The live tests of
    Slurm and PBS both use it."""
    last = ""

    def agree_twice() -> bool:
        nonlocal last
        last = differ()
        if not last:
            time.sleep(1.2)
            last = differ()
        return not last
    wait_until(f"the daemon's view matching {batch_system}'s", agree_twice, timeout_s, 0.5,
               detail=lambda: f"last difference: {last}")


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


class LocalDaemon:
    """One ``malletraind`` process for ``cluster``; ``settings`` overrides config sections,
    e.g. ``{"profiler": {"window_s": 5.0}}``; ``trainers`` become ``[[trainer]]`` tables."""

    def __init__(self, cluster: LocalCluster, root: str | Path | None = None,
                 settings: dict[str, dict[str, Any]] | None = None,
                 trainers: list[dict[str, Any]] | None = None,
                 launcher: Sequence[str] = ()) -> None:
        self.cluster = cluster
        self.launcher = list(launcher)
        """A command the daemon runs under (e.g. ``strace -f -o FILE``): its first child."""
        self.root = Path(root) if root is not None else cluster.root / "malletraind"
        self.port = free_port()
        self.api_socket = self.root / "api.sock"
        self.log_path = self.root / "daemon.log"
        self.config_path = self.root / "malletrain.toml"
        lo = random.randrange(EPOCH_PORTS[0], EPOCH_PORTS[1] - EPOCH_PORT_SPAN, EPOCH_PORT_SPAN)
        sections: dict[str, dict[str, Any]] = {
            "daemon": {"state_dir": str(self.root / "state"),
                       "hook_socket": str(cluster.hook_socket),
                       "api_socket": str(self.api_socket), "api_host": "127.0.0.1",
                       "api_port": self.port, "advertise_host": "127.0.0.1",
                       "poll_interval_s": 1.0, "metrics_port": 0, "log_level": "info",
                       # Every cycle polls unless a test asks for quiet polling (the
                       # environment's MALLETRAIN_DAEMON_IDLE_POLL_INTERVAL_S overrides it).
                       "idle_poll_interval_s": 1.0},
            "profiler": {"window_s": 6.0},
            # Every virtual node is this host: daemons side by side need disjoint master
            # ports, above Linux's ephemeral range and the local clusters' ports.
            "epochs": {"checkpoint_timeout_s": 20.0, "join_timeout_s": 6.0,
                       "port_min": lo, "port_max": lo + EPOCH_PORT_SPAN - 1},
            "munge": {"socket": str(cluster.munge_socket)},
            # The cluster's backfill plans in bf_resolution steps: a finer plan, a thinner
            # margin, and holes from about a minute on take a task.
            # A node Epilog (LocalCluster(node_epilog_s=...)) must end before a planned start.
            "slurm": {"hole_margin_s": float(cluster.timings.hole_margin_s),
                      "epilog_margin_s": float(epilog_margin_for(cluster.node_epilog_s)),
                      "grant_timeout_s": float(cluster.timings.grant_timeout_s)},
        }
        for name, table in (settings or {}).items():
            sections.setdefault(name, {}).update(table)
        self.sections = sections
        self.trainers = list(trainers or [])
        self.proc: subprocess.Popen[bytes] | None = None

    # ------------------------------------------------------------------ the process
    def write_config(self) -> Path:
        self.root.mkdir(parents=True, exist_ok=True)
        lines = []
        for name, table in self.sections.items():
            lines.append(f"[{name}]")
            lines += [f"{k} = {_toml(v)}" for k, v in table.items()]
        for table in self.trainers:
            lines.append("[[trainer]]")
            lines += [f"{k} = {_toml(v)}" for k, v in table.items()]
        self.config_path.write_text("\n".join(lines) + "\n")
        return self.config_path

    def start(self, timeout_s: float = 30.0) -> float:
        """Start the daemon; returns the seconds until its API answered."""
        if self.proc is not None and self.proc.poll() is None:
            raise MalleTrainError("malletraind is already running")
        self.write_config()
        env = self.cluster.env
        env.pop("MALLETRAIN_CONFIG", None)
        t0 = time.monotonic()
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [*self.launcher, sys.executable, "-m", "malletrain_core.daemon", "--config",
                 str(self.config_path)], env=env, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True)
        while time.monotonic() - t0 < timeout_s:
            if self.proc.poll() is not None:
                raise MalleTrainError(f"malletraind exited with {self.proc.returncode}: "
                                      f"{self.log_tail(5)}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1.0):
                    return time.monotonic() - t0
            except OSError:
                time.sleep(0.1)
        raise MalleTrainError(f"malletraind did not listen within {timeout_s:g} s: "
                              f"{self.log_tail(5)}")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` (SIGKILL: a crash) and reap the process."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            os.kill(self._daemon_pid(), sig)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self.proc = None

    def _daemon_pid(self) -> int:
        assert self.proc is not None
        pid = self.proc.pid
        if self.launcher:  # the launcher's child; the launcher ends with it
            children = Path(f"/proc/{pid}/task/{pid}/children")
            with contextlib.suppress(OSError, ValueError, IndexError):
                return int(children.read_text().split()[0])
        return pid

    def stop(self) -> None:
        self.kill(signal.SIGTERM)

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def query(self, op: str, **args: Any) -> Any:
        """One read-only API call over the unix socket (``status``, ``jobs``, ``nodes``)."""
        from malletrain_core.worker.client import UnixClient

        with UnixClient(str(self.api_socket), timeout_s=10.0) as client:
            return client.call(op, **args)

    def snapshot(self) -> str:
        """The daemon's own view, for failure messages (never for assertions)."""
        try:
            return json.dumps({op: self.query(op) for op in ("jobs", "nodes")}, indent=1)
        except MalleTrainError as exc:
            return f"(no daemon view: {exc})"

    # ------------------------------------------------------------------ elastic jobs
    @property
    def job_env(self) -> dict[str, str]:
        """What a task's launcher needs to reach this daemon."""
        return {"MALLETRAIN_DAEMON": f"127.0.0.1:{self.port}",
                "MALLETRAIN_MUNGE_SOCKET": str(self.cluster.munge_socket)}

    def training_script(self, command: list[str], checkpoint_dir: str | Path,
                        poll_s: float = 1.0, inplace: bool = False,
                        nproc_per_node: int = 1) -> str:
        """A batch script whose tasks run ``malletrain-run -- command`` against this daemon
        (``inplace``: ``malletrain-run --inplace``; ``nproc_per_node`` processes per node)."""
        exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in self.job_env.items())
        nproc = ["--nproc-per-node", str(nproc_per_node)] if nproc_per_node != 1 else []
        launcher = shlex.join([sys.executable, "-m", "malletrain_core.worker.launcher", "--poll-s",
                               str(poll_s), *(["--inplace"] if inplace else []), *nproc])
        ckpt = f'{shlex.quote(str(checkpoint_dir))}/ckpt-"$SLURM_ARRAY_JOB_ID"'
        return (f"#!/bin/bash\n{exports}cd {shlex.quote(str(REPO))}\n"
                f"exec {launcher} --checkpoint-dir {ckpt} -- {shlex.join(command)}\n")
