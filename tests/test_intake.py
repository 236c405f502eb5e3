"""Daemon intake: hook datagrams with sender credentials, signed reports over UDP."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from malletrain_core.daemon.intake import HookListener, ReportListener, to_event
from malletrain_core.wire import reports

KEY = b"s" * 32


def send_unix(path, data):
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.sendto(data, str(path))


def drain_soon(listener, n=1, timeout=2.0):
    out, t0 = [], time.monotonic()
    while len(out) < n and time.monotonic() - t0 < timeout:
        out += listener.drain()
        time.sleep(0.01)
    return out


def drain_all(listener, sent, timeout=5.0):
    """Drain until every one of ``sent`` datagrams was either accepted or dropped."""
    out, t0 = [], time.monotonic()
    while time.monotonic() - t0 < timeout:
        out += listener.drain()
        if len(out) + sum(listener.dropped.values()) >= sent:
            break
        time.sleep(0.01)
    return out


def test_hook_datagrams_from_allowed_uid(tmp_path):
    hook = HookListener(tmp_path / "hook.sock", allowed_uids={os.getuid()}, decode=json.loads)
    send_unix(hook.path, b'{"v": 1, "kind": "job_end"}')
    send_unix(hook.path, b"not json")
    send_unix(hook.path, b"x" * 5000)
    got = drain_all(hook, 3)
    assert got == [{"v": 1, "kind": "job_end"}]
    assert sum(hook.dropped.values()) == 2
    hook.close()
    assert not hook.path.exists()


def test_other_jobs_submissions_are_counted_as_they_arrive(tmp_path):
    """job_submit.lua's datagram for a job it does not convert ("elastic":false, its exact
    text) is counted on the reader thread, before any drain; an elastic one is not."""
    from malletrain_core.wire import hooks as protocol

    hook = HookListener(tmp_path / "hook.sock", allowed_uids={os.getuid()},
                        decode=protocol.decode)
    send_unix(hook.path, b'{"v":1,"src":"slurm-job-submit","kind":"job_submit","t":1}')
    send_unix(hook.path, b'{"v":1,"src":"slurm-job-submit","kind":"job_submit","t":1,'
                         b'"elastic":false}')
    t0 = time.monotonic()
    while hook.other_submits < 1 and time.monotonic() - t0 < 2:
        time.sleep(0.01)
    assert hook.other_submits == 1
    got = drain_all(hook, 2)
    assert [m.elastic for m in got] == [True, False]
    assert protocol.decode(protocol.encode(got[1])) == got[1]
    with pytest.raises(protocol.ProtocolError, match="'elastic' must be true or false"):
        protocol.decode(b'{"v":1,"src":"x","kind":"job_submit","t":1,"elastic":"no"}')
    hook.close()


def test_a_submission_confined_to_its_nodes_names_them():
    """job_submit.lua sends a production job's -w nodes and node counts: the job can run only
    on those nodes when it may take no more than it names."""
    from malletrain_core.wire import hooks as protocol

    def only(extra: str) -> tuple[str, ...]:
        msg = protocol.decode(b'{"v":1,"src":"slurm-job-submit","kind":"job_submit","t":1,'
                              b'"elastic":false' + extra.encode() + b"}")
        assert isinstance(msg, protocol.JobSubmit) and not msg.elastic
        assert protocol.decode(protocol.encode(msg)) == msg
        return msg.only_nodes

    assert only(',"nodes":"n[01-02]"') == ("n01", "n02")
    assert only(',"nodes":"n[01-02]","min_nodes":2,"max_nodes":2') == ("n01", "n02")
    assert only(',"nodes":"n01","min_nodes":1,"max_nodes":4') == ()  # may take 3 others
    assert only(',"nodes":"n01","min_nodes":3') == ()
    assert only("") == ()
    elastic = protocol.decode(b'{"v":1,"src":"s","kind":"job_submit","t":1,"nodes":"n01"}')
    assert isinstance(elastic, protocol.JobSubmit) and elastic.only_nodes == ()
    with pytest.raises(protocol.ProtocolError, match="min_nodes"):
        only(',"nodes":"n01","min_nodes":-1')
    with pytest.raises(protocol.ProtocolError, match="hostlist|node"):
        only(',"nodes":"n[02-01]"')


def test_hook_datagrams_from_other_uid_are_dropped(tmp_path):
    hook = HookListener(tmp_path / "hook.sock", allowed_uids={12345})
    send_unix(hook.path, b"{}")
    assert drain_all(hook, 1) == []
    assert any("not allowed" in r for r in hook.dropped)
    hook.close()


def test_hook_send_is_instant_when_daemon_is_down(tmp_path):
    # The hooks' contract: with no daemon listening the send fails at once, it never blocks.
    code = ("import socket,time;t=time.monotonic();s=socket.socket(socket.AF_UNIX,"
            "socket.SOCK_DGRAM);s.setblocking(False)\n"
            "try: s.sendto(b'x', %r)\nexcept OSError: pass\nprint(time.monotonic()-t)")
    out = subprocess.run([sys.executable, "-c", code % str(tmp_path / "none.sock")],
                         capture_output=True, text=True, check=True).stdout
    assert float(out) < 0.5


def make_report(seq=1, job="9", **kw):
    r = dict(job=job, epoch=1, seq=seq, t=100.0 + seq, samples=64.0 * seq, world=2, rank=0)
    r.update(kw)
    return reports.Report(**r)


def test_reports_verified_replays_and_forgeries_dropped():
    listener = ReportListener("127.0.0.1", 0, key_for={"9": KEY}.get)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for data in (reports.sign(make_report(1), KEY), reports.sign(make_report(1), KEY),
                     reports.sign(make_report(2), b"forged" * 6),
                     reports.sign(make_report(3, job="other"), KEY), b"garbage",
                     reports.sign(make_report(4), KEY)):
            s.sendto(data, listener.address)
    got = drain_all(listener, 6)
    assert [r.seq for r in got] == [1, 4]
    assert sum(listener.dropped.values()) == 4
    event = to_event(got[1])
    assert (event.job_id, event.samples, event.world_size, event.epoch) == ("9", 256.0, 2, 1)
    listener.close()


@pytest.mark.parametrize("n", [200])
def test_report_burst_counted(n):
    listener = ReportListener("127.0.0.1", 0, key_for=lambda job: KEY)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for i in range(1, n + 1):
            s.sendto(reports.sign(make_report(i), KEY), listener.address)
    got = drain_soon(listener, n)
    assert len(got) + sum(listener.dropped.values()) <= n
    assert len(got) == n  # loopback, default buffers: nothing lost at this rate
    listener.close()
