"""Several training processes per node on the in-place path (``--inplace --nproc-per-node N``).

Quick tests, no Slurm and no torch: the environment of each local process, the global rank
arithmetic, one ready file per process, a node's processes held (and stopped) as one, the
launcher driving N stand-in processes that use the real control-folder functions.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import textwrap
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_launcher import gone, wait_for

from malletrain_core.wire.orders import Order
from malletrain_core.worker import inplace, training
from malletrain_core.worker import launcher as mr
from malletrain_core.worker.identity import Identity

REPO = Path(__file__).resolve().parents[1]

# A stand-in for one in-place training process, with the real control-folder functions: it
# writes its ready file, records its environment and every membership it sees (as this
# process: global rank and world), leaves when its node's membership says world 0, and exits
# 7 when ``die.<LOCAL_RANK>`` appears in the control folder.
FAKE_PROCESS = textwrap.dedent("""
    import json, os, sys, time
    from pathlib import Path
    from malletrain_core.worker import inplace
    control = Path(os.environ["MALLETRAIN_CONTROL_DIR"])
    local, nproc = inplace.local_layout(os.environ)
    out = Path(os.environ["FAKE_OUT"] + f".{local}")
    env = {k: os.environ.get(k) for k in ("LOCAL_RANK", "LOCAL_WORLD_SIZE", "RANK",
                                          "WORLD_SIZE", "MALLETRAIN_INPLACE")}
    seen = []
    def record():
        tmp = out.with_name(out.name + ".tmp")
        tmp.write_text(json.dumps({"pid": os.getpid(), "env": env, "seen": seen}))
        os.replace(tmp, out)
    record()
    time.sleep(float(os.environ.get("FAKE_READY_DELAY_S", "0")) * local)
    (control / inplace.ready_name(local, nproc)).write_text(str(os.getpid()))
    while True:
        m = inplace.read_membership(control)
        if m is not None:
            m = m.for_process(local, nproc)
            if not seen or seen[-1] != [m.epoch, m.rank, m.world]:
                seen.append([m.epoch, m.rank, m.world])
                record()
            if m.leave:
                sys.exit(0)
        if (control / f"die.{local}").exists():
            sys.exit(7)
        time.sleep(0.02)
