"""The hook datagram: what the Slurm and PBS hooks tell the daemon, one unix datagram each.

One JSON object per datagram, UTF-8, at most :data:`MAX_DATAGRAM_BYTES` bytes::

    {"v": 1, "src": "<hook name>",
     "kind": "job_end" | "nodes_free" | "node_change" | "job_queued",
     "t": <unix time>, ...}

* ``job_end`` — a job (or array task) ended, was requeued or preempted: ``job`` (id string,
  ``A_i`` for a Slurm array task), and optionally ``nodes`` (hostlist string, e.g.
  ``n[01-04]``), ``user``, ``uid`` (int), ``restarts`` (int), ``exit`` (``"code:signal"``),
  ``partition`` (the PBS queue).
* ``nodes_free`` — ``nodes``: a list of node names found free.
* ``node_change`` — ``node`` and its new ``state`` (the batch system's word for it).
* ``job_submit`` — an elastic job was submitted (its id is not known yet); optionally
  ``user``. Sent by job_submit.lua so that a quiet daemon polls at once. With ``"elastic":
  false``: another job was submitted; the daemon holds back the grows it was about to make
  (the job may need those nodes) and does not poll early for it. Such a datagram may carry the
  job's requested nodes, ``nodes`` (hostlist string, ``sbatch -w``), and its ``min_nodes`` /
  ``max_nodes`` where set: a job that names at least as many nodes as it may take can run
  only there (:attr:`JobSubmit.only_nodes`).
* ``job_queued`` — ``job``: an elastic job has just been queued (PBS's postqueuejob hook, which
  runs once the server holds the job, so the woken poll sees it).

Hooks are standard-library scripts that encode this themselves; :func:`decode` is the single
place that validates it. Keys not listed here are ignored, so a newer hook can add fields
without breaking an older daemon; a change of meaning needs a new ``v``. A datagram is a hint
to re-poll, never the truth: the daemon's reconcile against the batch system is.
"""

from __future__ import annotations

import json
import math
import os
import re
import socket
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

from .. import hostlist
from ..errors import MalleTrainError, ValidationError

VERSION = 1
MAX_DATAGRAM_BYTES = 4096
DEFAULT_SOCKET = "/run/malletrain/hook.sock"
SOCKET_ENV = "MALLETRAIN_HOOK_SOCKET"
KINDS = ("job_end", "nodes_free", "node_change", "job_submit", "job_queued")
MAX_HOSTLIST_NODES = 65536
_EXIT = re.compile(r"^-?\d+:\d+$")


class ProtocolError(MalleTrainError):
    """A datagram that is not a valid hook message; the message says what is wrong."""


@dataclass(frozen=True)
class JobEnd:
    """A job or array task ended, was requeued or was preempted."""

    src: str
    t: float
    job: str
    nodes: tuple[str, ...] = ()
    """Expanded node names (the wire carries a hostlist string)."""
    user: str | None = None
    uid: int | None = None
    restarts: int | None = None
    exit: str | None = None
    partition: str | None = None
    kind: str = field(default="job_end", init=False)


@dataclass(frozen=True)
class NodesFree:
    """Nodes a hook found free."""

    src: str
    t: float
    nodes: tuple[str, ...]
    kind: str = field(default="nodes_free", init=False)


@dataclass(frozen=True)
class NodeChange:
    """One node changed state (the batch system's own state word)."""

    src: str
    t: float
    node: str
    state: str
    kind: str = field(default="node_change", init=False)


@dataclass(frozen=True)
class JobSubmit:
    """A job was submitted (the hook runs before Slurm gives it an id): an elastic one, or with
    ``elastic`` false another (a production job), which does not wake the daemon: it holds
    back the daemon's grows until Slurm has planned it, and the tasks released for grows that
    have not started yet are held again at once."""

    src: str
    t: float
    user: str | None = None
    elastic: bool = True
    only_nodes: tuple[str, ...] = ()
    """The nodes the job can run on, where its request confines it to them (``-w`` naming
    every node it may take); empty: any node."""
    kind: str = field(default="job_submit", init=False)


@dataclass(frozen=True)
class JobQueued:
    """An elastic job was just queued (PBS: its id is known)."""

    src: str
    t: float
    job: str
    kind: str = field(default="job_queued", init=False)


Message = Union[JobEnd, NodesFree, NodeChange, JobSubmit, JobQueued]


def _get(obj: dict[str, Any], key: str, kind: type | tuple[type, ...], required: bool,
         what: str) -> Any:
    if key not in obj or obj[key] is None:
        if required:
            raise ProtocolError(f"hook datagram: missing field {key!r} ({what})")
        return None
    value = obj[key]
    if isinstance(value, bool) or not isinstance(value, kind):
        raise ProtocolError(f"hook datagram: field {key!r} must be {what}, "
                            f"got {type(value).__name__}")
    return value


