"""malletrain-run --inplace: one training process kept across epochs, orders relayed to it.

Real launcher, real training process (tests/workers/inplace_train.py, torch + gloo), the
daemon's replies scripted.
"""

from __future__ import annotations

import os
import shlex
import socket
import sys
import time

import pytest

from devtools.runlogs.jsonlines import read_json_lines
from malletrain_core.wire import reports
from malletrain_core.wire.orders import Order
from malletrain_core.worker import inplace, training
from malletrain_core.worker import launcher as mr
from tests import test_launcher as tl

# the private munged of tests/test_launcher.py, shared (fixtures by name)
workdir, munged = tl.workdir, tl.munged
REPO, ScriptedClient, wait_for = tl.REPO, tl.ScriptedClient, tl.wait_for

pytest.importorskip("torch")
pytestmark = pytest.mark.torch
WORKER = REPO / "tests" / "workers" / "inplace_train.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def steps(log):
    return read_json_lines(log, prefix='{"t"')


def test_run_orders_reform_the_live_process_and_stop_makes_it_leave(munged, tmp_path):
    m = munged.client()
    key = "cd" * 32
    log = tmp_path / "train.log"
    control = tmp_path / "control"
    control.mkdir()
    cmd = ["sh", "-c", f"exec {shlex.quote(sys.executable)} {shlex.quote(str(WORKER))} "
           f"--sleep 0.02 > {shlex.quote(str(log))} 2>&1"]
    run0 = Order("run", 0, 0, 1, "127.0.0.1", free_port(), "r0")
    run1 = Order("run", 1, 0, 1, "127.0.0.1", free_port(), "r1", abandon=True)
    client = ScriptedClient([
        {"order": run0.to_dict(), "key": m.encode(key), "report_addr": "127.0.0.1:9"},
        {"order": run1.to_dict()},
        {"order": {"kind": "stop", "epoch": 1, "reason": "job shrank"}},
    ])
    la = mr.Launcher(mr.Identity("12", "0", "n01"), cmd, client, m,
                     checkpoint_dir=str(tmp_path / "ck"), control_dir=str(control),
                     base_env={**os.environ, "PYTHONPATH": str(REPO),
                               "GLOO_SOCKET_IFNAME": "lo"},
                     inplace=True, leave_grace_s=30)
    try:
        assert la.act(la.checkin()) is None
        assert client.calls[0][1]["inplace"] is True
        assert inplace.read_membership(control).epoch == 0
        pid = la.workers.proc.pid
        wait_for(lambda: len(steps(log)) >= 5, 60, "training in epoch 0")
        assert la.act(la.checkin()) is None
        assert la.workers.proc.pid == pid and (la.state, la.epoch) == ("running", 1)
        got = inplace.read_membership(control)
        assert (got.epoch, got.port, got.abandon) == (1, run1.port, True)
        wait_for(lambda: any(r["epoch"] == 1 for r in steps(log)), 60, "training in epoch 1")
        assert la.workers.poll() is None, "the process was restarted, not re-formed"
        before = max(r["step"] for r in steps(log) if r["epoch"] == 0)
        after = min(r["step"] for r in steps(log) if r["epoch"] == 1)
        assert after >= before, "state lost across the in-place change"
        t0 = time.monotonic()
        assert la.act(la.checkin()) is None
        assert (la.state, la.epoch) == ("idle", None)
        assert time.monotonic() - t0 < 25, "the process did not leave at a step boundary"
        assert "this node leaves the job" in log.read_text()
    finally:
        la.shutdown()


def test_inplace_refuses_no_process_per_node(capsys, monkeypatch):
    """Several processes per node are taken (tests/test_launcher_nproc.py); none is not."""
    monkeypatch.setenv("SLURM_JOB_ID", "5")
    monkeypatch.setenv("MALLETRAIN_DAEMON", "127.0.0.1:1")
    assert mr.main(["--inplace", "--nproc-per-node", "0", "python", "t.py"]) == 2
    assert "--nproc-per-node '0': give a whole number" in capsys.readouterr().err
    assert training.ENV_INPLACE == "MALLETRAIN_INPLACE"


