"""The socket an epoch's store listens on: the master's own address, so that a member's address
reads as plain IPv4 to the store (whose thread looks each one up by name), and a port that
cannot be bound leaves the store to listen as it does by default (and report the port)."""

from __future__ import annotations

import datetime as dt
import os
import socket

import pytest

from malletrain_core.worker import inplace

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch

ports = inplace.PortCycle(28000, 28999, start=28000 + os.getpid() % 1000)


def test_the_store_listens_on_the_master_address_in_ipv4() -> None:
    import torch.distributed as dist

    port = ports()
    fd = inplace.listen_on("127.0.0.1", port)
    assert fd is not None
    with socket.socket(fileno=os.dup(fd)) as probe:
        assert probe.family == socket.AF_INET and probe.getsockname() == ("127.0.0.1", port)
    store = dist.TCPStore("127.0.0.1", port, 2, is_master=True, master_listen_fd=fd,
                          timeout=dt.timedelta(seconds=5), wait_for_workers=False)
    client = dist.TCPStore("127.0.0.1", port, 2, is_master=False,
                           timeout=dt.timedelta(seconds=5), wait_for_workers=False)
    assert client.add("k", 2) == 2 and store.add("k", 1) == 3
    del client, store
    with socket.socket() as again:  # the store closed the socket it was given
        again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        again.bind(("127.0.0.1", port))


def test_a_port_taken_gives_none() -> None:
    port = ports()
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", port))
        holder.listen()
        assert inplace.listen_on("127.0.0.1", port) is None
