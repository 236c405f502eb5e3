"""Least privilege on disk: socket modes and groups, the private state directory, and the
hook-script check used by ``malletrain admin check``."""

from __future__ import annotations

import grp
import os
import pwd
import stat
from pathlib import Path

import pytest

from malletrain_core import security
from malletrain_core.daemon.api import Dispatcher, UnixApiServer
from malletrain_core.daemon.intake import HookListener
from malletrain_core.daemon.store import StateError, Store
from malletrain_core.errors import ConfigError

pytestmark = pytest.mark.security
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another owner needs root")


def mode(path: Path | str) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def other_group() -> grp.struct_group:
    """A group we are not in by default (nogroup), to prove the chown happened."""
    for name in ("nogroup", "nobody", "daemon"):
        try:
            return grp.getgrnam(name)
        except KeyError:
            continue
    pytest.skip("no spare group on this host")


# ----- sockets ----------------------------------------------------------------------------------
def test_api_socket_is_private_without_a_group(tmp_path: Path) -> None:
    server = UnixApiServer(str(tmp_path / "api.sock"), Dispatcher())
    try:
        assert mode(server.path) == 0o600
        assert os.stat(server.path).st_uid == os.geteuid()
    finally:
        server.close()


@root_only
def test_api_socket_belongs_to_the_named_group(tmp_path: Path) -> None:
    group = other_group()
    for given in (group.gr_name, group.gr_gid, str(group.gr_gid)):
        server = UnixApiServer(str(tmp_path / "api.sock"), Dispatcher(), group=given)
        try:
            st = os.stat(server.path)
            assert stat.S_IMODE(st.st_mode) == 0o660 and st.st_gid == group.gr_gid
            assert not st.st_mode & stat.S_IWOTH
        finally:
            server.close()


def test_unknown_api_group_is_one_line_and_leaves_no_socket(tmp_path: Path) -> None:
    path = tmp_path / "api.sock"
    with pytest.raises(ConfigError, match="group 'no-such-group-x' does not exist"):
        UnixApiServer(str(path), Dispatcher(), group="no-such-group-x")
    assert not path.exists()


def test_hook_socket_is_private_without_a_group(tmp_path: Path) -> None:
    hook = HookListener(tmp_path / "hook.sock", allowed_uids={0})
    try:
        assert mode(hook.path) == 0o600
    finally:
        hook.close()


@root_only
def test_hook_socket_lets_the_group_send_but_not_read(tmp_path: Path) -> None:
    group = other_group()
    hook = HookListener(tmp_path / "hook.sock", allowed_uids={0}, group=group.gr_name)
    try:
        st = os.stat(hook.path)
        assert stat.S_IMODE(st.st_mode) == 0o620 and st.st_gid == group.gr_gid
    finally:
        hook.close()
    with pytest.raises(ConfigError, match="does not exist"):
        HookListener(tmp_path / "hook2.sock", allowed_uids={0}, group="no-such-group-x")
    assert not (tmp_path / "hook2.sock").exists()


# ----- state directory --------------------------------------------------------------------------
def test_state_dir_and_every_file_are_private(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o777)
    os.chmod(state, 0o777)  # a careless pre-created directory is tightened
    store = Store(state)
    try:
        store.put("k", {"v": 1})
        store.put("k2", 2)  # WAL and shared-memory files exist now
        files = sorted(p.name for p in state.iterdir())
        assert "state.db" in files and len(files) >= 2, files
        assert mode(state) == 0o700
        for item in state.iterdir():
            assert mode(item) == 0o600, item
        assert security.check_private_dir(state) == []
    finally:
        store.close()


def test_check_private_dir_reports_loose_modes(tmp_path: Path) -> None:
    (tmp_path / "db").write_text("x")
    os.chmod(tmp_path, 0o755)
    os.chmod(tmp_path / "db", 0o644)
    problems = security.check_private_dir(tmp_path)
    assert len(problems) == 2
    assert any("chmod 0700" in p for p in problems) and any("chmod 0600" in p for p in problems)


@root_only
def test_state_dir_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    nobody = pwd.getpwnam("nobody")
    os.chown(state, nobody.pw_uid, nobody.pw_gid)
    with pytest.raises(StateError, match="owned by uid .*chown it or choose another"):
        Store(state)
    assert not (state / "state.db").exists()


# ----- hook scripts -----------------------------------------------------------------------------
def hook_file(tmp_path: Path, file_mode: int = 0o755) -> Path:
    folder = tmp_path / "etc" / "slurm"
    folder.mkdir(parents=True)
    path = folder / "epilog_slurmctld"
    path.write_text("#!/bin/sh\n")
    os.chmod(path, file_mode)
    for item in (folder, folder.parent, tmp_path):
        os.chmod(item, 0o755)
    return path


def trusted() -> set[int]:
    return {os.geteuid()}


def test_safe_hook_has_no_problems(tmp_path: Path) -> None:
    path = hook_file(tmp_path)
    # the directories above tmp_path (/tmp: world-writable) are the test host's; check from
    # tmp_path down by treating every ancestor's problems as out of scope
    problems = [p for p in security.check_hook_file(path, trusted())
                if str(tmp_path) in p.split(":")[0]]
    assert problems == []


@pytest.mark.parametrize("target, bad_mode, says", [
    ("file", 0o775, "file is group-writable"),
    ("file", 0o757, "file is world-writable"),
    ("file", 0o644, "not executable"),
    ("dir", 0o777, "directory is world-writable"),
    ("parent", 0o775, "directory is group-writable"),
])
def test_writable_hook_or_parent_is_reported(tmp_path: Path, target: str, bad_mode: int,
                                             says: str) -> None:
    path = hook_file(tmp_path)
    item = {"file": path, "dir": path.parent, "parent": path.parent.parent}[target]
    os.chmod(item, bad_mode)
    problems = security.check_hook_file(path, trusted())
    mine = [p for p in problems if p.startswith(f"{item}:")]
    assert len(mine) == 1 and says in mine[0], problems
    assert "chmod" in mine[0]


@root_only
def test_hook_owned_by_a_user_is_reported(tmp_path: Path) -> None:
    path = hook_file(tmp_path)
    nobody = pwd.getpwnam("nobody")
    os.chown(path, nobody.pw_uid, -1)
    problems = security.check_hook_file(path)  # default: root and the slurm user
    assert any(p.startswith(f"{path}: file owned by nobody") and "chown root" in p
               for p in problems), problems


def test_symlinked_or_missing_hook_is_reported(tmp_path: Path) -> None:
    path = hook_file(tmp_path)
    link = path.parent / "link"
    link.symlink_to(path)
    assert any("a symlink" in p for p in security.check_hook_file(link, trusted()))
    assert security.check_hook_file(tmp_path / "none", trusted())[0].endswith(
        "cannot inspect: No such file or directory")


def test_installed_hooks_of_this_host(tmp_path: Path) -> None:
    """The repository's own hook as shipped must be executable and not group/world-writable."""
    repo = Path(__file__).resolve().parents[1]
    hook = repo / "plugin" / "epilog_slurmctld"
    problems = [p for p in security.check_hook_file(hook, {os.stat(hook).st_uid})
                if p.startswith(str(hook) + ":")]
    assert problems == []


def test_resolve_gid() -> None:
    assert security.resolve_gid(0) == 0 and security.resolve_gid("0") == 0
    assert security.resolve_gid(grp.getgrgid(0).gr_name) == 0
    with pytest.raises(ConfigError, match="a gid is ≥ 0"):
        security.resolve_gid(-1)