""")


def test_local_envs_give_each_process_its_global_rank():
    assert mr.local_envs(3, rank=1, world=2) == [
        {"LOCAL_RANK": str(i), "LOCAL_WORLD_SIZE": "3", "RANK": str(3 + i), "WORLD_SIZE": "6"}
        for i in range(3)]
    assert mr.local_envs(2) == [{"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"},
                                {"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}]
    one = mr.local_envs(1, rank=4, world=5)
    assert one == [{"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "RANK": "4", "WORLD_SIZE": "5"}]


def test_a_node_membership_becomes_each_process_membership():
    node = inplace.Membership(epoch=7, rank=2, world=3, master="10.0.0.5", port=29613,
                              abandon=True)
    ranks = [node.for_process(i, 4) for i in range(4)]
    assert [(m.rank, m.world) for m in ranks] == [(8, 12), (9, 12), (10, 12), (11, 12)]
    assert all((m.epoch, m.master, m.port, m.abandon) == (7, "10.0.0.5", 29613, True)
               for m in ranks)
    assert node.for_process(0, 1) == node
    leave = inplace.Membership(epoch=8)
    assert leave.for_process(1, 3).leave and leave.for_process(1, 3).world == 0
    # every global rank of every node, once
    got = sorted(inplace.Membership(1, r, 3, "h", 1).for_process(i, 2).rank
                 for r in range(3) for i in range(2))
    assert got == list(range(6))


def test_local_layout_from_the_environment():
    assert inplace.local_layout({}) == (0, 1)
    assert inplace.local_layout({"LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "3"}) == (2, 3)
    with pytest.raises(ValueError, match="not in"):
        inplace.local_layout({"LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "3"})
    with pytest.raises(ValueError, match="whole numbers"):
        inplace.local_layout({"LOCAL_RANK": "x"})


def test_the_node_is_ready_only_when_every_process_is(tmp_path):
    assert inplace.ready_name(0, 1) == inplace.READY_NAME == "ready"
    assert [inplace.ready_name(i, 3) for i in range(3)] == ["ready.0", "ready.1", "ready.2"]
    assert not inplace.is_ready(tmp_path, 3)
    for i in range(2):
        (tmp_path / inplace.ready_name(i, 3)).write_text("1")
        assert not inplace.is_ready(tmp_path, 3)
    (tmp_path / "ready.2").write_text("1")
    assert inplace.is_ready(tmp_path, 3)
    assert not inplace.is_ready(tmp_path)  # one process: the file "ready", as before
    (tmp_path / "ready").write_text("1")
    assert inplace.is_ready(tmp_path) and inplace.is_ready(tmp_path, 1)


def test_elastic_takes_its_global_rank_from_the_node_membership(tmp_path, monkeypatch):
    """Elastic's control thread turns the node's membership into this process's."""
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.delenv(training.ENV_INPLACE, raising=False)
    session = training.Session(env={}, handle_sigterm=False)
    el = inplace.Elastic(session, None, None, control_dir=str(tmp_path), poll_s=0.01)
    assert (el.local_rank, el.local_world) == (1, 2)
    el._watcher = threading.Thread(target=el._watch, daemon=True)
    el._watcher.start()
    try:
        inplace.write_membership(tmp_path, inplace.Membership(3, 1, 2, "127.0.0.1", 29500))
        m = wait_for(lambda: el._newest(), 5, "the membership read")
        assert (m.epoch, m.rank, m.world) == (3, 3, 4)
    finally:
        el._stop_threads()


def test_reports_count_nodes_not_processes():
    """The daemon sizes jobs in nodes: a report's world is the node count."""
    s = training.Session(env={"RANK": "0", "WORLD_SIZE": "6", "LOCAL_WORLD_SIZE": "3"},
                         handle_sigterm=False)
    assert s.nodes == 2
    s.set_membership(4, 0, 9)
    assert s.nodes == 3
    assert training.Session(env={"WORLD_SIZE": "2"}, handle_sigterm=False).nodes == 2


# ----- --nproc-per-node ---------------------------------------------------------------------
@pytest.mark.parametrize(("value", "count"), [
    ("0,1,2", 3), ("3", 1), ("", 0), ("-1", 0), ("NoDevFiles", 0), ("0,1,-1,2", 2),
    ("GPU-8d3a1b2c-aaaa-bbbb-cccc-0123456789ab,GPU-11111111-2222-3333-4444-555555555555", 2),
    ("MIG-GPU-8d3a1b2c-aaaa-bbbb-cccc-0123456789ab/1/0", 1), (" 0, 1 ", 2),
])
def test_visible_gpus_from_cuda_visible_devices(value, count, tmp_path):
    assert mr.visible_gpus({"CUDA_VISIBLE_DEVICES": value}, dev=tmp_path) == count


def test_visible_gpus_from_the_device_files(tmp_path):
    for name in ("nvidia0", "nvidia1", "nvidia3", "nvidiactl", "nvidia-uvm", "nvidia-modeset"):
        (tmp_path / name).write_text("")
    assert mr.visible_gpus({}, dev=tmp_path) == 3
    assert mr.visible_gpus({}, dev=tmp_path / "missing") == 0


def test_nproc_per_node_values(tmp_path, monkeypatch):
    assert mr.nproc_per_node("1", {}) == 1
    assert mr.nproc_per_node("4", {}) == 4
    assert mr.nproc_per_node("auto", {"CUDA_VISIBLE_DEVICES": "0,1"}) == 2
    assert mr.nproc_per_node("AUTO", {"CUDA_VISIBLE_DEVICES": ""}) == 1  # no GPU: one
    monkeypatch.setattr(mr, "visible_gpus", lambda env: 0)
    assert mr.nproc_per_node("auto", {}) == 1
    for bad in ("0", "-2", "two", "1.5"):
        with pytest.raises(mr.MalleTrainError, match="whole number ≥ 1"):
            mr.nproc_per_node(bad, {})


