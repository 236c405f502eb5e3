"""Which Slurm release the local cluster runs: the host's, or a newer one in a chroot.

``MALLETRAIN_SLURM=22.05|24.11|25.11|26.05`` (default 22.05, the host's Debian packages) selects
it. 24.11 is Debian trixie's packages in a chroot, 25.11 and 26.05 are built from the vendored
sources into ``/opt/slurm-25.11`` and ``/opt/slurm-26.05`` inside that chroot;
``scripts/setup-slurm-matrix.sh`` makes them under ``build/slurm-matrix/``.

How a chroot release runs beside the host's tools:

* slurmctld and slurmd run chrooted, so slurmd starts the chroot's slurmstepd and the
  plugins match their daemons. The chroot sees the host's checkout and its neighbours, /tmp,
  /home and the host's Python at the same paths (bind mounts made by the set-up script), so
  job scripts, the host's Python with torch, the cluster root and munged's socket are where
  the host has them. The epilog's ``#!/usr/bin/python3`` is the chroot's own Python (it needs
  only the standard library).
* Client commands (sbatch, squeue, scontrol, ...) run on the host, unchrooted, through the
  chroot's dynamic loader with the chroot's libraries: wrapper scripts in
  ``build/slurm-matrix/bin-<release>/``. Any user may run them (chroot needs root), and the
  daemon and the tests call them like the host's commands, with that folder first on PATH.
* ``PluginDir`` names the chroot's plugin folder by its host path, which the chroot also
  sees (its own tree is inside the bind-mounted checkout): one slurm.conf serves both sides.
* munged is the host's, as for 22.05 (the protocol is the same).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from malletrain_core.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
MATRIX = REPO / "build" / "slurm-matrix"
CHROOT = MATRIX / "trixie"
DEFAULT = "22.05"
CLIENTS = ("sbatch", "squeue", "scontrol", "sinfo", "scancel", "sacct", "sacctmgr", "sdiag",
           "sprio", "sshare", "srun", "salloc", "sattach", "sstat", "strigger")
_MULTIARCH = "x86_64-linux-gnu"


@dataclass(frozen=True)
class Release:
    """One Slurm release the local cluster can run (see the module doc)."""

    name: str
    prefix: str | None = None
    """Inside the chroot: where bin/ and sbin/ are; None for the host's packages."""
    lib_dirs: tuple[str, ...] = ()
    """Inside the chroot: libslurm's folder and the plugin folder, first wins."""
    plugin_dir: str = ""
    pyslurm: str | None = None
    """The pyslurm release made for this Slurm release (None: none exists)."""
    conf: tuple[str, ...] = ()
    """slurm.conf lines this release's local cluster adds (after the template's)."""

    @property
    def chrooted(self) -> bool:
        return self.prefix is not None

    @property
    def root(self) -> Path:
        return CHROOT

    @property
    def bin_dir(self) -> Path | None:
        """Where the client wrappers are (None: the host's commands on PATH)."""
        return MATRIX / f"bin-{self.name}" if self.chrooted else None

    def daemon_argv(self, program: str, *args: str) -> list[str]:
        """How to start ``slurmctld``/``slurmd`` of this release."""
        if not self.chrooted:
            return [program, *args]
        return ["chroot", str(CHROOT), f"{self.prefix}/sbin/{program}", *args]

    def conf_lines(self) -> str:
        """slurm.conf lines this release needs beyond the template."""
        if not self.chrooted:
            return ""
        return "\n".join([f"PluginDir={CHROOT}{self.plugin_dir}", *self.conf])

    def extra_files(self) -> dict[str, str]:
        """Files beside slurm.conf: slurmd >= 24 aborts without a mounted cgroup fs unless
        the cgroup plugin is off (every virtual node shares this host's kernel)."""
        return {"cgroup.conf": "CgroupPlugin=disabled\n"} if self.chrooted else {}

    def check_installed(self) -> None:
        """Raise a one-line ConfigError that says how to set the release up when it is not."""
        if not self.chrooted:
            return
        daemon = CHROOT / str(self.prefix).lstrip("/") / "sbin" / "slurmctld"
        if not daemon.is_file():
            raise ConfigError(f"Slurm {self.name} is not set up in {CHROOT}: run "
                              f"scripts/setup-slurm-matrix.sh {self.name} (as root)")
        if not (CHROOT / "proc" / "self").exists() or not (CHROOT / REPO.relative_to("/")).joinpath(
                "Makefile").is_file():
            raise ConfigError(f"the chroot {CHROOT} is not mounted: run "
                              f"scripts/setup-slurm-matrix.sh mount (as root)")

    def sync_users(self) -> None:
        """Copy the host's ``/etc/passwd`` and ``/etc/group`` into the chroot, where they
        differ: slurmctld there looks up each job's user when it launches it (a user the
        chroot does not know fails every launch: ``slurm_cred_create: fetch_identity()
        failed``), and test users are created on the host after the set-up script copied them."""
        if not self.chrooted:
            return
        for name in ("passwd", "group"):
            host, inside = Path("/etc") / name, CHROOT / "etc" / name
            text = host.read_bytes()
            if inside.is_file() and inside.read_bytes() == text:
                continue
            tmp = inside.with_name(f".{name}.malletrain")
            tmp.write_bytes(text)
            tmp.chmod(host.stat().st_mode & 0o777)
            tmp.replace(inside)

    def write_wrappers(self) -> Path | None:
        """Write the client wrappers (idempotent); returns their folder."""
        bin_dir = self.bin_dir
        if bin_dir is None:
            return None
        bin_dir.mkdir(parents=True, exist_ok=True)
        loader = CHROOT / "lib64" / "ld-linux-x86-64.so.2"
        libs = ":".join(f"{CHROOT}{d}" for d in (
            *self.lib_dirs, f"/usr/lib/{_MULTIARCH}", f"/lib/{_MULTIARCH}"))
        for name in CLIENTS:
            target = CHROOT / str(self.prefix).lstrip("/") / "bin" / name
            if not target.is_file():
                continue
            text = (f"#!/bin/sh\n# Slurm {self.name}'s {name}, run with the chroot's loader "
                    "and libraries (devtools/localcluster/releases.py)\n"
                    f"exec {loader} --inhibit-cache --library-path {libs} --argv0 {name} "
                    f"{target} \"$@\"\n")
            path = bin_dir / name
            if not path.is_file() or path.read_text() != text:
                tmp = path.with_suffix(".tmp")
                tmp.write_text(text)
                tmp.chmod(0o755)
                tmp.replace(path)
        return bin_dir

    def pyslurm_helper(self) -> str | None:
        """The ``slurm.pyslurm`` setting that runs this release's pyslurm (the chroot's Python
        with the pyslurm ``scripts/setup-slurm-matrix.sh pyslurm`` built), or None: a pyslurm
        built in the chroot does not load in a host process (its glibc is newer)."""
        return pyslurm_helper(self.name) if self.chrooted else None

    def env(self, env: dict[str, str]) -> dict[str, str]:
        """``env`` with this release's commands first on PATH."""
        path = env.get("PATH", os.defpath)
        if self.bin_dir is not None and path.split(":")[0] != str(self.bin_dir):
            env["PATH"] = f"{self.bin_dir}:{path}"
        return env


