"""Several processes per node in place, with real torch + gloo processes on loopback.

A driver stands in for the daemon and the launchers (as in tests/test_inplace.py), but deals
in nodes: each node has one control folder and one membership file for its two processes
(``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``), which take the global ranks ``node rank × 2 + local``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from devtools.runlogs.jsonlines import read_json_lines
from malletrain_core.worker import inplace, training
from tests.test_inplace import WORKER, free_port, wait_for

pytest.importorskip("torch")
pytestmark = pytest.mark.torch

ROOT = Path(__file__).resolve().parents[1]
NPROC = 2


class Log:
    """One process's step log (the interface tests/test_inplace.py's wait_for dumps)."""

    def __init__(self, name: str, path: Path, popen: subprocess.Popen) -> None:
        self.name, self.log, self.popen = name, path, popen

    def steps(self) -> list[dict]:
        return [r for r in read_json_lines(self.log, prefix='{"t"') if not r["failed"]]


class Node:
    """A node's ``count`` training processes sharing one control folder, each running
    ``command`` (by default the test worker)."""

    def __init__(self, tmp: Path, name: str, sleep: float = 0.03,
                 command: list[str] | None = None, count: int = NPROC) -> None:
        self.name = name
        self.control = tmp / name
        self.control.mkdir()
        self.procs: list[Log] = []
        for i in range(count):
            env = dict(os.environ, PYTHONPATH=str(ROOT), GLOO_SOCKET_IFNAME="lo",
                       OMP_NUM_THREADS="1", LOCAL_RANK=str(i), LOCAL_WORLD_SIZE=str(count))
            env[training.ENV_CONTROL_DIR] = str(self.control)
            env[training.ENV_INPLACE] = "1"
            env[training.ENV_CHECKPOINT_DIR] = str(tmp / "checkpoints")
            path = tmp / f"{name}.{i}.log"
            with open(path, "w") as out:
                popen = subprocess.Popen(
                    [sys.executable, *(command or [str(WORKER), "--sleep", str(sleep)])],
                    env=env, stdout=out, stderr=subprocess.STDOUT)
            self.procs.append(Log(f"{name}.{i}", path, popen))

    def tell(self, m: inplace.Membership) -> None:
        inplace.write_membership(self.control, m)

    def kill(self) -> None:
        for p in self.procs:
            if p.popen.poll() is None:
                p.popen.kill()
            p.popen.wait(10)


class Driver:
    def __init__(self, tmp: Path) -> None:
        self.tmp, self.epoch = tmp, 0
        self.nodes: list[Node] = []
        self.members: list[Node] = []

    @property
    def logs(self) -> list[Log]:
        return [p for n in self.nodes for p in n.procs]

    def start(self, name: str) -> Node:
        node = Node(self.tmp, name)
        self.nodes.append(node)
        wait_for(lambda: inplace.is_ready(node.control, NPROC), 90, f"{name} ready", self.logs)
        return node

    def change(self, members: list[Node], abandon: bool = False) -> int:
        self.epoch += 1
        port = free_port()
        for n in self.members:
            if n not in members and any(p.popen.poll() is None for p in n.procs):
                n.tell(inplace.Membership(epoch=self.epoch))
        for r, n in enumerate(members):
            n.tell(inplace.Membership(epoch=self.epoch, rank=r, world=len(members),
                                      master="127.0.0.1", port=port, abandon=abandon))
        self.members = list(members)
        return self.epoch

    def wait_trained(self, epoch: int, steps: int = 3, timeout: float = 90) -> None:
        procs = [p for n in self.members for p in n.procs]
        wait_for(lambda: all(sum(1 for r in p.steps() if r["epoch"] == epoch) >= steps
                             for p in procs), timeout, f"epoch {epoch} training", self.logs)

    def stop(self) -> None:
        for n in self.nodes:
            n.kill()


@pytest.fixture
def driver(tmp_path):
    d = Driver(tmp_path)
    yield d
    d.stop()


def check_epoch(nodes: list[Node], epoch: int) -> None:
    """Every process of ``nodes`` trains in ``epoch`` with its global rank, the right world,
    and all hold the same state after every step they all printed."""
    world = len(nodes) * NPROC
    ranks = {}
    by_step: dict[int, set[str]] = {}
    count: dict[int, int] = {}
    for r_node, n in enumerate(nodes):
        for i, p in enumerate(n.procs):
            rows = [r for r in p.steps() if r["epoch"] == epoch]
            assert rows, f"{p.name}: no step in epoch {epoch}"
            ranks[p.name] = {(r["rank"], r["world"], r["local"]) for r in rows}
            assert ranks[p.name] == {(r_node * NPROC + i, world, i)}, ranks
            for r in rows:
                by_step.setdefault(r["step"], set()).add(r["digest"])
                count[r["step"]] = count.get(r["step"], 0) + 1
    common = [s for s, c in count.items() if c == world]
    assert common, f"no step of epoch {epoch} printed by every rank"
    for s in common:
        assert len(by_step[s]) == 1, f"epoch {epoch} step {s}: digests differ {by_step[s]}"


def lost(p: Log, before: int, after: int) -> int:
    old = [r for r in p.steps() if r["epoch"] == before]
    new = [r for r in p.steps() if r["epoch"] == after]
    return max(0, old[-1]["step"] - (new[0]["step"] - 1))


def test_two_processes_per_node_grow_shrink_and_lose_a_node(driver):
    """1 → 2 nodes (a joining node's two processes receive the state), planned 2 → 1 (both
    processes of the leaving node exit 0), 1 → 2 again, then the new node SIGKILLed (2 → 1,
    abandon): equal states on every rank after each change, no step lost on a planned change,
    at most one on the loss, the same survivor processes throughout."""
    d = driver
    a = d.start("a")
    e1 = d.change([a])
    d.wait_trained(e1, 5)
    check_epoch([a], e1)

    b = d.start("b")
    e2 = d.change([a, b])                                       # grow 1 → 2 nodes (2 → 4)
    d.wait_trained(e2, 4)
    check_epoch([a, b], e2)
    first_b = min(r["step"] for p in b.procs for r in p.steps() if r["epoch"] == e2)
    assert first_b > 5, "the joining node's processes did not receive the state"
    assert all(r["lr"] == pytest.approx(0.01 * 4)                # lr_for(global world)
               for p in b.procs for r in p.steps() if r["epoch"] == e2)

    e3 = d.change([a])                                          # planned shrink 2 → 1
    d.wait_trained(e3, 4)
    assert [p.popen.wait(30) for p in b.procs] == [0, 0], "the leaving node did not exit 0"
    check_epoch([a], e3)

    c = d.start("c")
    e4 = d.change([a, c])
    d.wait_trained(e4, 4)
    check_epoch([a, c], e4)

    for p in c.procs:                                           # the node is preempted
        os.kill(p.popen.pid, signal.SIGKILL)
    e5 = d.change([a], abandon=True)
    d.wait_trained(e5, 4)
    check_epoch([a], e5)

    for p in a.procs:
        assert [lost(p, x, y) for x, y in ((e1, e2), (e2, e3), (e3, e4))] == [0, 0, 0]
        assert lost(p, e4, e5) <= 1
        assert len({r["pid"] for r in p.steps()}) == 1, f"{p.name} was restarted"
        done = [r["step"] for r in p.steps()]
        assert all(y >= x for x, y in zip(done, done[1:])), "the global step went back"
    d.epoch += 1
    a.tell(inplace.Membership(epoch=d.epoch))                   # leave: both exit at once
    assert [p.popen.wait(30) for p in a.procs] == [0, 0]
    print(f"\nsteps lost by a's processes at the node loss: "
          f"{[lost(p, e4, e5) for p in a.procs]}; at {time.strftime('%H:%M:%S')}")
