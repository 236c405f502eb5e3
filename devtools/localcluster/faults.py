"""Faults to inject into a :class:`~devtools.localcluster.LocalCluster`.

A node failure (its slurmd and every process of the jobs on it killed at once), a controller
restart over the same state directory, munged stopped and started again with the same key, a
process hung (SIGSTOP) and resumed, and the reverse operations, so that a test can break a
node and hand the cluster back healthy. Only processes that belong to this cluster are
touched: each is checked against the cluster's ``slurm.conf`` path, its munge socket or its
job ids.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

from . import LocalCluster
from .procs import ClusterError, comm, kill, pid_alive


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(
            errors="replace")
    except OSError:
        return ""


def _pids() -> list[int]:
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]


def slurmd_pid(cluster: LocalCluster, node: str) -> int | None:
    """The PID of ``node``'s slurmd, None when it is not running."""
    path = cluster.run_dir / "pids" / f"slurmd-{node}.pid"
    try:
        pid = int(path.read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if pid_alive(pid, str(cluster.conf_path)) else None


def job_processes(job_ids: set[str]) -> list[int]:
    """Every process of the Slurm jobs ``job_ids`` (raw ids, one per array task): their
    slurmstepds and everything the steps started (found by ``SLURM_JOB_ID``)."""
    found = []
    for pid in _pids():
        cmd = _cmdline(pid)
        if comm(Path(f"/proc/{pid}")) == "slurmstepd":
            if any(f"[{job}." in cmd for job in job_ids):
                found.append(pid)
        elif _environ(pid).get("SLURM_JOB_ID") in job_ids:
            found.append(pid)
    return found


def fail_node(cluster: LocalCluster, node: str, reason: str = "fault test") -> list[int]:
    """A node failure: SIGKILL ``node``'s slurmd and every process of the jobs running there,
    then mark the node DOWN. Returns the PIDs killed."""
    out = cluster.run(["squeue", "-h", "-w", node, "-t", "R,CG", "-o", "%A"]).stdout
    jobs = set(out.split())
    victims = [pid for pid in [slurmd_pid(cluster, node)] if pid is not None]
    victims += job_processes(jobs)
    for pid in victims:
        kill(pid, signal.SIGKILL)
    cluster.run(["scontrol", "update", f"NodeName={node}", "State=DOWN", f"Reason={reason}"])
    return victims


def restore_node(cluster: LocalCluster, node: str, timeout_s: float = 30.0) -> float:
    """Undo :func:`fail_node`: start the node's slurmd again and resume it; returns the
    seconds until it was idle."""
    if slurmd_pid(cluster, node) is None:
        cluster.run(cluster.release.daemon_argv("slurmd", "-N", node, "-f",
                                                str(cluster.conf_path)))
    cluster.run(["scontrol", "update", f"NodeName={node}", "State=RESUME"], check=False)

    def idle() -> bool:
        out = cluster.run(["sinfo", "-h", "-n", node, "-o", "%T"], timeout_s=10).stdout
        return out.strip().rstrip("*") == "idle"
    return cluster.wait_for(f"node {node} idle again", idle, timeout_s)


def controller_pid(cluster: LocalCluster) -> int | None:
    """The PID of this cluster's slurmctld, None when it is not running."""
    path = cluster.run_dir / "pids" / "slurmctld.pid"
    try:
        pid = int(path.read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if pid_alive(pid, str(cluster.conf_path)) else None


def stop_controller(cluster: LocalCluster, timeout_s: float = 20.0) -> None:
    """Stop slurmctld (SIGTERM: it saves its state, as on a planned restart)."""
    pid = controller_pid(cluster)
    if pid is None:
        raise ClusterError(f"slurmctld of {cluster.root} is not running")
    kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while pid_alive(pid, str(cluster.conf_path)) and time.monotonic() < deadline:
        time.sleep(0.05)
    if pid_alive(pid, str(cluster.conf_path)):
        kill(pid, signal.SIGKILL)


def start_controller(cluster: LocalCluster, timeout_s: float = 30.0) -> float:
    """Start slurmctld over its saved state (jobs and nodes recovered); returns the seconds
    until it answered."""
    if controller_pid(cluster) is not None:
        raise ClusterError(f"slurmctld of {cluster.root} is already running")
    cluster.run(cluster.release.daemon_argv("slurmctld", "-f", str(cluster.conf_path)))
    return cluster.wait_for("slurmctld answering", lambda: cluster.run(
        ["scontrol", "ping"], check=False, timeout_s=10).returncode == 0, timeout_s)


def munged_pid(cluster: LocalCluster) -> int | None:
    """The PID of this cluster's munged, None when it is not running."""
    path = cluster.run_dir / "pids" / "munged.pid"
    try:
        pid = int(path.read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if pid_alive(pid, str(cluster.munge_socket)) else None


def stop_munged(cluster: LocalCluster, timeout_s: float = 10.0) -> None:
    """Stop munged (SIGTERM, as ``systemctl stop munge``): every credential is refused until
    :func:`start_munged`."""
    pid = munged_pid(cluster)
    if pid is None:
        raise ClusterError(f"munged of {cluster.root} is not running")
    kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while pid_alive(pid, str(cluster.munge_socket)) and time.monotonic() < deadline:
        time.sleep(0.05)


def start_munged(cluster: LocalCluster, timeout_s: float = 10.0) -> float:
    """Start munged again with the cluster's key (credentials made before stay valid until
    they expire); returns the seconds until its socket answered."""
    if munged_pid(cluster) is not None:
        raise ClusterError(f"munged of {cluster.root} is already running")
    cluster.start_munged(new_key=False)
    return cluster.wait_for("munged answering", lambda: munged_pid(cluster) is not None
                            and cluster.munge_socket.exists(), timeout_s)


def pause(pid: int) -> None:
    """SIGSTOP ``pid``: the process is hung (holds its sockets, answers nothing)."""
    kill(pid, signal.SIGSTOP)


def resume(pid: int) -> None:
    """SIGCONT a process stopped by :func:`pause`."""
    kill(pid, signal.SIGCONT)
