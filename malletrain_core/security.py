"""Least-privilege helpers: who owns the daemon's sockets and files, and whether the hook
scripts that run as root or SlurmUser can be changed by anyone else.

The rules (docs/security.md explains each one and names the test that proves it):

* the local API socket is reachable by its owner (root) and, when ``daemon.api_group`` names a
  group, by that group's members (mode 0o660); never by everyone;
* the hook socket accepts datagrams from root and the SlurmUser only: mode 0o620 with the
  group ``daemon.hook_group`` (the SlurmUser's), or 0o600 when no group is named;
* the state directory is 0700 and every file in it 0600;
* a hook script, and every directory above it, is owned by root or the SlurmUser and is
  neither group- nor world-writable, so no user can swap the code that runs with their
  privileges.
"""

from __future__ import annotations

import grp
import os
import pwd
import stat
from collections.abc import Collection, Iterable
from pathlib import Path

from .errors import ConfigError

SOCKET_PRIVATE = 0o600
API_SOCKET_GROUP = 0o660
HOOK_SOCKET_GROUP = 0o620


def resolve_gid(group: str | int) -> int:
    """A group given by name or number → its gid (ConfigError naming it if unknown)."""
    if isinstance(group, int) and not isinstance(group, bool):
        if group < 0:
            raise ConfigError(f"group {group}: a gid is ≥ 0")
        return group
    text = str(group).strip()
    if text.isdigit():
        return int(text)
    try:
        return grp.getgrnam(text).gr_gid
    except KeyError:
        raise ConfigError(f"group {text!r} does not exist on this host; create it (groupadd) "
                          "or name another in the configuration") from None


def user_uids(names: Iterable[str]) -> set[int]:
    """root's uid plus the uids of the named users that exist on this host."""
    uids = {0}
    for name in names:
        try:
            uids.add(pwd.getpwnam(name).pw_uid)
        except KeyError:
            continue
    return uids


def restrict_socket(path: str | os.PathLike[str], group: str | int | None,
                    group_mode: int, mode: int | None = None) -> int:
    """Give a freshly bound unix socket its owner group and mode; returns the mode set.

    With no ``group`` the socket is private to its owner (0o600) unless ``mode`` says
    otherwise; with one, it is chowned to that group and gets ``group_mode``. A socket is
    never left writable by others unless the caller asks for it explicitly through ``mode``.
    """
    if group is not None and group != "":
        gid = resolve_gid(group)
        try:
            os.chown(path, -1, gid)
        except OSError as exc:
            raise ConfigError(f"{path}: cannot give the socket to group {group!r}: "
                              f"{exc.strerror}; run the daemon as root or as a member of "
                              "that group") from None
        chosen = group_mode if mode is None else mode
    else:
        chosen = SOCKET_PRIVATE if mode is None else mode
    os.chmod(path, chosen)
    return chosen


def _owner(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def check_hook_file(path: str | os.PathLike[str],
                    trusted_uids: Collection[int] | None = None) -> list[str]:
    """Why the hook script ``path`` could be changed by someone other than root or the
    SlurmUser: one line per problem, empty when it is safe.

    The script and every directory above it must be owned by a trusted uid (root and the
    ``slurm`` user by default) and not be group- or world-writable. A directory like
    ``/tmp`` is reported even though its sticky bit protects other users' files: a hook does
    not belong where anyone may create names.
    """
    trusted = set(user_uids(["slurm"]) if trusted_uids is None else trusted_uids)
    names = ", ".join(sorted(_owner(u) for u in trusted))
    file = Path(os.path.abspath(path))
    problems: list[str] = []
    try:
        st = os.stat(file)
    except OSError as exc:
        return [f"{file}: cannot inspect: {exc.strerror}"]
    if not stat.S_ISREG(st.st_mode):
        problems.append(f"{file}: not a regular file")
    if not st.st_mode & 0o111:
        problems.append(f"{file}: not executable; chmod 0755 it")
    for item in [file, *file.parents]:
        try:
            st = os.lstat(item)
        except OSError as exc:
            problems.append(f"{item}: cannot inspect: {exc.strerror}")
            continue
        kind = "directory" if stat.S_ISDIR(st.st_mode) else "file"
        if stat.S_ISLNK(st.st_mode):
            kind = "symlink"
            if item == file:
                problems.append(f"{item}: a symlink; install the hook itself, not a link")
                continue
            st = os.stat(item)
        if st.st_uid not in trusted:
            problems.append(f"{item}: {kind} owned by {_owner(st.st_uid)}, not by {names}; "
                            f"chown root {item}")
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            who = "world" if st.st_mode & stat.S_IWOTH else "group"
            problems.append(f"{item}: {kind} is {who}-writable (mode "
                            f"{stat.S_IMODE(st.st_mode):04o}); chmod go-w {item}")
    return problems


def check_private_dir(path: str | os.PathLike[str]) -> list[str]:
    """Why the state directory ``path`` or a file in it is readable or writable by anyone but
    its owner: one line per problem, empty when it is private (0700 directory, 0600 files)."""
    root = Path(path)
    problems: list[str] = []
    try:
        entries = [root, *sorted(root.iterdir())]
    except OSError as exc:
        return [f"{root}: cannot inspect: {exc.strerror}"]
    owner = os.lstat(root).st_uid
    for item in entries:
        st = os.lstat(item)
        if stat.S_IMODE(st.st_mode) & 0o077:
            want = "0700" if stat.S_ISDIR(st.st_mode) else "0600"
            problems.append(f"{item}: mode {stat.S_IMODE(st.st_mode):04o} lets other users in; "
                            f"chmod {want} {item}")
        if st.st_uid != owner:
            problems.append(f"{item}: owned by {_owner(st.st_uid)}, not by the daemon's "
                            f"{_owner(owner)}")
    return problems
