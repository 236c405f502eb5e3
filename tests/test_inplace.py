"""Rescaling in place with real torch + gloo processes on loopback.

A driver stands in for the launchers: it writes each process's membership file and starts
joiners. The training processes (tests/workers/inplace_train.py) print one JSON line per step.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from malletrain_core.worker import inplace, training
from tests import test_launcher

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.torch

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "tests" / "workers" / "inplace_train.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Proc:
    """One training process with its control folder and its step log."""

    def __init__(self, tmp: Path, name: str, steps: int = 0, sleep: float = 0.02) -> None:
        self.name = name
        self.control = tmp / name
        self.control.mkdir()
        self.log = tmp / f"{name}.log"
        env = dict(os.environ, PYTHONPATH=str(ROOT), GLOO_SOCKET_IFNAME="lo",
                   OMP_NUM_THREADS="1")
        env[training.ENV_CONTROL_DIR] = str(self.control)
        env[training.ENV_INPLACE] = "1"
        env[training.ENV_CHECKPOINT_DIR] = str(tmp / "checkpoints")
        with open(self.log, "w") as out:
            self.popen = subprocess.Popen(
                [sys.executable, str(WORKER), "--steps", str(steps), "--sleep", str(sleep)],
                env=env, stdout=out, stderr=subprocess.STDOUT)

    def records(self) -> list[dict]:
        out = []
        for line in self.log.read_text().splitlines():
            if line.startswith("{"):
                try:
                    out.append(json.loads(line))
                except ValueError:
                    pass
        return out

    def steps(self) -> list[dict]:
        return [r for r in self.records() if "step" in r and "change" not in r]

    def last(self) -> dict | None:
        s = self.steps()
        return s[-1] if s else None

    def tell(self, m: inplace.Membership) -> None:
        inplace.write_membership(self.control, m)

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
        self.popen.wait(10)


def wait_for(cond, timeout: float, what: str, procs=()):
    """tests/test_launcher.py's wait, with every thread's stack in the logs on a timeout."""
    try:
        return test_launcher.wait_for(cond, timeout, what)
    except pytest.fail.Exception:
        for p in procs:
            if p.popen.poll() is None:
                os.kill(p.popen.pid, signal.SIGUSR1)
        time.sleep(0.5)
        raise AssertionError(f"timed out waiting for {what}\n" + "\n".join(
            f"--- {p.name}\n" + p.log.read_text()[-3000:] for p in procs)) from None


class Driver:
    """Stands in for the daemon and the launchers: epochs with fresh ports, pushed at once."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.epoch = 0
        self.members: list[Proc] = []
        self.all: list[Proc] = []
        self.change_t: dict[int, float] = {}

    def start(self, name: str) -> Proc:
        p = Proc(self.tmp, name)
        self.all.append(p)
        wait_for(lambda: inplace.is_ready(p.control), 60, f"{name} ready", self.all)
        return p

    def epoch_change(self, members: list[Proc], abandon: bool = False) -> int:
        self.epoch += 1
        port = free_port()
        leaving = [p for p in self.members if p not in members]
        self.change_t[self.epoch] = time.time()
        for p in leaving:
            if p.popen.poll() is None:
                p.tell(inplace.Membership(epoch=self.epoch))
        for r, p in enumerate(members):
            p.tell(inplace.Membership(epoch=self.epoch, rank=r, world=len(members),
                                      master="127.0.0.1", port=port, abandon=abandon))
        self.members = list(members)
        return self.epoch

    def trained_in(self, epoch: int, steps: int = 3) -> bool:
        """Every member has finished ``steps`` steps in ``epoch``."""
        return all(sum(1 for r in p.steps() if r["epoch"] == epoch and not r["failed"]) >= steps
                   for p in self.members)

    def wait_trained(self, epoch: int, steps: int = 3, timeout: float = 90) -> None:
        wait_for(lambda: self.trained_in(epoch, steps), timeout, f"epoch {epoch} training",
                 self.all)

    def stop(self) -> None:
        for p in self.all:
            p.kill()


def digests_at(procs: list[Proc], epoch: int) -> dict[int, set[str]]:
    """For each step of ``epoch``, the digests the ranks printed."""
    by_step: dict[int, set[str]] = {}
    for p in procs:
        for r in p.steps():
            if r["epoch"] == epoch and "digest" in r:
                by_step.setdefault(r["step"], set()).add(r["digest"])
    return by_step


