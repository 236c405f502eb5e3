"""The daemon's API: newline-delimited JSON over stream sockets, with the caller's uid proven.

Two transports share one :class:`Dispatcher`:

* a unix socket on the daemon's host, where the kernel tells the peer's uid (``SO_PEERCRED``);
* TCP for launchers and CLIs on other nodes, where the first line must carry a munge
  credential (``{"auth": "munge", "credential": "MUNGE:..."}`` whose payload is
  :data:`AUTH_PAYLOAD`); munged checks it (key, expiry, replay) and gives the uid.

Then each line is one request ``{"op": NAME, "args": {...}}`` and gets one reply line,
``{"ok": true, "result": ...}`` or ``{"ok": false, "error": "one line"}``. Handlers are
registered by the daemon and get the authenticated uid. Malformed, oversized or failing
requests get a one-line error; nothing a client sends stops the server.
"""

from __future__ import annotations

import json
import logging
import os
import select
import socket
import socketserver
import stat
import struct
import threading
import time
from collections.abc import Callable, Collection
from typing import Any

from ..errors import MalleTrainError
from ..jobsecret import SCHEME as JOB_SECRET
from ..jobsecret import JobSecretError, JobSecretVerifier
from ..munge import Munge, MungeError
from ..security import API_SOCKET_GROUP, restrict_socket
from ..wire.api import (
    AUTH_PAYLOAD,
    MAX_LINE_BYTES,
    VERSION,
    ApiError,
    version_of,
)
from ..wire.api import (
    encode_error as _error,
)
from ..wire.api import (
    encode_line as _line,
)

log = logging.getLogger(__name__)

# After refusing an oversized request: how long and how much to read and discard before closing.
LINGER_S = 2.0
LINGER_MAX_BYTES = 16 * MAX_LINE_BYTES
Handler = Callable[[int, dict[str, Any]], Any]
_call = threading.local()  # the connection whose request this thread's handler is serving


def caller_gone() -> bool:
    """Inside a handler: whether the client whose request it serves has closed its connection
    (end of stream or reset), for a handler that holds its reply (a launcher's held check-in:
    a launcher the batch system killed closes it at once). False outside a request, while the
    server is closing (its own shutdown of the connections is not the client's), and where the
    client has sent more bytes (it is alive)."""
    conn: _Connection | None = getattr(_call, "conn", None)
    if conn is None or conn.server.closing:
        return False
    sock = conn.request
    try:
        readable, _, _ = select.select([sock], [], [], 0)
        if not readable:
            return False
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except (BlockingIOError, InterruptedError):
        return False
    except (OSError, ValueError):  # reset, or closed under us
        return not conn.server.closing


class Dispatcher:
    """Maps op names to handlers and turns one request line into one reply line.

    Ops registered with ``admin=True`` are refused to every caller whose uid is not in
    ``admin_uids`` (root and the SlurmUser, as the daemon configures it) before their handler
    runs; the others get the caller's uid and decide per job (a user: only their own).
    """

    def __init__(self, admin_uids: Collection[int] = frozenset({0})) -> None:
        self._handlers: dict[str, Handler] = {}
        self._admin_ops: set[str] = set()
        self.admin_uids = frozenset(admin_uids)

    def register(self, op: str, handler: Handler, admin: bool = False) -> None:
        self._handlers[op] = handler
        if admin:
            self._admin_ops.add(op)
        else:
            self._admin_ops.discard(op)

    def is_admin_op(self, op: str) -> bool:
        return op in self._admin_ops

    def ops(self) -> list[str]:
        return sorted(self._handlers)

    def dispatch(self, uid: int, line: bytes) -> bytes:
        try:
            request = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
            return _error("malformed request: send one JSON object per line")
        if not isinstance(request, dict) or not isinstance(request.get("op"), str):
            return _error('malformed request: expected {"op": NAME, "args": {...}}')
        op, args = request["op"], request.get("args", {})
        try:
            version_of(request)
        except ApiError as exc:
            return _error(str(exc))
        if not isinstance(args, dict):
            return _error(f"malformed request for {op!r}: 'args' must be a JSON object")
        handler = self._handlers.get(op)
        if handler is None:
            return _error(f"unknown op {op!r}; known ops: {', '.join(self.ops())}")
        if op in self._admin_ops and uid not in self.admin_uids:
            log.warning("api: uid %d refused admin op %r", uid, op)
            return _error(f"{op!r} is an administrator's operation (root or the SlurmUser); "
                          f"uid {uid} may not use it")
        try:
            result = handler(uid, args)
        except MalleTrainError as exc:
            return _error(str(exc))
        except Exception:
            log.exception("api: handler for %r failed", op)
            return _error(f"internal error in {op!r}; see the daemon log")
        try:
            return _line({"v": VERSION, "ok": True, "result": result})
        except (TypeError, ValueError):
            log.error("api: handler for %r returned a value that is not JSON", op)
            return _error(f"internal error in {op!r}; see the daemon log")


