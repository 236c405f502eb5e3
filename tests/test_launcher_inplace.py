"""malletrain-run --inplace: one training process kept across epochs, orders relayed to it.

Real launcher, real training process (tests/workers/inplace_train.py, torch + gloo), the
daemon's replies scripted.
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import sys
import time

import pytest

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
    out = []
    for line in log.read_text().splitlines() if log.exists() else []:
        if line.startswith('{"t"'):
            out.append(json.loads(line))
    return out


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


def test_inplace_refuses_several_processes_per_node(capsys, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "5")
    monkeypatch.setenv("MALLETRAIN_DAEMON", "127.0.0.1:1")
    assert mr.main(["--inplace", "--nproc-per-node", "2", "python", "t.py"]) == 2
    assert "--inplace runs one process per node" in capsys.readouterr().err
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
