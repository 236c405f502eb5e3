"""Clients of the daemon's API: :class:`UnixClient` on the daemon's host, :class:`TcpClient`
(munge-authenticated) from login and compute nodes. Used by the CLI and by ``malletrain-run``."""

from __future__ import annotations

import json
import socket
import threading
from typing import Any

from ..errors import MalleTrainError
from ..jobsecret import JobSecretAuth
from ..munge import Munge
from ..wire.api import (
    AUTH_PAYLOAD,
    MAX_LINE_BYTES,
    VERSION,
    ApiError,
    ApiUnavailable,
    encode_line,
)


class _Client:
    """A persistent connection; :meth:`call` reconnects once if the daemon dropped it."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._sock: socket.socket | None = None
        self._file: Any = None
        self._lock = threading.Lock()

    def _connect(self) -> socket.socket:
        raise NotImplementedError

    def _where(self) -> str:
        raise NotImplementedError

    def _open(self) -> None:
        try:
            self._sock = self._connect()
        except OSError as exc:
            raise ApiUnavailable(f"cannot reach the MalleTrain daemon at {self._where()}: "
                                 f"{exc.strerror or exc}; is malletraind running?") from None
        self._file = self._sock.makefile("rb")
        self._after_connect()

    def _after_connect(self) -> None:
        pass

    def _exchange(self, payload: bytes) -> dict[str, Any]:
        assert self._sock is not None
        try:
            try:
                self._sock.sendall(payload)
            except BrokenPipeError:
                pass  # the daemon refused and closed its side: its reply may still be queued
            line = self._file.readline(MAX_LINE_BYTES + 1)
        except OSError as exc:
            self.close()
            raise ApiUnavailable(f"lost the connection to the daemon at {self._where()}: "
                                 f"{exc}") from None
        if not line:
            self.close()
            raise ApiUnavailable(f"the daemon at {self._where()} closed the connection")
        try:
            reply = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            self.close()
            raise ApiError(f"the daemon at {self._where()} sent a malformed reply") from None
        if not isinstance(reply, dict) or "ok" not in reply:
            raise ApiError(f"the daemon at {self._where()} sent a malformed reply")
        return reply

    def connect(self) -> None:
        """Open (and authenticate) the connection now rather than on the first call."""
        with self._lock:
            if self._sock is None:
                self._open()

    def call(self, op: str, **args: Any) -> Any:
        """Send one request; returns its result or raises :class:`ApiError`."""
        payload = encode_line({"v": VERSION, "op": op, "args": args})
        if len(payload) > MAX_LINE_BYTES:
            raise ApiError(f"request {op!r} is {len(payload)} bytes, over the daemon's limit of "
                           f"{MAX_LINE_BYTES}; send less per call")
        with self._lock:
            fresh = self._sock is None
            if fresh:
                self._open()
            try:
                reply = self._exchange(payload)
            except ApiUnavailable:
                if fresh:
                    raise
                self._open()
                reply = self._exchange(payload)
        if not reply["ok"]:
            raise ApiError(str(reply.get("error", "request refused")))
        return reply.get("result")

    def close(self) -> None:
        for obj in (self._file, self._sock):
            if obj is not None:
                try:
                    obj.close()
                except OSError:
                    pass
        self._sock = self._file = None

    def __enter__(self) -> _Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class UnixClient(_Client):
    """Client of the local API socket."""

    def __init__(self, path: str, timeout_s: float = 30.0) -> None:
        super().__init__(timeout_s)
        self.path = path

    def _where(self) -> str:
        return self.path

    def _connect(self) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout_s)
        try:
            sock.connect(self.path)
        except OSError:
            sock.close()
            raise
        return sock


class TcpClient(_Client):
    """Client of the network API, authenticated by a fresh munge credential per connection
    (or a job-secret one: :class:`~malletrain_core.jobsecret.JobSecretAuth` stands in for
    :class:`Munge`)."""

    def __init__(self, host: str, port: int, munge: Munge | JobSecretAuth,
                 timeout_s: float = 30.0) -> None:
        super().__init__(timeout_s)
        self.host, self.port, self.munge = host, int(port), munge
        self.uid: int | None = None

    def _where(self) -> str:
        return f"{self.host}:{self.port}"

    def _connect(self) -> socket.socket:
        return socket.create_connection((self.host, self.port), timeout=self.timeout_s)

    def local_address(self) -> str | None:
        """This end's IP address on the connection (the interface that reaches the daemon)."""
        return None if self._sock is None else str(self._sock.getsockname()[0])

    def _after_connect(self) -> None:
        try:
            credential = self.munge.encode(AUTH_PAYLOAD)
        except MalleTrainError:  # MungeError, JobSecretError
            self.close()
            raise
        reply = self._exchange(encode_line({"v": VERSION, "auth": getattr(
            self.munge, "scheme", "munge"), "credential": credential}))
        if not reply["ok"]:
            self.close()
            raise ApiError(f"the daemon refused our credential: {reply.get('error')}")
        self.uid = int(reply["result"]["uid"])
