"""The torchrun + DCP example rescaled in process (worker/byo_inplace.py), real torch + gloo.

A driver stands in for the launchers (as in tests/test_inplace.py): it starts
examples/torchrun/after.py, unchanged, with ``malletrain-run --inplace``'s environment and
writes each node's membership file. The step lines (``MALLETRAIN_LOG_EVERY=1``) are read with
devtools/runlogs/byo_logs.py: equal parameters on every rank after every step, one start per epoch
at the hand-over's step and cursor, and the surviving updates' sample positions without gap
or overlap.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from malletrain_core.worker import byo_inplace, inplace, training
from tests import test_inplace_nproc as nproc_tests
from tests.test_inplace import wait_for

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "slurm"))

from devtools.runlogs.byo_logs import lost_per_epoch_change, problems, read  # noqa: E402

SCRIPT = [sys.executable, str(ROOT / "examples" / "torchrun" / "after.py"), "--epochs", "1000",
          "--batch-size", "8", "--lr", "0.01"]
HF = [sys.executable, str(ROOT / "examples" / "hf" / "after.py"), "--output-dir", "{out}/hf",
      "--epochs", "1000", "--batch-size", "8"]
LIGHTNING = [sys.executable, str(ROOT / "examples" / "lightning" / "after.py"), "--epochs",
             "100000", "--batch-size", "8", "--lr", "0.01", "--num-nodes", "1", "--root-dir",
             "{out}"]
BATCH = 8


def test_tested_torch_releases_only():
    assert byo_inplace.unsupported("2.13.0+cpu", env={}) == ""
    assert byo_inplace.unsupported("2.13.1", env={}) == ""
    assert "2.12" in byo_inplace.unsupported("2.12.1", env={})
    assert "can read" in byo_inplace.unsupported("nightly", env={})
    off = byo_inplace.unsupported("2.13.0", env={byo_inplace.ENV_INPROCESS: "0"})
    assert off.startswith("MALLETRAIN_INPROCESS=0 turns")


def test_requested_only_under_the_inplace_launcher():
    assert not byo_inplace.requested({})
    assert not byo_inplace.requested({training.ENV_CONTROL_DIR: "/x"})  # the restart path
    assert byo_inplace.requested({training.ENV_CONTROL_DIR: "/x", training.ENV_INPLACE: "1"})


@pytest.mark.torch
def test_a_dropped_step_leaves_the_schedule_where_the_state_put_it(monkeypatch):
    """A survivor whose step is dropped after it took the state of a peer that finished that
    step (the peer's scheduler already advanced for it) must not advance the schedule again
    when its loop steps the scheduler after the dropped optimizer step: their learning rates
    would differ from there on (the Trainer's survivors once held different parameters)."""
    import torch

    def pair():
        model = torch.nn.Linear(2, 1)
        opt = torch.optim.SGD(model.parameters(), lr=1.0)
        return model, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))

    model, opt, sched = pair()
    _, peer_opt, peer_sched = pair()
    for _ in range(3):
        opt.step()
        sched.step()
    for _ in range(4):  # the peer finished one more step, then lost a member
        peer_opt.step()
        peer_sched.step()
    el = object.__new__(byo_inplace.LoopElastic)
    el.model, el.optimizer, el.scheduler, el.world = model, opt, sched, 2
    el._averaged, el._step_failed, el._held_schedule = False, False, None

    def taken_over_then_dropped():  # the in-step re-form: the peer's state, then dropped
        sched.load_state_dict(peer_sched.state_dict())
        opt.param_groups[0]["lr"] = peer_opt.param_groups[0]["lr"]
        raise inplace.StepAbandoned("a member of the new group does not hold the step")

    monkeypatch.setattr(el, "average_gradients", taken_over_then_dropped)
    monkeypatch.setattr(el, "_note_abandoned", lambda: None)
    el._patch_optimizer()
    model(torch.ones(1, 2)).sum().backward()
    assert opt.step() is None and el._step_failed  # dropped: no update
    sched.step()  # what the Trainer, Lightning and a torchrun loop do next
    el._restore_schedule()  # the step boundary (after_boundary)
    assert sched.last_epoch == peer_sched.last_epoch == 4
    assert opt.param_groups[0]["lr"] == peer_opt.param_groups[0]["lr"]