def test_a_bad_nproc_per_node_is_a_one_line_error(capsys):
    assert mr.main(["--inplace", "--nproc-per-node", "zero", "python", "t.py"]) == 2
    err = capsys.readouterr().err
    assert "--nproc-per-node 'zero'" in err and err.count("\n") == 1


def test_inplace_accepts_several_processes_per_node():
    args = mr.build_parser().parse_args(["--inplace", "--nproc-per-node", "3", "python", "t"])
    assert mr.nproc_per_node(args.nproc_per_node, {}) == 3
    assert mr.build_parser().parse_args(["python", "t"]).nproc_per_node == "1"


# ----- Workers: a node's processes as one ---------------------------------------------------
def snippet(code: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(code)]


def test_workers_start_one_process_per_local_env_with_its_variables(tmp_path):
    out = tmp_path / "env"
    code = f"""
        import json, os
        with open({str(out)!r} + "." + os.environ["LOCAL_RANK"], "w") as fh:
            json.dump({{k: os.environ.get(k) for k in ("LOCAL_RANK", "LOCAL_WORLD_SIZE",
                       "RANK", "WORLD_SIZE", "SHARED")}}, fh)
    """
    w = mr.Workers(snippet(code), {**os.environ, "SHARED": "x"}, 0,
                   local_envs=mr.local_envs(3, rank=2, world=3))
    try:
        assert len(w.procs) == 3 and w.proc is w.procs[0]
        assert wait_for(lambda: w.poll() is not None, 30, "the processes to end") is True
        assert w.poll() == 0
        for i in range(3):
            env = json.loads((tmp_path / f"env.{i}").read_text())
            assert env == {"LOCAL_RANK": str(i), "LOCAL_WORLD_SIZE": "3", "RANK": str(6 + i),
                           "WORLD_SIZE": "9", "SHARED": "x"}
    finally:
        w.stop(grace_s=0.2)


def test_one_process_failing_stops_the_others_and_is_the_node_exit(tmp_path):
    code = """
        import os, sys, time
        if os.environ["LOCAL_RANK"] == "1":
            time.sleep(0.3)
            sys.exit(5)
        time.sleep(600)
    """
    w = mr.Workers(snippet(code), dict(os.environ), 0, local_envs=mr.local_envs(3))
    try:
        pids = [p.pid for p in w.procs]
        assert w.poll() is None
        t0 = time.monotonic()
        rc = wait_for(lambda: w.poll(), 30, "the node's exit")
        assert rc == 5 and time.monotonic() - t0 < 10
        assert all(gone(pid) for pid in pids), "a process of the node outlived its sibling"
        assert w.poll() == 5  # stays the node's exit
    finally:
        w.stop(grace_s=0.2)


def test_a_clean_exit_waits_for_the_others_before_stopping_them(tmp_path):
    """Rank 0 may still save its last checkpoint when its siblings are done: a process that
    ended with 0 gives the others ``settle_s`` to end by themselves."""
    code = """
        import os, sys, time
        if os.environ["LOCAL_RANK"] != "0":
            time.sleep(600)
    """
    w = mr.Workers(snippet(code), dict(os.environ), 0, local_envs=mr.local_envs(2),
                   settle_s=0.6)
    try:
        wait_for(lambda: w.procs[0].poll() is not None, 30, "local rank 0 to end")
        t0 = time.monotonic()
        assert w.poll() is None, "stopped the others at once"
        rc = wait_for(lambda: w.poll() is not None, 10, "the settle time")
        assert rc is True and w.poll() == 0 and time.monotonic() - t0 >= 0.4
        assert gone(w.procs[1].pid)
    finally:
        w.stop(grace_s=0.2)