def assert_equal_state(procs: list[Proc], epoch: int) -> None:
    by_step = digests_at(procs, epoch)
    common = [s for s, d in by_step.items()
              if sum(1 for p in procs for r in p.steps()
                     if r["epoch"] == epoch and r["step"] == s and "digest" in r) == len(procs)]
    assert common, f"no step of epoch {epoch} printed by every rank"
    for s in common:
        assert len(by_step[s]) == 1, f"epoch {epoch} step {s}: digests differ {by_step[s]}"


def pause(p: Proc, epoch: int, before: int) -> tuple[float, int]:
    """Gap between the member's last step of epoch ``before`` and its first in ``epoch``, and
    the steps it lost (last global step before minus first step after + 1, at least 0)."""
    rs = [r for r in p.steps() if not r["failed"]]
    old = [r for r in rs if r["epoch"] == before]
    new = [r for r in rs if r["epoch"] == epoch]
    assert old and new, f"{p.name}: no steps around epoch {epoch}"
    return new[0]["t"] - old[-1]["t"], max(0, old[-1]["step"] - (new[0]["step"] - 1))


@pytest.fixture
def driver(tmp_path):
    d = Driver(tmp_path)
    yield d
    d.stop()


def test_membership_file_round_trip(tmp_path):
    m = inplace.Membership(epoch=3, rank=1, world=2, master="127.0.0.1", port=29500)
    inplace.write_membership(tmp_path, m)
    assert inplace.read_membership(tmp_path) == m
    assert inplace.read_membership(tmp_path / "nowhere") is None
    with pytest.raises(ValueError, match="need rank < world"):
        inplace.Membership.from_dict({"epoch": 1, "rank": 2, "world": 2, "master": "a",
                                      "port": 1})
    assert inplace.Membership(epoch=4).leave


def test_digest_sees_every_part():
    a = {"model": {"w": torch.ones(3)}, "step": 4}
    assert inplace.digest(a) == inplace.digest({"step": 4, "model": {"w": torch.ones(3)}})
    assert inplace.digest(a) != inplace.digest({"model": {"w": torch.ones(3)}, "step": 5})
    b = {"model": {"w": torch.tensor([1.0, 1.0, 1.0000001])}, "step": 4}
    assert inplace.digest(a) != inplace.digest(b)


def test_collective_timeout_is_bounded():
    s = training.Session(env={}, handle_sigterm=False)
    m = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match="collective_timeout_s"):
        inplace.Elastic(s, m, torch.optim.SGD(m.parameters(), lr=0.1), collective_timeout_s=1800)


