"""How the read-only sub-commands reach ``malletraind``.

On the daemon's host: the unix socket ``daemon.api_socket`` (the kernel proves the caller's
uid). Where that socket is missing or closed to the caller (a login node, a user outside the
socket's group): the munge-authenticated TCP API at ``--daemon HOST[:PORT]``, else
``$MALLETRAIN_DAEMON``, else ``daemon.api_host:daemon.api_port`` from the configuration.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from ..config import Config, load
from ..munge import Munge, MungeError
from ..wire.api import ApiUnavailable, parse_address
from ..worker.client import TcpClient, UnixClient
from .output import CliError

ENV_DAEMON = "MALLETRAIN_DAEMON"
TIMEOUT_S = 30.0
_ANY_ADDRESS = ("", "0.0.0.0", "::", "[::]")


def add_connection_args(parser: argparse.ArgumentParser) -> None:
    """``--config`` and ``--daemon``."""
    parser.add_argument("--config", metavar="FILE",
                        help="configuration file (default: $MALLETRAIN_CONFIG or "
                             "/etc/malletrain/malletrain.toml)")
    parser.add_argument("--daemon", metavar="HOST:PORT",
                        help=f"reach malletraind over TCP (munge) at this address (default: "
                             f"${ENV_DAEMON}, else the local socket, else "
                             "daemon.api_host:api_port)")


def unreachable(where: list[str]) -> CliError:
    return CliError(f"cannot reach malletraind at {' or '.join(where)}: is it running? "
                    "(systemctl status malletraind)")


def connect(args: argparse.Namespace) -> UnixClient | TcpClient:
    """An open, authenticated client (see the module docstring for the order tried)."""
    config: Config = load(getattr(args, "config", None))
    target = getattr(args, "daemon", None) or os.environ.get(ENV_DAEMON)
    tried: list[str] = []
    if not target:
        local = UnixClient(config.daemon.api_socket, timeout_s=TIMEOUT_S)
        try:
            local.connect()
            return local
        except ApiUnavailable:
            tried.append(config.daemon.api_socket)
        if not config.daemon.api_port:
            raise unreachable(tried)
        host = config.daemon.api_host
        host = "localhost" if host in _ANY_ADDRESS else host
        address = (host, config.daemon.api_port)
    else:
        address = parse_address(target, config.daemon.api_port or 7817)
    where = f"[{address[0]}]:{address[1]}" if ":" in address[0] else f"{address[0]}:{address[1]}"
    remote = TcpClient(*address, munge=Munge(config.munge.socket), timeout_s=TIMEOUT_S)
    try:
        remote.connect()
    except ApiUnavailable:
        raise unreachable(tried + [where]) from None
    except MungeError as exc:
        raise CliError(f"cannot authenticate to malletraind at {where}: {exc}") from None
    return remote


def call(args: argparse.Namespace, op: str, **op_args: Any) -> Any:
    """One request to the daemon; its refusal or our failure to reach it is one line."""
    client = connect(args)
    try:
        return client.call(op, **op_args)
    except ApiUnavailable as exc:
        raise CliError(str(exc)) from None
    finally:
        client.close()
