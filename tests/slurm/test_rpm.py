"""The RPM as a site installs it: ``scripts/make-rpm.sh`` (``rpmbuild -ta`` on the release
tarball, with Debian's ``rpm`` package here) builds it; it is installed into a scratch root
(``rpm --root DIR --nodeps``), every file is checked for its place and mode, the installed
``malletrain --help`` and ``malletrain admin check`` (against the session's real cluster) run
from there, a rebuild upgrades it with the edited config kept, and its removal leaves nothing
but that config."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import tomllib

from devtools.localcluster import LocalCluster

REPO = Path(__file__).resolve().parents[2]
DB = "/var/lib/rpm"

# Every file and folder the package owns outside the Python package, with its mode (rpm's
# own listing is compared with the tree installed, mode by mode, below).
PLACES = {
    "usr/bin/malletrain": 0o755, "usr/bin/malletraind": 0o755, "usr/bin/malletrain-run": 0o755,
    "etc/malletrain": 0o755 | stat.S_IFDIR, "etc/malletrain/malletrain.toml": 0o644,
    "usr/lib/systemd/system/malletraind.service": 0o644,
    "usr/libexec/malletrain/epilog_slurmctld": 0o755,
    "usr/share/malletrain/slurm/job_submit.lua": 0o644,
    "usr/share/malletrain/pbs/malletrain_pbs.py": 0o644,
    "usr/share/malletrain/pbs/install.sh": 0o755,
}
DOCS = ("LICENSE", "README.md", "site-integration.md", "slurm/slurm.conf.fragment",
        "slurm/qos-setup.sh", "slurm/README.md")


def rpm(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(["rpm", "--root", str(root), "--dbpath", DB, *args],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, (args, res.stdout, res.stderr)
    return res


def files_in(root: Path) -> set[str]:
    """Every file (not folder) under ``root`` but rpm's database, relative."""
    return {str(p.relative_to(root)) for p in root.rglob("*")
            if not p.is_dir() and not str(p.relative_to(root)).startswith(DB.lstrip("/"))}


@pytest.fixture(scope="module")
def rpms(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """Release 1 and release 2 (a rebuild) of the package, built as a site builds them."""
    if not shutil.which("rpmbuild"):
        pytest.skip("no rpmbuild: run make setup (it installs Debian's rpm package)")
    top = tmp_path_factory.mktemp("rpmbuild")
    built = []
    for release in ("1", "2"):
        res = subprocess.run(["bash", str(REPO / "scripts" / "make-rpm.sh"), "--python",
                              sys.executable, "--topdir", str(top), "--release", release],
                             capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stdout + res.stderr
        built.append(Path(res.stdout.splitlines()[-1]))
    assert all(p.is_file() for p in built)
    yield built[0], built[1]


def test_install_check_upgrade_remove(rpms: tuple[Path, Path], cluster: LocalCluster,
                                      tmp_path: Path) -> None:
    first, second = rpms
    root = tmp_path / "root"
    root.mkdir()
    rpm(root, "--initdb")
    rpm(root, "-i", "--nodeps", str(first))

    # every file where the listing says, with its mode; nothing else installed
    listing = rpm(root, "-q", "--qf", "[%{FILENAMES} %{FILEMODES:octal}\n]", "malletrain").stdout
    modes = {line.split()[0].lstrip("/"): int(line.split()[1], 8) for line in listing.splitlines()}
    for rel, mode in modes.items():
        st = (root / rel).lstat()
        assert (rel, stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode)) == (
            rel, stat.S_IFMT(mode), stat.S_IMODE(mode))
        assert (st.st_uid, st.st_gid) == (0, 0), rel
    for rel, mode in PLACES.items():
        assert rel in modes and stat.S_IMODE(modes[rel]) == stat.S_IMODE(mode), rel
    assert files_in(root) == {r for r, m in modes.items() if not stat.S_ISDIR(m)}
    site = [r for r in modes if r.endswith("site-packages/malletrain_core/__init__.py")]
    assert len(site) == 1 and site[0].startswith("usr/lib/python3.")
    docs = [r for r in modes if r.startswith("usr/share/doc/") or r.startswith("usr/share/licenses/")]
    assert all(any(r.endswith("/" + d) for r in docs) for d in DOCS), docs
    config = root / "etc/malletrain/malletrain.toml"
    assert tomllib.loads(config.read_text()) == {}  # every key commented out: the defaults
    assert "[daemon]" in config.read_text()
    unit = (root / "usr/lib/systemd/system/malletraind.service").read_text()
    assert "ExecStart=/usr/bin/malletraind --config /etc/malletrain/malletrain.toml" in unit
    assert (root / "usr/bin/malletrain").read_text().startswith(f"#!{os.path.realpath(sys.executable)} -s\n")

    # the installed commands run their own copy of the package (imported from the root)
    env = dict(os.environ, SLURM_CONF=str(cluster.conf_path), PYTHONVERBOSE="1")
    env.pop("PYTHONPATH", None)
    res = subprocess.run([str(root / "usr/bin/malletrain"), "--help"], capture_output=True,
                         text=True, env=env, timeout=60, cwd=tmp_path)
    assert res.returncode == 0 and "usage: malletrain" in res.stdout, res.stderr[-2000:]
    imported = [line for line in res.stderr.splitlines()
                if line.startswith("# code object from") and "/malletrain_core/" in line]
    assert imported and all(f"'{root}/usr/lib/python3." in line for line in imported), imported
    # ... compiled at build time: the shipped bytecode matches (none is written beside it)
    assert all("/__pycache__/" in line for line in imported), imported
    del env["PYTHONVERBOSE"]
    res = subprocess.run([str(root / "usr/bin/malletrain"), "admin", "check", "--config",
                          str(config)], capture_output=True, text=True, env=env, timeout=120,
                         cwd=tmp_path)
    lines = res.stdout.splitlines()
    assert res.returncode == 0 and lines and all(line.startswith("OK") for line in lines), (
        res.stdout + res.stderr)
    for cmd in ("malletraind", "malletrain-run"):
        res = subprocess.run([str(root / "usr/bin" / cmd), "--help"], capture_output=True,
                             text=True, env=env, timeout=60, cwd=tmp_path)
        assert res.returncode == 0 and "usage:" in res.stdout, (cmd, res.stderr[-2000:])

    # upgrade to the rebuild: the edited config is kept as it is, no .rpmnew beside it
    edited = config.read_text() + "\n[daemon]\npoll_interval_s = 2.0\n"
    config.write_text(edited)
    rpm(root, "-U", "--nodeps", str(second))
    assert rpm(root, "-q", "malletrain").stdout.strip() == "malletrain-0.2.0-2.noarch"
    assert config.read_text() == edited
    assert not list(config.parent.glob("*.rpm*"))
    assert tomllib.loads(config.read_text()) == {"daemon": {"poll_interval_s": 2.0}}

    # removal: nothing left but the edited config (rpm keeps it as .rpmsave)
    rpm(root, "-e", "malletrain")
    assert files_in(root) == {"etc/malletrain/malletrain.toml.rpmsave"}
    assert (root / "etc/malletrain/malletrain.toml.rpmsave").read_text() == edited