def test_grow_shrink_grow_and_peer_loss_in_place(driver):
    """2 → 3 → 1 → 2 planned, then a SIGKILLed peer (2 → 1) and a hung one (2 → 1), all in the
    same live processes: equal state after every change, no step lost on a planned change, at
    most one on a loss, the learning-rate rule and the sampler position carried over."""
    d = driver
    a, b = d.start("a"), d.start("b")
    e1 = d.epoch_change([a, b])
    d.wait_trained(e1, 5)
    assert_equal_state([a, b], e1)

    c = d.start("c")                                   # ready while a and b keep training
    ready_step = a.last()["step"]
    d.wait_trained(e1, 3 + max(0, ready_step - 5))
    assert a.last()["epoch"] == e1, "the members paused before the joiner was ready"
    e2 = d.epoch_change([a, b, c])
    d.wait_trained(e2, 5)
    assert_equal_state([a, b, c], e2)
    first_c = [r for r in c.steps() if r["epoch"] == e2][0]
    assert first_c["lr"] == pytest.approx(0.03)

    e3 = d.epoch_change([a])                           # planned shrink 3 → 1
    d.wait_trained(e3, 5)
    assert b.popen.wait(30) == 0 and c.popen.wait(30) == 0, "leavers did not exit cleanly"

    e = d.start("e")
    e4 = d.epoch_change([a, e])                        # grow 1 → 2
    d.wait_trained(e4, 5)
    assert_equal_state([a, e], e4)

    os.kill(e.popen.pid, signal.SIGKILL)               # preemption: a peer vanishes
    e5 = d.epoch_change([a], abandon=True)
    d.wait_trained(e5, 5)

    f = d.start("f")
    e6 = d.epoch_change([a, f])
    d.wait_trained(e6, 5)
    assert_equal_state([a, f], e6)
    os.kill(f.popen.pid, signal.SIGSTOP)               # a hung peer
    time.sleep(0.5)
    e7 = d.epoch_change([a], abandon=True)
    d.wait_trained(e7, 5, timeout=30)
    os.kill(f.popen.pid, signal.SIGKILL)
    # a holds the abandoned operation of epoch 6's group: it must still leave promptly and
    # cleanly (a normal exit would block in the group's destructor, then die of SIGABRT)
    d.epoch += 1
    a.tell(inplace.Membership(epoch=d.epoch))
    assert a.popen.wait(20) == 0

    gaps, lost = {}, {}
    for epoch, before, who, kind in [(e2, e1, [a, b], "grow 2→3"), (e3, e2, [a], "shrink 3→1"),
                                     (e4, e3, [a], "grow 1→2"), (e5, e4, [a], "peer killed"),
                                     (e7, e6, [a], "peer hung")]:
        for p in who:
            g, n = pause(p, epoch, before)
            gaps.setdefault(kind, []).append(g)
            lost[kind] = max(lost.get(kind, 0), n)
    steps_a = [r["step"] for r in a.steps() if not r["failed"]]
    assert all(y >= x - 1 for x, y in zip(steps_a, steps_a[1:])), "the global step went back"
    for kind in ("grow 2→3", "shrink 3→1", "grow 1→2"):
        assert lost[kind] == 0, f"{kind} lost {lost[kind]} steps"
    assert lost["peer killed"] <= 1 and lost["peer hung"] <= 1, lost
    # the sampler position is one global count: it never goes back on a survivor
    pos = [r["pos"] for r in a.steps() if not r["failed"]]
    assert pos == sorted(pos)
    print("\nin-place pauses (gap between step timestamps on the members, s):")
    for kind, g in gaps.items():
        print(f"  {kind:12s} median {statistics.median(g):.3f}  max {max(g):.3f}  "
              f"steps lost {lost[kind]}")
    assert max(gaps["grow 2→3"] + gaps["grow 1→2"]) < 5
    assert max(gaps["peer killed"]) < 5 and max(gaps["peer hung"]) < 10


def test_repeated_reforms_leak_nothing(driver):
    """Twenty re-forms of the same two processes on fresh ports: threads and open file
    descriptors stay flat, and the re-form time is printed."""
    d = driver
    a, b = d.start("a"), d.start("b")
    first = d.epoch_change([a, b])
    d.wait_trained(first, 2)
    for _ in range(20):
        d.wait_trained(d.epoch_change([a, b]), 2)
    for p in (a, b):
        rs = [r for r in p.steps() if not r["failed"]]
        early = [r for r in rs if r["epoch"] == first + 2][-1]
        late = rs[-1]
        assert late["epoch"] == d.epoch
        assert late["threads"] == early["threads"], (p.name, early["threads"], late["threads"])
        assert late["fds"] <= early["fds"], (p.name, early["fds"], late["fds"])
    reform = [r["change"]["reform_s"] for r in a.records() if "change" in r][1:]
    gaps = [pause(a, e, e - 1)[0] for e in range(first + 1, d.epoch + 1)]
    print(f"\n20 re-forms: re-form median {statistics.median(reform):.3f} s, pause median "
          f"{statistics.median(gaps):.3f} s, max {max(gaps):.3f} s")


def test_same_script_runs_without_malletrain(tmp_path):
    """Outside MalleTrain (no control folder) the in-place script is a plain one-process
    training: the group is never formed, the steps simply run."""
    env = {k: v for k, v in os.environ.items()
           if k not in (training.ENV_CONTROL_DIR, training.ENV_INPLACE)}
    env["PYTHONPATH"] = str(ROOT)
    out = subprocess.run([sys.executable, str(WORKER), "--steps", "6"], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    recs = [json.loads(line) for line in out.stdout.splitlines() if line.startswith('{"t"')]
    assert [r["step"] for r in recs] == [1, 2, 3, 4, 5, 6]
    assert {(r["world"], r["rank"], r["epoch"]) for r in recs} == {(1, 0, None)}
    assert recs[-1]["lr"] == pytest.approx(0.01)
