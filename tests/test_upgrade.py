"""Upgrades without a stop: this release's daemon side serves the clients of the previous
release (0.1, the commit below), run side by side as separate processes from that release's
own source: its CLI/API client, its launcher's check-in and order parsing, its hook datagrams
and its signed reports. A client newer than the daemon is refused in one line naming both
versions."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from malletrain_core.daemon.api import Dispatcher, UnixApiServer
from malletrain_core.daemon.epochs import EpochCoordinator
from malletrain_core.daemon.launchers import LauncherService
from malletrain_core.wire import hooks, reports
from malletrain_core.wire.api import VERSION

REPO = Path(__file__).resolve().parents[1]
PREVIOUS_RELEASE = "b18a226"
"""The last commit of release 0.1 (the round before the layout of backends/worker/wire)."""


@pytest.fixture(scope="module")
def previous() -> Path:
    """The previous release's package, extracted from git into a folder of its own."""
    if subprocess.run(["git", "-C", str(REPO), "cat-file", "-e", f"{PREVIOUS_RELEASE}^{{commit}}"],
                      capture_output=True).returncode != 0:
        pytest.fail(f"commit {PREVIOUS_RELEASE} (release 0.1) is not in this clone; fetch the "
                    "full history (git fetch --unshallow)")
    root = Path(tempfile.mkdtemp(prefix="mt-release-0.1-"))
    archive = subprocess.run(["git", "-C", str(REPO), "archive", PREVIOUS_RELEASE,
                              "malletrain_core"], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(root)], input=archive, check=True)
    assert (root / "malletrain_core" / "launcher.py").exists()  # the old layout
    return root


def old(previous: Path, code: str, *args: str) -> str:
    """Run ``code`` with the previous release importable (and not this one)."""
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                         timeout=60, cwd=previous, env={**os.environ, "PYTHONPATH": str(previous)})
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.fixture
def server(tmp_path):
    co = EpochCoordinator()
    co.add_job("55", uid=os.getuid(), now=0.0)
    co.set_target("55", ["n1"], 0.0)
    dispatcher = Dispatcher(admin_uids={os.getuid()})
    dispatcher.register("whoami", lambda uid, args: {"uid": uid})
    LauncherService(co, lambda key, uid: "MUNGE:wrapped", report_addr="127.0.0.1:9",
                    clock=lambda: 1.0).register(dispatcher)
    path = str(tmp_path / "api.sock")
    srv = UnixApiServer(path, dispatcher, idle_timeout_s=5)
    srv.start()
    yield path
    srv.close()


def test_the_previous_cli_client_is_served(previous, server):
    code = ("import sys, malletrain_core.api as api; assert api.__file__.startswith(sys.argv[2])\n"
            "print(api.UnixClient(sys.argv[1]).call('whoami')['uid'])")
    assert int(old(previous, code, server, str(previous))) == os.getuid()


def test_the_previous_launcher_checks_in_and_understands_its_orders(previous, server):
    # release 0.1's malletrain-run: check-in without a protocol version, order parsed by its
    # own Order.from_dict
    code = ("import sys, json\nfrom malletrain_core.api import UnixClient\n"
            "from malletrain_core.epochs import Order\n"
            "reply = UnixClient(sys.argv[1]).call('checkin', job='55', node='n1', task='55_0',"
            " epoch=None, state='idle', rc=None, addr='127.0.0.1', ckpt_seen=0)\n"
            "order = Order.from_dict(reply['order'])\n"
            "print(json.dumps([order.kind, order.world, order.rank, 'key' in reply]))")
    assert json.loads(old(previous, code, server)) == ["run", 1, 0, True]


def test_the_previous_hooks_and_reports_are_read(previous):
    code = ("import json, sys\nfrom malletrain_core import protocol, reports\n"
            "d = protocol.encode(protocol.JobEnd(src='slurm-epilog', t=5.0, job='7', "
            "nodes=('n01', 'n02')))\n"
            "r = reports.sign(reports.Report(job='7', epoch=1, seq=3, t=9.0, samples=64.0, "
            "world=2), b'k' * 32)\n"
            "print(json.dumps([d.decode(), r.hex()]))")
    datagram, report = json.loads(old(previous, code))
    msg = hooks.decode(datagram.encode())
    assert isinstance(msg, hooks.JobEnd) and msg.job == "7" and msg.nodes == ("n01", "n02")
    got = reports.verify(bytes.fromhex(report), b"k" * 32)
    assert (got.job, got.epoch, got.seq, got.samples, got.world) == ("7", 1, 3, 64.0, 2)


def test_the_previous_epilog_script_is_read():
    old_epilog = subprocess.run(["git", "-C", str(REPO), "show",
                                 f"{PREVIOUS_RELEASE}:plugin/epilog_slurmctld"],
                                capture_output=True, text=True, check=True).stdout
    assert '"v":1' in old_epilog  # the hook datagrams' version did not change


def test_a_newer_client_is_refused_naming_both_versions(server):
    import socket

    with socket.socket(socket.AF_UNIX) as s:
        s.connect(server)
        s.sendall(json.dumps({"v": VERSION + 1, "op": "whoami", "args": {}}).encode() + b"\n")
        reply = json.loads(s.makefile().readline())
    assert reply["ok"] is False
    assert f"speaks API protocol {VERSION}" in reply["error"]
    assert f"request protocol {VERSION + 1}" in reply["error"]
    assert "upgrade malletraind before its clients" in reply["error"]


def test_newer_hooks_reports_and_launchers_are_refused_naming_both():
    with pytest.raises(hooks.ProtocolError, match=r"version 2 not understood \(this daemon "
                       r"speaks v=1\); upgrade malletraind before the hooks"):
        hooks.decode(b'{"v": 2, "src": "x", "kind": "job_end", "t": 1, "job": "1"}')
    with pytest.raises(reports.ReportError, match="report format MTR2, this daemon reads MTR1"):
        reports.parse(b"MTR2 " + b"0" * 64 + b" {}")
    co = EpochCoordinator()
    co.add_job("5", uid=0, now=0.0)
    svc = LauncherService(co, lambda key, uid: "", report_addr="h:1", clock=lambda: 0.0)
    from malletrain_core.wire.api import ApiError
    with pytest.raises(ApiError, match="launcher protocol 1, the launcher 2"):
        svc.checkin(0, {"job": "5", "node": "n1", "proto": 2})