def test_a_later_failure_within_the_settle_time_is_the_node_exit():
    code = """
        import os, sys, time
        if os.environ["LOCAL_RANK"] == "1":
            time.sleep(0.3)
            sys.exit(3)
        if os.environ["LOCAL_RANK"] == "2":
            time.sleep(600)
    """
    w = mr.Workers(snippet(code), dict(os.environ), 0, local_envs=mr.local_envs(3),
                   settle_s=30)
    try:
        assert wait_for(lambda: w.poll(), 30, "the node's exit") == 3
        assert all(gone(p.pid) for p in w.procs)
    finally:
        w.stop(grace_s=0.2)


# ----- the launcher with N stand-in processes ------------------------------------------------
class Client:
    """The daemon's replies, scripted."""

    def __init__(self, replies):
        self.replies = list(replies)
        self.calls = []

    def call(self, op, **args):
        self.calls.append((op, args))
        return self.replies.pop(0)


PLAIN_MUNGE = SimpleNamespace(decode=lambda text: SimpleNamespace(payload=text))
KEY = "ab" * 32


def launcher(tmp_path: Path, replies, nproc: int, ready_delay_s: float = 0.0) -> tuple[
        mr.Launcher, Client, Path]:
    control = tmp_path / "control"
    control.mkdir()
    fake = tmp_path / "fake_process.py"
    fake.write_text(FAKE_PROCESS)
    client = Client(replies)
    env = {**os.environ, "PYTHONPATH": str(REPO), "FAKE_OUT": str(tmp_path / "seen"),
           "FAKE_READY_DELAY_S": str(ready_delay_s)}
    la = mr.Launcher(Identity("12", "1", "n02"), [sys.executable, str(fake)], client,
                     PLAIN_MUNGE, checkpoint_dir=str(tmp_path / "ck"),
                     control_dir=str(control), base_env=env, inplace=True,
                     nproc_per_node=nproc, node_addr="127.0.0.1", leave_grace_s=10)
    return la, client, control


def seen(tmp_path: Path, local: int) -> dict:
    path = tmp_path / f"seen.{local}"
    return json.loads(path.read_text()) if path.exists() else {}


def run_reply(epoch: int, rank: int, world: int, abandon: bool = False) -> dict:
    return {"order": Order("run", epoch, rank, world, "127.0.0.1", 29600 + epoch, f"r{epoch}",
                           abandon=abandon).to_dict(),
            "key": KEY, "report_addr": "127.0.0.1:9"}


