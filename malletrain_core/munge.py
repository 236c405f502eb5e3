"""Munge credentials: the cluster's own proof of who is calling, from any node.

Wraps the ``munge`` and ``unmunge`` commands through :class:`~malletrain_core.runner.CommandRunner`
(argument lists, timeouts, typed errors). Payloads travel on standard input, never on the
command line, where any local user could read them with ``ps``.

* :meth:`Munge.encode` makes a credential for the calling uid; ``restrict_uid`` limits who may
  decode it (``munge --restrict-uid``; note ``-U``/``--uid`` is something else: it asks for a
  credential *as* another user and needs root).
* :meth:`Munge.decode` checks a credential and returns its uid, gid and payload. munged
  refuses expired, replayed, foreign-key and garbled credentials; each becomes one
  :class:`MungeError` line.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from .errors import CommandError, CommandNotFound, MalleTrainError
from .runner import CommandRunner

MAX_CREDENTIAL_BYTES = 8192
_STATUS_NAMES = {
    1: "snafu", 2: "bad argument", 3: "bad length", 4: "buffer overrun", 5: "out of memory",
    6: "cannot reach munged (check the socket path and that munged runs)",
    7: "munged did not answer in time", 8: "malformed credential", 9: "bad credential version",
    10: "bad cipher", 11: "bad MAC", 12: "bad compression", 13: "bad realm",
    14: "invalid credential (not made with this cluster's key)", 15: "credential expired",
    16: "credential from the future (check clock sync)", 17: "credential replayed",
    18: "credential restricted to another user",
}


class MungeError(MalleTrainError):
    """A credential that cannot be made or is refused; the message is one line."""


@dataclass(frozen=True)
class Credential:
    """A decoded, valid credential."""

    uid: int
    gid: int
    payload: str
    ttl_s: int
    encode_host: str


class Munge:
    """Make and check munge credentials through a (possibly private) munged socket."""

    def __init__(self, socket: str = "", runner: CommandRunner | None = None,
                 ttl_s: int = 300, timeout_s: float = 10.0) -> None:
        self.socket = socket
        self.ttl_s = ttl_s
        self.runner = runner or CommandRunner(timeout_s=timeout_s)

    def _socket_args(self) -> list[str]:
        return ["--socket", self.socket] if self.socket else []

    def encode(self, payload: str = "", restrict_uid: int | None = None,
               ttl_s: int | None = None) -> str:
        """A credential for the caller's uid carrying the text ``payload``."""
        argv = ["munge", *self._socket_args(), "--ttl", str(self.ttl_s if ttl_s is None
                                                            else ttl_s)]
        if restrict_uid is not None:
            argv += ["--restrict-uid", str(int(restrict_uid))]
        try:
            result = self.runner.run(argv, input=payload)
        except CommandNotFound:
            raise MungeError("munge is not installed or not on PATH; install munge on this "
                             "node") from None
        except CommandError as exc:
            raise MungeError(f"cannot make a munge credential: {_last_line(exc.stderr)}") from None
        cred = result.stdout.strip()
        if not cred.startswith("MUNGE:"):
            raise MungeError("munge printed no credential; check munged and its socket")
        return cred

    def decode(self, credential: str) -> Credential:
        """Check ``credential``; raises :class:`MungeError` if munged refuses it."""
        cred = credential.strip()
        if not cred or len(cred) > MAX_CREDENTIAL_BYTES or "\n" in cred:
            raise MungeError("malformed munge credential (empty, too long or multi-line)")
        argv = ["unmunge", *self._socket_args(), "--numeric"]
        try:
            result = self.runner.run(argv, input=cred + "\n", check=False)
        except CommandNotFound:
            raise MungeError("unmunge is not installed or not on PATH; install munge on this "
                             "node") from None
        except CommandError as exc:
            raise MungeError(f"cannot check the munge credential: {exc}") from None
        meta, payload = _split(result.stdout)
        status = _int(meta.get("STATUS"), -1)
        if result.returncode != 0 or status != 0:
            code = status if status > 0 else result.returncode
            reason = _STATUS_NAMES.get(code) or _last_line(result.stderr) or f"status {code}"
            raise MungeError(f"munge credential refused: {reason}")
        if "UID" not in meta or "GID" not in meta:
            raise MungeError("unmunge gave no UID/GID; check the installed munge version")
        return Credential(uid=_int(meta["UID"], -1), gid=_int(meta["GID"], -1),
                          payload=payload, ttl_s=_int(meta.get("TTL"), 0),
                          encode_host=meta.get("ENCODE_HOST", ""))


def _split(text: str) -> tuple[dict[str, str], str]:
    head, _, payload = text.partition("\n\n")
    meta = {}
    for line in head.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            meta[key.strip()] = value.strip()
    return meta, payload


def _int(value: str | None, default: int) -> int:
    try:
        return int(str(value).split()[0])
    except (ValueError, IndexError):
        return default


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    return lines[-1] if lines else ""


class PrivateMunged:
    """A munged of our own: its own key, socket, pid and log files in ``directory``.

    For tests and the one-host demo, where the system's munged must not be touched. Use as a
    context manager, or :meth:`start` and :meth:`stop`.
    """

    def __init__(self, directory: str | os.PathLike[str], key: bytes | None = None,
                 runner: CommandRunner | None = None) -> None:
        self.dir = Path(directory)
        self.key = key if key is not None else os.urandom(1024)
        self.runner = runner or CommandRunner(timeout_s=10.0)
        self.socket = str(self.dir / "munge.socket")
        self._pid_file = self.dir / "munged.pid"

    def start(self) -> PrivateMunged:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.dir.chmod(0o711)
        key_file = self.dir / "munge.key"
        key_file.write_bytes(self.key)
        key_file.chmod(0o600)
        try:
            self.runner.run(["munged", f"--socket={self.socket}", f"--key-file={key_file}",
                             f"--pid-file={self._pid_file}",
                             f"--log-file={self.dir / 'munged.log'}",
                             f"--seed-file={self.dir / 'munged.seed'}"])
        except CommandNotFound:
            raise MungeError("munged is not installed; apt-get install munge") from None
        except CommandError as exc:
            raise MungeError(f"cannot start a private munged: {_last_line(exc.stderr)}") from None
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        try:
            pid = int(self._pid_file.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.02)

    def client(self, **kwargs: object) -> Munge:
        """A :class:`Munge` talking to this munged."""
        return Munge(self.socket, **kwargs)  # type: ignore[arg-type]

    def __enter__(self) -> PrivateMunged:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
