"""Processes, ports and paths of the local cluster: what lets several run side by side and
lets stop() end only its own processes."""

from __future__ import annotations

import hashlib
import os
import random
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from malletrain_core.errors import MalleTrainError

PORT_RANGE = (20000, 32000)
"""Below Linux's ephemeral range (32768-60999), so outgoing connections do not take them."""


class ClusterError(MalleTrainError):
    """The local cluster could not be started, stopped or queried."""


def pid_alive(pid: int, marker: str) -> bool:
    """Whether ``pid`` runs and its command line or environment mentions ``marker``."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
    needle = marker.encode()
    return needle in cmdline or needle in environ


def munge_dir_for(root: Path) -> Path:
    """Where the private munged's socket lives: ``<root>/run/munge``, unless munged would refuse
    it (it wants every directory above its socket searchable by all, e.g. not under a 0700
    home or pytest's temp dir) or the path is too long for a unix socket; then a directory
    in the system's temp dir named after the root."""
    preferred = root / "run" / "munge"
    searchable = all(p.stat().st_mode & 0o001 for p in (root, *root.parents) if p.exists())
    if searchable and len(str(preferred)) < 90:
        return preferred
    digest = hashlib.sha1(str(root).encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"malletrain-munge-{digest}"


def port_free(port: int) -> bool:
    """Whether a TCP port can be bound on all interfaces, as the daemons bind it (INADDR_ANY,
    SO_REUSEADDR: connections of an earlier cluster in TIME_WAIT do not count)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True


def choose_port_base(count: int, rng: random.Random | None = None, tries: int = 200) -> int:
    """A base such that ``count`` consecutive ports from it are free, started at random so that
    clusters started at the same moment rarely pick the same one."""
    rng = rng or random.Random()
    lo, hi = PORT_RANGE
    for _ in range(tries):
        base = rng.randrange(lo, hi - count)
        if all(port_free(p) for p in range(base, base + count)):
            return base
    raise ClusterError(f"no {count} consecutive free ports in {lo}-{hi}; give --port-base")


def comm(proc: Path) -> str:
    """The command name of ``/proc/<pid>``, empty when it is gone."""
    try:
        return (proc / "comm").read_text().strip()
    except OSError:
        return ""


def kill(pid: int, sig: int) -> None:
    """Signal ``pid``; a process already gone is fine."""
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


class PhaseClock:
    """Records how long each phase of a start took: ``phase(name)`` closes the phase that
    began at the previous call (or at creation) into ``phases[name]`` (seconds)."""

    def __init__(self, phases: dict[str, float]) -> None:
        self.phases = phases
        self._t = time.monotonic()

    def __call__(self, name: str) -> None:
        now = time.monotonic()
        self.phases[name] = round(now - self._t, 3)
        self._t = now


def start_or_clean_up(start: Callable[[], None], dump: Callable[[], str],
                      stop: Callable[[], object]) -> None:
    """Run ``start``; if it fails, print ``dump()`` to stderr (a ClusterError already carries
    it), stop whatever did start, and re-raise."""
    try:
        start()
    except BaseException as exc:
        if not isinstance(exc, ClusterError):
            try:
                print(dump(), file=sys.stderr)
            except Exception as failed:  # a failed dump must not hide the failure being dumped
                print(f"(dump failed: {failed})", file=sys.stderr)
        stop()
        raise