def test_launcher_runs_n_processes_that_move_together_and_leave_together(tmp_path):
    """Started ahead: ready only once all three are; each run order re-forms every process
    of the node at the same epoch with its global rank; a stop makes all of them leave."""
    la, client, control = launcher(tmp_path, [
        run_reply(0, 1, 2), run_reply(1, 0, 3, abandon=True),
        {"order": {"kind": "stop", "epoch": 1, "reason": "job shrank"}},
    ], nproc=3, ready_delay_s=0.4)
    try:
        for stale in ("ready", "ready.0", "ready.2", "lost", "membership.json"):
            (control / stale).write_text("stale")  # the node's last processes' files
        la.prestart()
        for stale in ("ready", "lost", "membership.json"):
            assert not (control / stale).exists()
        for i in range(3):  # gone, or written anew by this process
            assert not (control / f"ready.{i}").exists() \
                or (control / f"ready.{i}").read_text() != "stale"
        pids = [p.pid for p in la.workers.procs]
        assert len(pids) == 3
        wait_for(lambda: (control / "ready.0").exists(), 20, "local rank 0 ready")
        assert not la.ready(), "the node is ready before all its processes are"
        wait_for(la.ready, 20, "all three ready")
        assert inplace.is_ready(control, 3)
        for i in range(3):
            env = seen(tmp_path, i)["env"]
            assert (env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"]) == (str(i), "3")
        assert la.act(la.checkin()) is None
        assert client.calls[0][1]["ready"] is True
        wait_for(lambda: all(seen(tmp_path, i)["seen"] for i in range(3)), 20, "epoch 0")
        assert [seen(tmp_path, i)["seen"][-1] for i in range(3)] == [[0, 3, 6], [0, 4, 6],
                                                                     [0, 5, 6]]
        assert la.act(la.checkin()) is None
        wait_for(lambda: all(seen(tmp_path, i)["seen"][-1][0] == 1 for i in range(3)), 20,
                 "epoch 1")
        assert [seen(tmp_path, i)["seen"][-1] for i in range(3)] == [[1, 0, 9], [1, 1, 9],
                                                                     [1, 2, 9]]
        assert [p.pid for p in la.workers.procs] == pids, "a process was restarted"
        assert la.act(la.checkin()) is None
        assert (la.state, la.epoch, la.workers) == ("idle", None, None)
        assert all(seen(tmp_path, i)["seen"][-1] == [2, 0, 0] for i in range(3))
        assert all(gone(pid) for pid in pids)
    finally:
        la.shutdown()


def test_launcher_started_at_a_run_order_sets_the_global_environment(tmp_path):
    la, _, control = launcher(tmp_path, [run_reply(4, 2, 3)], nproc=2)
    try:
        assert la.act(la.checkin()) is None
        assert inplace.read_membership(control).epoch == 4
        wait_for(lambda: all(seen(tmp_path, i) for i in range(2)), 20, "both processes")
        envs = [seen(tmp_path, i)["env"] for i in range(2)]
        assert [(e["RANK"], e["WORLD_SIZE"], e["LOCAL_RANK"]) for e in envs] == [
            ("4", "6", "0"), ("5", "6", "1")]
        assert all(e["MALLETRAIN_INPLACE"] == "1" for e in envs)
    finally:
        la.shutdown()


def test_one_process_of_the_node_dying_is_the_node_exit(tmp_path):
    la, _, control = launcher(tmp_path, [run_reply(0, 0, 2)], nproc=3)
    try:
        la.prestart()
        wait_for(la.ready, 20, "all three ready")
        assert la.act(la.checkin()) is None
        pids = [p.pid for p in la.workers.procs]
        (control / "die.2").write_text("")
        wait_for(lambda: (la._observe(), la.state)[1] == "exited", 20, "the node's exit")
        assert la.rc == 7 and la.workers is None
        assert all(gone(pid) for pid in pids), "the node's other processes were not stopped"
    finally:
        la.shutdown()


def test_a_stopped_process_told_to_stop_is_killed_without_the_leave_grace(tmp_path):
    """A node whose process its peers found silent because it was SIGSTOPped is told to stop
    it: a stopped process never reaches a step boundary, so the launcher kills it at once
    instead of after ``leave_grace_s`` (10 s here, 30 s by default); until it is gone its node
    cannot join again. A process that runs still leaves by itself (the test above)."""
    la, client, control = launcher(tmp_path, [
        run_reply(0, 1, 2), {"order": {"kind": "stop", "epoch": 0, "reason": "silent"}},
    ], nproc=2)
    try:
        la.prestart()
        wait_for(lambda: inplace.is_ready(control, 2), 30, "both processes ready")
        assert la.act(la.checkin()) is None and la.state == "running"
        pids = [p.pid for p in la.workers.procs]
        assert not la.workers.stopped()
        os.kill(pids[1], signal.SIGSTOP)
        wait_for(la.workers.stopped, 10, "the process seen stopped")
        t0 = time.monotonic()
        assert la.act(la.checkin()) is None
        assert (la.state, la.epoch, la.workers) == ("idle", None, None)
        assert time.monotonic() - t0 < 5, "waited the leave grace for a stopped process"
        assert all(gone(pid) for pid in pids)
    finally:
        la.shutdown()
