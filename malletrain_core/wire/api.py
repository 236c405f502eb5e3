"""The API's wire form, shared by the daemon's servers and the clients (CLI, launchers).

Newline-delimited JSON over a stream socket: each request line is ``{"v": N, "op": NAME,
"args": {...}}`` and gets one reply line, ``{"v": N, "ok": true, "result": ...}`` or ``{"v": N,
"ok": false, "error": "one line"}``. ``v`` is the protocol version the sender speaks
(:data:`VERSION`); a request without one is from a client of release 0.1, which spoke
version 1. A daemon serves every version from :data:`OLDEST` to :data:`VERSION`, so it is
upgraded before its clients (launchers, CLIs, hooks); a request of a newer version is refused
in one line that names both versions. Over TCP the first line authenticates: ``{"auth": "munge", "credential":
"MUNGE:..."}`` with :data:`AUTH_PAYLOAD` as the credential's payload. A line longer than
:data:`MAX_LINE_BYTES` is refused and the connection closed.
"""

from __future__ import annotations

import json
from typing import Any

from ..errors import MalleTrainError

MAX_LINE_BYTES = 64 * 1024
AUTH_PAYLOAD = "malletrain-api-v1"
DEFAULT_PORT = 7817
VERSION = 1
"""The API protocol version this code speaks."""
OLDEST = 1
"""The oldest version a daemon of this release still serves."""


class ApiError(MalleTrainError):
    """A request the daemon refused, or an answer the client could not use."""


class ApiUnavailable(ApiError):
    """The daemon cannot be reached (not running, wrong address, connection lost)."""


def version_of(request: dict[str, Any]) -> int:
    """The protocol version of a request or reply; ApiError naming both versions when this
    code cannot serve it."""
    v = request.get("v", 1)  # release 0.1 sent no version: it spoke 1
    if isinstance(v, bool) or not isinstance(v, int):
        raise ApiError(f"malformed protocol version {v!r}: expected a whole number")
    if v > VERSION:
        raise ApiError(f"this peer speaks API protocol {VERSION} (oldest served {OLDEST}), the "
                       f"request protocol {v}: upgrade malletraind before its clients")
    if v < OLDEST:
        raise ApiError(f"API protocol {v} is no longer served (this peer speaks {OLDEST} to "
                       f"{VERSION}): upgrade the client (malletrain, malletrain-run)")
    return v


def encode_line(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode() + b"\n"


def encode_error(message: str) -> bytes:
    return encode_line({"v": VERSION, "ok": False, "error": " ".join(str(message).split())})


def parse_address(text: str, default_port: int = DEFAULT_PORT) -> tuple[str, int]:
    """``HOST[:PORT]`` (or ``[v6]:PORT``) → (host, port); one-line error if malformed."""
    text = text.strip()
    host, port = text, str(default_port)
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else port
    elif text.count(":") == 1:
        host, _, port = text.partition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ApiError(f"bad daemon address {text!r}; use HOST:PORT, e.g. head01:{default_port}")
    return host, int(port)
