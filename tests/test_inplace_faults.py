"""In place, the faults that no daemon order covers, with real torch + gloo processes on
loopback (a driver stands in for the daemon and the launchers, as in tests/test_inplace.py).

* An epoch replaced while its group forms: rank 0, which hosts the epoch's store, moves on to
  the newer epoch and takes the store with it, while another rank still waits there (what a
  restarted daemon that lost its last epoch does: it names a newer one at once).
* A peer that dies or hangs without an ``abandon`` order (the daemon down, or a planned
  shrink whose leaver the batch system killed first): the survivors find it by its missing
  heartbeat within 2 s instead of waiting for the collective timeout.
"""

from __future__ import annotations

import time

import pytest

from malletrain_core.worker import inplace
from tests.test_inplace import driver as driver  # the fixture, shared
from tests.test_inplace import free_port

pytest.importorskip("torch")
pytestmark = pytest.mark.torch


def test_a_rank_waiting_at_a_store_whose_host_moved_on_follows_it(driver):
    """Epoch 2 names a third node that never comes; rank 0 (the store's host) is told epoch 3
    first and leaves epoch 2's store behind. Before the fix rank 1, still checking in there,
    died of "Failed to recv" (under real Slurm, after a daemon restart: one node's processes
    lost per epoch, alternating, 30 s and a resume from disk); now it waits for its own
    membership and both train in epoch 3 with the same processes."""
    d = driver
    a, b = d.start("a"), d.start("b")
    e1 = d.epoch_change([a, b])
    d.wait_trained(e1, 3)
    d.epoch += 1
    port = free_port()
    for r, p in enumerate((a, b)):  # rank 2 never comes: both wait in epoch 2's store
        p.tell(inplace.Membership(epoch=d.epoch, rank=r, world=3, master="127.0.0.1",
                                  port=port))
    time.sleep(1.0)
    d.epoch += 1
    port = free_port()
    a.tell(inplace.Membership(epoch=d.epoch, rank=0, world=2, master="127.0.0.1", port=port))
    time.sleep(1.0)
    assert b.popen.poll() is None, "rank 1 died when the store's host moved on:\n" + \
        b.log.read_text()[-1500:]
    b.tell(inplace.Membership(epoch=d.epoch, rank=1, world=2, master="127.0.0.1", port=port))
    d.members = [a, b]
    d.wait_trained(d.epoch, 3)
    assert {r["pid"] for r in b.steps()} == {b.popen.pid}
