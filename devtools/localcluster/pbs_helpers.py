"""Helpers shared by the real-PBS tests: submitting as the test user, waiting for states."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devtools.localcluster.daemon import free_port, view_differences, wait_views_agree
from devtools.localcluster.pbs import REPO, SERVER_ADDR, PbsComplex
from malletrain_core.wire.api import ApiUnavailable
from malletrain_core.worker.client import UnixClient

SLEEP = "sleep 600\n"
QUIET = ("-o", "/dev/null", "-e", "/dev/null")
WORKER_QUEUE = "mt_preemptable"
"""Where the ``malletrain`` route queue puts elastic jobs' workers."""


def submit(cx: PbsComplex, user: str, *args: str, script: str = SLEEP) -> str:
    """``qsub`` as ``user`` (output discarded unless ``-o`` is given); returns the job id."""
    extra = () if "-o" in args else QUIET
    return cx.qsub(*args, *extra, user=user, script=script)


def job(cx: PbsComplex, job_id: str) -> dict[str, object]:
    """One job's (or subjob's) attributes, history included; {} when PBS has no record."""
    return cx.jobs(job_id).get(job_id, {})


def state(cx: PbsComplex, job_id: str) -> str:
    return str(job(cx, job_id).get("job_state", ""))


def wait_state(cx: PbsComplex, job_id: str, want: str, timeout_s: float = 30.0) -> float:
    """Wait until ``job_id`` is in state ``want`` (``R``, ``Q``, ``F``...); seconds waited."""
    return cx.wait_for(f"{job_id} in state {want}", lambda: state(cx, job_id) == want,
                       timeout_s, interval_s=0.1)


def subjob(array_id: str, index: int) -> str:
    """``12[].pbsserver`` -> ``12[3].pbsserver``."""
    return array_id.replace("[]", f"[{index}]")


def server_log(cx: PbsComplex) -> str:
    """The server's log (every day's file), for what hooks wrote."""
    logs = sorted((cx.home() / "server_logs").glob("*"))
    return "".join(p.read_text(errors="replace") for p in logs)


def fill(cx: PbsComplex, user: str, queue: str = "mt_preemptable") -> str:
    """An array with one subjob started (``qrun -H``) on every node; returns the array id."""
    array = submit(cx, user, "-q", "malletrain" if queue == "mt_preemptable" else queue,
                   "-J", f"1-{cx.moms}", "-l", "select=1:ncpus=2")
    for i, node in enumerate(cx.node_names, 1):
        cx.run(["qrun", "-H", f"({node})", subjob(array, i)])
    for i in range(1, cx.moms + 1):
        wait_state(cx, subjob(array, i), "R")
    return array


def now() -> float:
    return time.monotonic()


def complex_root() -> Path:
    """A fresh directory for one complex: under the checkout's ignored ``.cluster/`` (PBS
    refuses a PBS_HOME below a directory others may write, such as /tmp)."""
    base = REPO / ".cluster"
    base.mkdir(exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="pbs-test-", dir=base))
    root.chmod(0o755)
    return root