class Node(nproc_tests.Node):
    """One node's control folder and its ``nproc`` processes of the example."""

    def __init__(self, tmp: Path, name: str, nproc: int = 1, env: dict[str, str] | None = None,
                 script: list[str] = SCRIPT, control: str = ""):
        self.name = name
        self.control = tmp / (control or name)   # a node's next process: the same folder
        self.control.mkdir(exist_ok=bool(control))
        self.procs = []
        for i in range(nproc):
            penv = dict(os.environ, PYTHONPATH=str(ROOT), GLOO_SOCKET_IFNAME="lo",
                        OMP_NUM_THREADS="1", MALLETRAIN_LOG_EVERY="1",
                        MALLETRAIN_MIN_STEP_S="0.05", MALLETRAIN_CHECKPOINT_EVERY_S="2",
                        LOCAL_RANK=str(i), LOCAL_WORLD_SIZE=str(nproc), **(env or {}))
            penv[training.ENV_CONTROL_DIR] = str(self.control)
            penv[training.ENV_INPLACE] = "1"
            penv[training.ENV_CHECKPOINT_DIR] = str(tmp / "checkpoints")
            path = tmp / f"task-1_{name}.{i}.out"
            with open(path, "w") as out:
                popen = subprocess.Popen([a.format(out=tmp) for a in script], env=penv, stdout=out, stderr=subprocess.STDOUT,
                                         cwd=ROOT)
            self.procs.append(nproc_tests.Log(f"{name}.{i}", path, popen))


class Driver(nproc_tests.Driver):
    """tests/test_inplace_nproc.py's driver (epochs pushed to nodes) for the example."""

    def start(self, name: str, nproc: int = 1,  # type: ignore[override]
              env: dict[str, str] | None = None, script: list[str] = SCRIPT,
              control: str = "") -> Node:
        node = Node(self.tmp, name, nproc, env, script, control)
        self.nodes.append(node)
        wait_for(lambda: inplace.is_ready(node.control, nproc), 90, f"{name} ready", self.logs)
        return node

    def trained(self, epoch: int, steps: int = 5) -> None:
        def ok() -> bool:
            rows = read(self.tmp, "1").steps.get(epoch, [])
            return len({r.step for r in rows}) >= steps
        wait_for(ok, 90, f"epoch {epoch} training", self.logs)


@pytest.fixture
def driver(tmp_path):
    d = Driver(tmp_path)
    yield d
    d.stop()


def pids(tmp: Path) -> dict[int, set[str]]:
    out: dict[int, set[str]] = {}
    for path in tmp.glob("task-*.out"):
        for m in re.finditer(r"malletrain: start step=\d+ epoch=(\d+) .* pid=(\d+)",
                             path.read_text()):
            out.setdefault(int(m.group(1)), set()).add(m.group(2))
    return out


@pytest.mark.torch
def test_torchrun_example_grows_shrinks_and_loses_a_peer_in_process(driver):
    """2 → 3 → 1 (planned) → 2 → 1 (a peer SIGKILLed): the same process trains throughout,
    every change after the first is in memory, planned ones lose no sample and the loss at
    most the step in flight; the accounting holds position by position."""
    d = driver
    a, b = d.start("a"), d.start("b")
    e1 = d.change([a, b])
    d.trained(e1)
    c = d.start("c")
    e2 = d.change([a, b, c])
    d.trained(e2)
    e3 = d.change([a])
    d.trained(e3)
    assert b.procs[0].popen.wait(30) == 0 and c.procs[0].popen.wait(30) == 0, \
        "leavers did not exit cleanly"
    e = d.start("e")
    e4 = d.change([a, e])
    d.trained(e4)
    os.kill(e.procs[0].popen.pid, signal.SIGKILL)
    e5 = d.change([a], abandon=True)
    d.trained(e5)

    log = read(d.tmp, "1")
    assert not problems(log), problems(log)
    assert {e2, e3, e4, e5} <= log.in_memory
    assert all(str(a.procs[0].popen.pid) in pids(d.tmp)[ep] for ep in (e1, e2, e3, e4, e5))
    changes = lost_per_epoch_change(log)
    assert [c[0] for c in changes] == ["2→3", "3→1", "1→2", "2→1"], changes
    assert [c[1] for c in changes[:3]] == [0, 0, 0], changes
    assert changes[3][1] <= BATCH * 2, changes          # at most the step in flight