class _Connection(socketserver.StreamRequestHandler):
    """One client connection: authenticate, then answer request lines until EOF."""

    server: _ServerMixin  # type: ignore[assignment]

    def setup(self) -> None:
        self.request.settimeout(self.server.idle_timeout_s)
        super().setup()

    def _readline(self) -> bytes | None:
        line = self.rfile.readline(MAX_LINE_BYTES + 1)
        if not line:
            return None
        if len(line) > MAX_LINE_BYTES or not line.endswith(b"\n"):
            self.wfile.write(_error(f"request exceeds {MAX_LINE_BYTES} bytes or lacks a "
                                    "newline; connection closed"))
            self._linger_close()
            return None
        return line

    def _linger_close(self) -> None:
        """Let a client that is still sending read the refusal before the connection goes.

        Closing a socket with unread bytes in its receive queue makes the kernel reset the
        connection (TCP RST; ECONNRESET on a unix socket), and the client then never sees the
        reply already queued for it. So: send FIN after the reply, then discard what the client
        still sends until it closes its side, bounded in bytes and time.
        """
        try:
            self.request.shutdown(socket.SHUT_WR)
            self.request.settimeout(LINGER_S)
            deadline = time.monotonic() + LINGER_S
            drained = 0
            while drained < LINGER_MAX_BYTES and time.monotonic() < deadline:
                chunk = self.request.recv(65536)
                if not chunk:
                    break
                drained += len(chunk)
        except OSError:
            pass

    def handle(self) -> None:
        try:
            uid = self.server.authenticate(self)
            if uid is None:
                return
            while True:
                line = self._readline()
                if line is None:
                    return
                if line.strip():
                    _call.conn = self
                    try:
                        reply = self.server.dispatcher.dispatch(uid, line)
                    finally:
                        _call.conn = None
                    self.wfile.write(reply)
        except (OSError, ValueError):
            return  # client went away or idled out