def test_joiner_starts_before_its_first_check_in_and_reports_once_placed(munged, tmp_path):
    """The process is started and ready before the launcher checks in (the members keep
    training meanwhile); the first run order hands it the report channel, and its reports
    arrive signed with the job's key."""
    m = munged.client()
    key = "ef" * 32
    log = tmp_path / "train.log"
    control = tmp_path / "control"
    control.mkdir()
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.bind(("127.0.0.1", 0))
    rx.settimeout(20)
    cmd = ["sh", "-c", f"exec {shlex.quote(sys.executable)} {shlex.quote(str(WORKER))} "
           f"--sleep 0.02 > {shlex.quote(str(log))} 2>&1"]
    run0 = Order("run", 3, 0, 1, "127.0.0.1", free_port(), "r3")
    client = ScriptedClient([{"order": run0.to_dict(), "key": m.encode(key),
                              "report_addr": f"127.0.0.1:{rx.getsockname()[1]}"}])
    la = mr.Launcher(mr.Identity("12", "2", "n03"), cmd, client, m,
                     checkpoint_dir=str(tmp_path / "ck"), control_dir=str(control),
                     base_env={**os.environ, "PYTHONPATH": str(REPO),
                               "GLOO_SOCKET_IFNAME": "lo"},
                     inplace=True)
    try:
        la.prestart()
        assert not la.ready() or inplace.is_ready(control)
        wait_for(la.ready, 60, "the process ready")
        assert inplace.is_ready(control) and la.workers.poll() is None
        assert la.state == "idle" and not steps(log), "it must not train before its epoch"
        pid = la.workers.proc.pid
        assert la.act(la.checkin()) is None
        assert client.calls[0][1]["state"] == "idle"
        assert la.workers.proc.pid == pid
        assert oct((control / training.REPORT_CHANNEL_NAME).stat().st_mode & 0o777) == "0o600"
        report = reports.verify(rx.recv(65536), bytes.fromhex(key))
        assert (report.job, report.epoch, report.world) == ("12", 3, 1)
    finally:
        la.shutdown()
        rx.close()


def test_daemon_drives_a_job_2_3_1_2_in_place(munged, tmp_path):
    """The real API server, launcher service and coordinator drive three in-place launchers
    (subprocesses) with real training processes: 2 → 3 → 1 → 2. The first epoch starts the
    processes; every later change is made in place (asserted), each process keeps its pid,
    all ranks hold equal state and the global step never goes back."""
    from malletrain_core.daemon.epochs import EpochCoordinator

    co = EpochCoordinator(port_range=(29700, 29799), checkpoint_timeout_s=60)
    now = time.time()
    co.add_job("4242", uid=os.getuid(), now=now)
    co.set_target("4242", ["n01", "n02"], now)
    daemon = tl.MiniDaemon(munged, co)
    logs = {n: tmp_path / f"{n}.log" for n in ("n01", "n02", "n03")}
    command = [sys.executable, str(WORKER), "--sleep", "0.03"]
    procs = {n: tl.start_launcher(daemon.address, munged, n, i, command, logs[n],
                                  extra_env={"GLOO_SOCKET_IFNAME": "lo"},
                                  extra_args=("--inplace",))
             for i, n in enumerate(logs)}
    paths = {}

    def trained(epoch, nodes, n=5):
        return all(sum(1 for r in steps(logs[x]) if r["epoch"] == epoch) >= n for x in nodes)

    def change(nodes):
        with daemon.lock:
            co.set_target("4242", nodes, time.time())
        ep = wait_for(lambda: (c := co.current("4242")) is not None
                      and set(c.members) == set(nodes) and c, 60, f"epoch with {nodes}",
                      list(logs.values()))
        paths[ep.number] = ep.path
        wait_for(lambda: trained(ep.number, nodes), 90, f"training in epoch {ep.number}",
                 list(logs.values()))
        return ep.number

    def pids(node):
        return {r["pid"] for r in steps(logs[node]) if "pid" in r}

    try:
        e0 = wait_for(lambda: (c := co.current("4242")) is not None and c.number + 1, 60,
                      "the first epoch", list(logs.values())) - 1
        paths[e0] = co.current("4242").path
        wait_for(lambda: trained(e0, ["n01", "n02"]), 90, "training in the first epoch",
                 list(logs.values()))
        e1 = change(["n01", "n02", "n03"])
        e2 = change(["n01"])
        e3 = change(["n01", "n02"])
        assert paths == {e0: "disk", e1: "inplace", e2: "inplace", e3: "inplace"}, paths
        a = steps(logs["n01"])
        assert len(pids("n01")) == 1, "n01's process was restarted"
        assert len(pids("n03")) == 1
        done = [r["step"] for r in a]
        assert all(y >= x for x, y in zip(done, done[1:])), "the global step went back"
        for epoch, nodes in ((e1, ["n01", "n02", "n03"]), (e3, ["n01", "n02"])):
            by_step: dict[int, set[str]] = {}
            for n in nodes:
                for r in steps(logs[n]):
                    if r["epoch"] == epoch and "digest" in r:
                        by_step.setdefault(r["step"], set()).add(r["digest"])
            full = [s for s, d in by_step.items()
                    if sum(1 for n in nodes for r in steps(logs[n])
                           if r["epoch"] == epoch and r["step"] == s) == len(nodes)]
            assert full and all(len(by_step[s]) == 1 for s in full), (epoch, by_step)
        gaps = []
        for before, after in ((e0, e1), (e1, e2), (e2, e3)):
            old = [r for r in a if r["epoch"] == before]
            new = [r for r in a if r["epoch"] == after]
            gaps.append(round(new[0]["t"] - old[-1]["t"], 3))
            assert new[0]["step"] >= old[-1]["step"], "a planned change lost a step"
        print(f"\npause on n01 (grow 2→3, shrink 3→1, grow 1→2), s: {gaps}")
    finally:
        for p in procs.values():
            if p.poll() is None:
                tl.terminate(p)
        daemon.close()