@pytest.mark.torch
@pytest.mark.parametrize("name", ["torchrun", "hf"])
def test_two_processes_per_node(driver, name):
    """``--nproc-per-node 2``: two nodes make a world of 4, then one node leaves (world 2);
    the Trainer's with 4 per device, so that its global batch of 48 divides at both worlds."""
    if name == "hf":
        pytest.importorskip("transformers")
    script = SCRIPT if name == "torchrun" else HF[:-1] + ["4"]
    d = driver
    a, b = d.start("a", nproc=2, script=script), d.start("b", nproc=2, script=script)
    e1 = d.change([a, b])
    d.trained(e1)
    e2 = d.change([a])
    d.trained(e2)
    log = read(d.tmp, "1")
    assert not problems(log), problems(log)
    assert {r.rank for r in log.steps[e1]} == {0, 1, 2, 3}
    assert {r.rank for r in log.steps[e2]} == {0, 1} and e2 in log.in_memory
    assert [c[:2] for c in lost_per_epoch_change(log)] == [("4→2", 0)]


@pytest.mark.torch
def test_no_in_process_path_takes_the_restart_path_with_one_line(driver):
    """``MALLETRAIN_INPROCESS=0`` (as for a torch it was not tested with): one line says why,
    and at a change the process exits with the restart code; started again on its node's
    folder (what malletrain-run --inplace does), it joins the new epoch from the checkpoint."""
    d = driver
    off = {byo_inplace.ENV_INPROCESS: "0"}
    a, b = d.start("a", env=off), d.start("b", env=off)
    e1 = d.change([a, b])
    d.trained(e1)
    wait_for(lambda: read(d.tmp, "1").checkpoints, 60, "a checkpoint", d.logs)  # every 2 s
    e2 = d.change([a])
    assert a.procs[0].popen.wait(60) == training.RESTART_EXIT_CODE
    assert b.procs[0].popen.wait(60) == 0                # b left the job
    text = (d.tmp / "task-1_a.0.out").read_text()
    assert text.count("turns in-process rescaling off: this job takes the restart path") == 1
    d.members = [d.start("a2", env=off, control="a")]
    d.trained(e2)
    log = read(d.tmp, "1")
    assert not problems(log), problems(log)
    assert e2 not in log.in_memory
    (start,) = log.starts[e2]
    assert start[0] > 0, "the restarted process did not resume from the checkpoint"


def test_the_launcher_starts_a_process_that_exits_with_the_restart_code_again(tmp_path):
    """malletrain-run --inplace: a node's process that exits with the restart code is started
    again at once with the same command and environment; the epoch keeps running."""
    from malletrain_core.worker import launcher as mr
    from tests import test_launcher as tl

    starts = tmp_path / "starts"
    script = (f"echo $$ >> {starts}; [ -e {tmp_path}/again ] && exec sleep 60; "
              f"touch {tmp_path}/again; exit {training.RESTART_EXIT_CODE}")
    workers = mr.Workers(["sh", "-c", script], dict(os.environ), 0)
    la = mr.Launcher(mr.Identity("12", "0", "n01"), ["sh"], tl.ScriptedClient([]), None,
                     checkpoint_dir=str(tmp_path / "ck"), control_dir=str(tmp_path),
                     inplace=True)
    la.workers, la.state, la.epoch = workers, "running", 3
    try:
        tl.wait_for(lambda: workers.poll() is not None, 30, "the first process's exit")
        la._observe()
        assert (la.state, la.epoch) == ("running", 3) and la.workers is not workers
        tl.wait_for(lambda: len(starts.read_text().split()) == 2, 30, "the second start")
        assert la.workers.poll() is None
    finally:
        la.shutdown()


