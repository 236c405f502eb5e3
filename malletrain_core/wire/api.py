"""The API's wire form, shared by the daemon's servers and the clients (CLI, launchers).

Newline-delimited JSON over a stream socket: each request line is ``{"op": NAME, "args":
{...}}`` and gets one reply line, ``{"ok": true, "result": ...}`` or ``{"ok": false, "error":
"one line"}``. Over TCP the first line authenticates: ``{"auth": "munge", "credential":
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


class ApiError(MalleTrainError):
    """A request the daemon refused, or an answer the client could not use."""


class ApiUnavailable(ApiError):
    """The daemon cannot be reached (not running, wrong address, connection lost)."""


def encode_line(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode() + b"\n"


def encode_error(message: str) -> bytes:
    return encode_line({"ok": False, "error": " ".join(str(message).split())})


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