def _name(obj: dict[str, Any], key: str, required: bool = True) -> str | None:
    value = _get(obj, key, str, required, "a non-empty string")
    if value is not None and not value.strip():
        raise ProtocolError(f"hook datagram: field {key!r} must be a non-empty string")
    return value


def _count(obj: dict[str, Any], key: str) -> int | None:
    value = _get(obj, key, int, False, "a non-negative integer")
    if value is not None and value < 0:
        raise ProtocolError(f"hook datagram: field {key!r} must be >= 0, got {value}")
    return value


def expand_hostlist(text: str) -> tuple[str, ...]:
    """``n[01-03],m5`` -> ``('m5', 'n01', 'n02', 'n03')`` (ProtocolError when malformed or
    naming more than :data:`MAX_HOSTLIST_NODES` nodes); see :mod:`malletrain_core.hostlist`."""
    try:
        return tuple(hostlist.expand(text, max_nodes=MAX_HOSTLIST_NODES))
    except ValidationError as exc:
        raise ProtocolError(f"hook datagram: {exc}") from None


def decode(data: bytes) -> Message:
    """Validate one datagram and return its typed message (ProtocolError with a one-line
    reason otherwise)."""
    if len(data) > MAX_DATAGRAM_BYTES:
        raise ProtocolError(f"hook datagram: {len(data)} bytes, more than {MAX_DATAGRAM_BYTES}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ProtocolError(f"hook datagram: not UTF-8 (byte {exc.start})") from None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ProtocolError(f"hook datagram: not JSON ({exc.msg} at char {exc.pos})") from None
    except RecursionError:
        raise ProtocolError("hook datagram: JSON nested too deeply") from None
    if not isinstance(obj, dict):
        raise ProtocolError(f"hook datagram: a JSON object expected, got {type(obj).__name__}")
    try:  # "\ud800" escapes decode to lone surrogates, which no later writer can encode
        json.dumps(obj, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise ProtocolError("hook datagram: a string holds a lone surrogate escape "
                            "(not Unicode text)") from None
    version = obj.get("v")
    if isinstance(version, bool) or version != VERSION:
        newer = isinstance(version, int) and version > VERSION
        raise ProtocolError(f"hook datagram: version {version!r} not understood (this daemon "
                            f"speaks v={VERSION})" + ("; upgrade malletraind before the hooks"
                                                      if newer else ""))
    kind = obj.get("kind")
    if kind not in KINDS:
        raise ProtocolError(f"hook datagram: unknown kind {kind!r}; one of {', '.join(KINDS)}")
    src = _name(obj, "src")
    raw_t = _get(obj, "t", (int, float), True, "a number (unix time)")
    t = float(raw_t) if -1e300 < raw_t < 1e300 else math.inf  # a huge int overflows float()
    if not math.isfinite(t) or t < 0:
        raise ProtocolError(f"hook datagram: field 't' must be a unix time, got {t}")
    assert src is not None
    if kind == "job_end":
        nodes = _get(obj, "nodes", str, False, "a hostlist string")
        exit_code = _get(obj, "exit", str, False, "a string 'code:signal'")
        if exit_code is not None and not _EXIT.match(exit_code):
            raise ProtocolError(f"hook datagram: field 'exit' must look like '0:15', "
                                f"got {exit_code!r}")
        return JobEnd(src=src, t=t, job=str(_name(obj, "job")),
                      nodes=expand_hostlist(nodes) if nodes else (),
                      user=_name(obj, "user", required=False), uid=_count(obj, "uid"),
                      restarts=_count(obj, "restarts"), exit=exit_code,
                      partition=_name(obj, "partition", required=False))
    if kind == "nodes_free":
        names = _get(obj, "nodes", list, True, "a list of node names")
        if not all(isinstance(n, str) and n.strip() for n in names):
            raise ProtocolError("hook datagram: field 'nodes' must list non-empty node names")
        return NodesFree(src=src, t=t, nodes=tuple(names))
    if kind == "job_submit":
        elastic = obj.get("elastic", True)
        if not isinstance(elastic, bool):
            raise ProtocolError("hook datagram: field 'elastic' must be true or false, got "
                                f"{type(elastic).__name__}")
        only: tuple[str, ...] = ()
        requested = _name(obj, "nodes", required=False)
        counts = [_count(obj, "min_nodes"), _count(obj, "max_nodes")]
        if requested is not None and not elastic:
            named = expand_hostlist(requested)
            if all(c is None or c <= len(named) for c in counts):
                only = named  # -w names all it takes (-N above the list takes others too)
        return JobSubmit(src=src, t=t, user=_name(obj, "user", required=False), elastic=elastic,
                         only_nodes=only)
    if kind == "job_queued":
        return JobQueued(src=src, t=t, job=str(_name(obj, "job")))
    return NodeChange(src=src, t=t, node=str(_name(obj, "node")),
                      state=str(_name(obj, "state")))


def encode(msg: Message) -> bytes:
    """The datagram for ``msg`` (ProtocolError if it would exceed the size limit)."""
    obj: dict[str, Any] = {"v": VERSION, "src": msg.src, "kind": msg.kind, "t": msg.t}
    if isinstance(msg, JobEnd):
        obj["job"] = msg.job
        if msg.nodes:
            obj["nodes"] = hostlist.fold(msg.nodes)
        for key in ("user", "uid", "restarts", "exit", "partition"):
            if getattr(msg, key) is not None:
                obj[key] = getattr(msg, key)
    elif isinstance(msg, NodesFree):
        obj["nodes"] = list(msg.nodes)
    elif isinstance(msg, JobSubmit):
        if msg.user is not None:
            obj["user"] = msg.user
        if not msg.elastic:
            obj["elastic"] = False
            if msg.only_nodes:
                obj["nodes"] = hostlist.fold(msg.only_nodes)
    elif isinstance(msg, JobQueued):
        obj["job"] = msg.job
    else:
        obj["node"] = msg.node
        obj["state"] = msg.state
    data = json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    if len(data) > MAX_DATAGRAM_BYTES:
        raise ProtocolError(f"hook datagram: {len(data)} bytes, more than {MAX_DATAGRAM_BYTES}; "
                            "split the node list over several datagrams")
    return data


def socket_path() -> str:
    """Where hooks send: ``$MALLETRAIN_HOOK_SOCKET``, else :data:`DEFAULT_SOCKET`."""
    return os.environ.get(SOCKET_ENV) or DEFAULT_SOCKET


def send(msg: Message, path: str | None = None) -> bool:
    """Send without ever blocking; False when nobody listens (the daemon may be down)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        sock.sendto(encode(msg), socket.MSG_DONTWAIT, path or socket_path())
        return True
    except (BlockingIOError, FileNotFoundError, ConnectionRefusedError):
        return False
    finally:
        sock.close()


@dataclass(frozen=True)
class Received:
    """One datagram as the daemon's socket got it: the message and the sender's identity
    as the kernel reports it (SCM_CREDENTIALS), not as the message claims."""

    message: Message
    pid: int
    uid: int
    gid: int


class HookSocket:
    """The receiving end of the hook socket: a unix datagram socket that learns each sender's
    uid from the kernel.

    ``bind()`` creates the socket, mode 0o622 by default (any local user may send; the
    receiver decides by the kernel-reported uid what to believe), which suits tests and tools.
    The daemon reads its socket through :class:`malletrain_core.daemon.intake.HookListener`,
    private or SlurmUser-group-only. ``receive()`` returns one :class:`Received` or raises
    ProtocolError for a bad datagram.
    """

    def __init__(self, path: str | Path, mode: int = 0o622) -> None:
        self.path = Path(path)
        self.mode = mode
        self.sock: socket.socket | None = None

    def bind(self) -> HookSocket:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.is_socket():
            self.path.unlink()
        elif self.path.exists():
            raise ProtocolError(f"{self.path}: exists and is not a socket; remove it or choose "
                                f"another path (${SOCKET_ENV})")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        try:
            sock.bind(str(self.path))
        except OSError as exc:
            sock.close()
            raise ProtocolError(f"{self.path}: cannot listen: {exc.strerror}") from None
        self.path.chmod(self.mode)
        self.sock = sock
        return self

    def receive_raw(self, timeout_s: float | None = None) -> tuple[bytes, int, int, int]:
        """The next datagram undecoded, with the sender's (pid, uid, gid) from the kernel
        (-1 when not given). ``socket.timeout`` when none arrives within ``timeout_s``;
        ``BlockingIOError`` when ``timeout_s`` is 0 and none is waiting. A datagram longer
        than :data:`MAX_DATAGRAM_BYTES` comes back one byte longer than that limit."""
        if self.sock is None:
            raise ProtocolError(f"{self.path}: listener not bound; call bind() first")
        self.sock.settimeout(timeout_s)
        data, anc, _flags, _addr = self.sock.recvmsg(
            MAX_DATAGRAM_BYTES + 1, socket.CMSG_SPACE(struct.calcsize("3i")))
        pid = uid = gid = -1
        for level, kind, payload in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                pid, uid, gid = struct.unpack("3i", payload[:struct.calcsize("3i")])
        return data, pid, uid, gid

    def receive(self, timeout_s: float | None = None) -> Received:
        """The next datagram (``socket.timeout`` when none arrives within ``timeout_s``)."""
        data, pid, uid, gid = self.receive_raw(timeout_s)
        return Received(decode(data), pid, uid, gid)

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        if self.path.is_socket():
            self.path.unlink()

    def __enter__(self) -> HookSocket:
        return self.bind()

    def __exit__(self, *exc: object) -> None:
        self.close()