_WLM = f"/usr/lib/{_MULTIARCH}/slurm-wlm"


def _built(name: str, pyslurm: str | None = None, conf: tuple[str, ...] = ()) -> Release:
    """A release built from the vendored source into /opt/slurm-NAME of the chroot."""
    prefix = f"/opt/slurm-{name}"
    return Release(name, prefix=prefix, lib_dirs=(f"{prefix}/lib/slurm", f"{prefix}/lib"),
                   plugin_dir=f"{prefix}/lib/slurm", pyslurm=pyslurm, conf=conf)


# 26.05 logs a job started by backfill ("sched/backfill: _start_job: Started JobId=...",
# info up to 25.11) only under DebugFlags=HetJob at the verbose level; the tests count
# starts, preemptions and ends from slurmctld's log (tests/slurm/slurm_helpers.py).
_LOG_BACKFILL_STARTS = ("SlurmctldDebug=verbose", "DebugFlags=HetJob")


RELEASES = {
    "22.05": Release("22.05"),
    "24.11": Release("24.11", prefix="/usr", lib_dirs=(_WLM,), plugin_dir=_WLM,
                     pyslurm="24.11.0"),
    "25.11": _built("25.11", pyslurm="25.11.2"),
    "26.05": _built("26.05", conf=_LOG_BACKFILL_STARTS),  # no pyslurm exists for 26.05
}


def pyslurm_helper(series: str) -> str | None:
    """The ``slurm.pyslurm`` setting of the pyslurm built for Slurm ``series`` in the chroot
    (``/opt/pyslurm-SERIES``), or None where it was not built. Any release's cluster may be
    given it: on another release pyslurm is refused (its MAJOR.MINOR must be the cluster's)."""
    if not (CHROOT / "opt" / f"pyslurm-{series}" / ".mt-built").exists():
        return None
    return f"chroot {CHROOT} /opt/pyslurm-{series}/bin/python"


def release(name: str | None = None) -> Release:
    """The release called ``name``, else ``$MALLETRAIN_SLURM``, else 22.05."""
    name = name or os.environ.get("MALLETRAIN_SLURM") or DEFAULT
    try:
        return RELEASES[name]
    except KeyError:
        raise ConfigError(f"MALLETRAIN_SLURM={name!r}: choose one of "
                          f"{', '.join(RELEASES)}") from None