class _ServerMixin:
    dispatcher: Dispatcher
    idle_timeout_s: float
    max_connections: int
    closing: bool
    _open: set[socket.socket]
    _count_lock: threading.Lock
    _thread: threading.Thread | None

    def authenticate(self, conn: _Connection) -> int | None:
        raise NotImplementedError

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._count_lock:
            full = len(self._open) >= self.max_connections
            if not full:
                self._open.add(request)
        if full:
            try:
                request.sendall(_error("too many connections; try again shortly"))
            except OSError:
                pass
            self.shutdown_request(request)  # type: ignore[attr-defined]
            return
        super().process_request(request, client_address)  # type: ignore[misc]

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)  # type: ignore[misc]
        finally:
            with self._count_lock:
                self._open.discard(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.exception("api: connection from %r failed", client_address)

    def start(self) -> None:
        """Serve in a background daemon thread."""
        self._thread = threading.Thread(target=self.serve_forever,  # type: ignore[attr-defined]
                                        name=type(self).__name__, daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop serving, close the listening socket and every open connection."""
        self.closing = True
        if self._thread is not None:
            self.shutdown()  # type: ignore[attr-defined]
            self._thread.join(5)
            self._thread = None
        self.server_close()  # type: ignore[attr-defined]
        with self._count_lock:
            conns = list(self._open)
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _init_common(self, dispatcher: Dispatcher, idle_timeout_s: float,
                     max_connections: int) -> None:
        self.dispatcher = dispatcher
        self.idle_timeout_s = idle_timeout_s
        self.max_connections = max_connections
        self.closing = False
        self._open = set()
        self._count_lock = threading.Lock()
        self._thread = None


class UnixApiServer(_ServerMixin, socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    """The local API: the caller's uid is the socket peer's, from ``SO_PEERCRED``.

    Who may connect is the socket's mode: with ``group`` (a name or gid, ``daemon.api_group``)
    the socket belongs to that group, mode 0o660; without, it is private to the daemon's user
    (0o600) and other users reach the daemon through the munge-authenticated TCP API.
    ``mode`` overrides either default.
    """

    daemon_threads = True
    block_on_close = False

    def __init__(self, path: str, dispatcher: Dispatcher, mode: int | None = None,
                 idle_timeout_s: float = 60.0, max_connections: int = 256,
                 group: str | int | None = None) -> None:
        self._init_common(dispatcher, idle_timeout_s, max_connections)
        self.path = path
        try:
            if stat.S_ISSOCK(os.lstat(path).st_mode):
                os.unlink(path)  # a stale socket from a previous run
        except FileNotFoundError:
            pass
        try:
            super().__init__(path, _Connection)
        except OSError as exc:
            raise ApiError(f"cannot listen on the API socket {path}: {exc.strerror}; check "
                           "daemon.api_socket and its folder") from None
        try:
            self.mode = restrict_socket(path, group, API_SOCKET_GROUP, mode)
        except MalleTrainError:
            self.server_close()
            raise

    def authenticate(self, conn: _Connection) -> int | None:
        return peer_uid(conn.request)

    def server_close(self) -> None:
        super().server_close()
        try:
            os.unlink(self.path)
        except OSError:
            pass


class TcpApiServer(_ServerMixin, socketserver.ThreadingMixIn, socketserver.TCPServer):
    """The network API: the first line must carry a valid munge credential."""

    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], dispatcher: Dispatcher, munge: Munge,
                 idle_timeout_s: float = 60.0, max_connections: int = 256,
                 job_secret: JobSecretVerifier | None = None) -> None:
        self._init_common(dispatcher, idle_timeout_s, max_connections)
        self.munge = munge
        self.job_secret = job_secret
        """Where munge is absent (PBS): launchers may prove their job by its secret."""
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, _Connection)

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def authenticate(self, conn: _Connection) -> int | None:
        line = conn._readline()
        if line is None:
            return None
        try:
            hello = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
            hello = None
        if isinstance(hello, dict):
            try:
                version_of(hello)
            except ApiError as exc:
                conn.wfile.write(_error(str(exc)))
                return None
        scheme = hello.get("auth") if isinstance(hello, dict) else None
        if scheme not in ("munge", JOB_SECRET) or not isinstance(hello.get("credential"), str):
            conn.wfile.write(_error('authenticate first: {"auth": "munge", "credential": '
                                    '"<output of munge>"}'))
            return None
        if scheme == JOB_SECRET and self.job_secret is None:
            conn.wfile.write(_error("this daemon takes munge credentials only (no "
                                    "pbs.job_key_file); run munged on this node"))
            return None
        try:
            if scheme == JOB_SECRET:
                assert self.job_secret is not None
                cred = self.job_secret.decode(hello["credential"], AUTH_PAYLOAD)
            else:
                cred = self.munge.decode(hello["credential"])
        except (MungeError, JobSecretError) as exc:
            log.warning("api: refused a connection from %s: %s", conn.client_address[0], exc)
            conn.wfile.write(_error(str(exc)))
            return None
        if cred.payload != AUTH_PAYLOAD:
            conn.wfile.write(_error("munge credential was not made for the MalleTrain API"))
            return None
        conn.wfile.write(_line({"v": VERSION, "ok": True, "result": {"uid": cred.uid}}))
        return cred.uid


def peer_uid(sock: socket.socket) -> int:
    """The uid of the process at the other end of a unix stream socket."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return int(uid)