@dataclass
class Daemon:
    """A malletraind started by :func:`start_daemon`."""

    proc: subprocess.Popen[bytes]
    root: Path
    log: Path
    address: str
    """``HOST:PORT`` of its TCP API, for ``MALLETRAIN_DAEMON``."""
    argv: list[str]
    cx: PbsComplex

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)

    def kill(self) -> None:
        """SIGKILL: nothing saved, its sockets left behind."""
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def restart(self) -> None:
        """Start it again on the same configuration and state, once its first poll is done."""
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(self.argv, env=self.cx.env, stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        wait_polled(self)

    def query(self, op: str) -> dict[str, Any]:
        with UnixClient(str(self.root / "api.sock"), timeout_s=5) as client:
            return dict(client.call(op))

    def log_tail(self, lines: int = 80) -> str:
        """The last ``lines`` of its log, its commands left out: what a failed test prints."""
        kept = [ln for ln in self.log.read_text(errors="replace").splitlines()
                if "runner: run:" not in ln]
        return "\n==== malletraind log (its commands left out) ====\n" + "\n".join(kept[-lines:])


def wait_polled(daemon: Daemon) -> None:
    """Wait until the daemon's first poll is done: from then on it acts on hooks or its poll."""
    def polled() -> bool:
        if daemon.proc.poll() is not None:
            raise AssertionError(f"malletraind exited {daemon.proc.returncode}:\n"
                                 f"{daemon.log.read_text()}")
        try:
            return int(daemon.query("status")["daemon"]["cycles"]) >= 1
        except ApiUnavailable:
            return False  # not listening yet

    try:
        daemon.cx.wait_for("malletraind's first poll", polled, 30)
    except BaseException:
        daemon.stop()
        raise


def start_daemon(cx: PbsComplex, poll_s: float = 600.0, in_server_ns: bool = False,
                 extra_toml: str = "", log_level: str = "info") -> Daemon:
    """malletraind with the PBS backend and a state of its own (no job of an earlier test
    recovered), once its first poll is done. ``in_server_ns``: run it in the server's network
    namespace, its API on the server's address, where launchers on the moms reach it (they
    cannot reach the host's loopback); it authenticates them by their job secret."""
    root = Path(tempfile.mkdtemp(prefix="malletraind-", dir=cx.root))
    host = SERVER_ADDR if in_server_ns else "127.0.0.1"
    port = free_port()
    config = root / "malletrain.toml"
    config.write_text(
        "[daemon]\nbatch_system = \"pbs\"\n"
        f"state_dir = \"{root / 'state'}\"\nhook_socket = \"{cx.hook_socket}\"\n"
        f"api_socket = \"{root / 'api.sock'}\"\napi_host = \"{host}\"\n"
        f"api_port = {port}\nadvertise_host = \"{host}\"\n"
        f"poll_interval_s = {poll_s}\nmetrics_port = 0\nlog_level = \"{log_level}\"\n"
        f"[pbs]\nbin_dir = \"{cx.bin_dir}\"\njob_key_file = \"{cx.job_key_file}\"\n"
        + extra_toml)
    log = root / "daemon.log"
    argv = [sys.executable, "-m", "malletrain_core.daemon", "--config", str(config)]
    if in_server_ns:
        argv = ["ip", "netns", "exec", cx.server_ns, *argv]
    with open(log, "ab") as out:
        proc = subprocess.Popen(argv, env=cx.env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    daemon = Daemon(proc, root, log, f"{host}:{port}", argv, cx)
    wait_polled(daemon)
    return daemon


def job_number(job_id: str) -> str:
    """``12[].pbsserver``, ``12[3]``, ``12.pbsserver`` -> ``12``."""
    return job_id.split("[", 1)[0].split(".", 1)[0]


def pbs_view(cx: PbsComplex) -> tuple[dict[str, set[str]], set[str]]:
    """(elastic job number -> vnodes of its running workers, free vnodes) as qstat and
    pbsnodes say."""
    held: dict[str, set[str]] = {}
    for jid, attrs in cx.jobs().items():
        if attrs.get("queue") == WORKER_QUEUE and attrs.get("job_state") == "R":
            node = str(attrs.get("exec_vnode", "")).strip("()").split(":", 1)[0]
            held.setdefault(job_number(jid), set()).add(node)
    free = {n for n, a in cx.nodes().items() if a.get("state") == "free" and not a.get("jobs")}
    return held, free


def views_differ(cx: PbsComplex, daemon: Daemon) -> str:
    """Empty when the daemon's nodes equal PBS's, else what differs."""
    return view_differences("PBS", pbs_view(cx), daemon, job_number)


def wait_agree(cx: PbsComplex, daemon: Daemon, timeout_s: float = 30.0) -> None:
    """Wait until the daemon's view equals PBS's on two reads 1.2 s apart."""
    wait_views_agree(lambda: views_differ(cx, daemon), "PBS", timeout_s)


def worker_processes(pbs: PbsComplex) -> list[str]:
    """Command lines of MalleTrain launchers, torchrun agents and training processes alive on
    any mom ("PID: CMD")."""
    found = []
    for ns in pbs.mom_ns.values():
        for pid in pbs.ns_pids(ns):
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue  # gone meanwhile
            if any(w in cmd for w in ("train_elastic.py", "malletrain_core.worker.launcher",
                                      "torch.distributed.run")):
                found.append(f"{pid}: {cmd.strip()}")
    return found