@pytest.mark.torch
@pytest.mark.parametrize("name", ["hf", "lightning"])
def test_framework_example_grows_and_loses_a_peer_in_process(driver, name):
    """The Trainer and Lightning examples 2 → 3 → 2 (a peer SIGKILLed) → 1 (planned): every
    change in memory, the planned ones lose nothing and the leaver exits cleanly, the loss at
    most the step in flight (HF: one global batch of 48 at every world size; Lightning: 8 per
    rank)."""
    pytest.importorskip({"hf": "transformers"}.get(name, name))
    script, in_flight = {"hf": (HF, 48), "lightning": (LIGHTNING, 8 * 3)}[name]
    d = driver
    a, b = d.start("a", script=script), d.start("b", script=script)
    e1 = d.change([a, b])
    d.trained(e1, 3)
    c = d.start("c", script=script)
    e2 = d.change([a, b, c])
    d.trained(e2, 3)
    os.kill(c.procs[0].popen.pid, signal.SIGKILL)
    e3 = d.change([a, b], abandon=True)
    d.trained(e3, 3)
    e4 = d.change([a])                                  # planned shrink: b leaves cleanly
    d.trained(e4, 3)
    assert b.procs[0].popen.wait(30) == 0, "the leaver did not exit cleanly"

    log = read(d.tmp, "1")
    assert not problems(log), problems(log)
    assert {e2, e3, e4} <= log.in_memory
    if name == "hf":
        assert {r.stop - r.first for rows in log.steps.values() for r in rows} == {48}
    changes = lost_per_epoch_change(log)
    assert [c[0] for c in changes] == ["2→3", "3→2", "2→1"], changes
    assert changes[0][1] == changes[2][1] == 0 and changes[1][1] <= in_flight, changes


def test_framework_releases_and_layouts_outside_the_tested_ones(monkeypatch):
    """The Trainer and Lightning paths name what they were tested with; anything else (or
    several processes per node, for Lightning) takes the restart path, and the reason says
    which."""
    pytest.importorskip("torch")
    from malletrain_core.worker import hf_inplace, lightning_inplace

    monkeypatch.delenv(byo_inplace.ENV_INPROCESS, raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert hf_inplace.unsupported("5.23.0") == ""
    assert "transformers 5.24" in hf_inplace.unsupported("5.24.1")
    assert lightning_inplace.unsupported("2.6.6") == ""
    assert "Lightning 2.7" in lightning_inplace.unsupported("2.7.0")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert hf_inplace.unsupported("5.23.0") == ""  # the Trainer: one per process, see below
    assert "one process per node" in lightning_inplace.unsupported("2.6.6")


def test_each_trainer_of_a_node_keeps_its_own_gpu():
    """Several Trainers on a node: each sees only its GPU (else each spreads its batch over
    every GPU of the node); one process per node is left as it is."""
    pytest.importorskip("torch")
    from malletrain_core.worker.hf_inplace import own_gpu

    assert own_gpu({"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}, 4) is None
    assert own_gpu({"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}, 4) == "1"
    assert own_gpu({"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
                    "CUDA_VISIBLE_DEVICES": "GPU-a, GPU-b"}, 4) == "GPU-b"
    assert own_gpu({"LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "4"}, 2) == "1"  # shared in turn
    assert own_gpu({"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}, 0) is None  # no GPU
    assert own_gpu({"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "CUDA_VISIBLE_DEVICES": ""},
                   4) is None
