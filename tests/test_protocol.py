"""The hook datagram: decode's validation, encode/decode round trips, the listener's kernel
credentials, and the real EpilogSlurmctld script run as Slurm would run it."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from malletrain_core.errors import MalleTrainError
from malletrain_core.wire.hooks import (
    MAX_DATAGRAM_BYTES,
    HookSocket,
    JobEnd,
    JobQueued,
    NodeChange,
    NodesFree,
    ProtocolError,
    decode,
    encode,
    send,
)

EPILOG = Path(__file__).resolve().parents[1] / "plugin" / "epilog_slurmctld"


def dgram(**fields: object) -> bytes:
    base: dict[str, object] = {"v": 1, "src": "test", "kind": "job_end", "t": 1.5, "job": "7"}
    base.update(fields)
    return json.dumps({k: v for k, v in base.items() if v is not ...}).encode()


def test_job_end_full() -> None:
    msg = decode(dgram(nodes="n[01-03],m7", user="ann", uid=1001, restarts=2, exit="0:15",
                       partition="preemptable", job="12_3"))
    assert msg == JobEnd(src="test", t=1.5, job="12_3", nodes=("m7", "n01", "n02", "n03"),
                         user="ann", uid=1001, restarts=2, exit="0:15", partition="preemptable")


def test_job_end_minimal_and_unknown_keys_ignored() -> None:
    msg = decode(dgram(extra={"future": True}))
    assert isinstance(msg, JobEnd)
    assert (msg.job, msg.nodes, msg.uid, msg.exit) == ("7", (), None, None)


def test_nodes_free_and_node_change() -> None:
    free = decode(dgram(kind="nodes_free", job=..., nodes=["c1", "c2"]))
    assert free == NodesFree(src="test", t=1.5, nodes=("c1", "c2"))
    change = decode(dgram(kind="node_change", job=..., node="c1", state="offline"))
    assert change == NodeChange(src="test", t=1.5, node="c1", state="offline")


@pytest.mark.parametrize("data, reason", [
    (b"x" * (MAX_DATAGRAM_BYTES + 1), "more than 4096"),
    (b'{"v": 1, "src": "\xff"}', "not UTF-8"),
    (b"{not json", "not JSON"),
    (b"[1, 2]", "JSON object expected, got list"),
    (dgram(v=2), "version 2 not understood"),
    (dgram(v=True), "version True not understood"),
    (dgram(v=...), "version None"),
    (dgram(kind="job_start"), "unknown kind 'job_start'"),
    (dgram(src=...), "missing field 'src'"),
    (dgram(src=""), "'src' must be a non-empty string"),
    (dgram(t="now"), "'t' must be a number"),
    (dgram(t=-1), "'t' must be a unix time"),
    (dgram(job=...), "missing field 'job'"),
    (dgram(job=12), "'job' must be a non-empty string, got int"),
    (dgram(uid="1000"), "'uid' must be a non-negative integer, got str"),
    (dgram(uid=True), "'uid' must be a non-negative integer, got bool"),
    (dgram(restarts=-1), "'restarts' must be >= 0"),
    (dgram(exit="15"), "'exit' must look like '0:15'"),
    (dgram(nodes=["n1"]), "'nodes' must be a hostlist string"),
    (dgram(nodes="n[1-"), "bad hostlist"),
    (dgram(kind="nodes_free", nodes="n1"), "'nodes' must be a list"),
    (dgram(kind="nodes_free", nodes=["n1", ""]), "must list non-empty node names"),
    (dgram(kind="nodes_free"), "missing field 'nodes'"),
    (dgram(kind="node_change", node="n1"), "missing field 'state'"),
])
def test_decode_refuses_with_one_line_reason(data: bytes, reason: str) -> None:
    with pytest.raises(ProtocolError) as err:
        decode(data)
    assert reason in str(err.value)
    assert "\n" not in str(err.value)
    assert isinstance(err.value, MalleTrainError)


def test_encode_refuses_oversized() -> None:
    msg = NodesFree(src="t", t=0.0, nodes=tuple(f"node-{i:05d}-{'x' * 20}" for i in range(200)))
    with pytest.raises(ProtocolError, match="split the node list"):
        encode(msg)


def test_encode_folds_hostlist_and_is_compact() -> None:
    data = encode(JobEnd(src="slurm-epilog", t=2.0, job="5", nodes=("n02", "n01", "n03")))
    assert json.loads(data) == {"v": 1, "src": "slurm-epilog", "kind": "job_end", "t": 2.0,
                                "job": "5", "nodes": "n[01-03]"}
    assert b" " not in data


names = st.from_regex(r"\A[a-z]{1,3}[0-9]{0,4}\Z")
texts = st.text(min_size=1, max_size=20).filter(lambda s: s.strip() != "")
times = st.floats(min_value=0, max_value=4e9, allow_nan=False)
messages = st.one_of(
    st.builds(JobEnd, src=texts, t=times, job=texts,
              nodes=st.lists(names, max_size=30).map(lambda ns: tuple(sorted(set(ns)))),
              user=st.none() | texts, uid=st.none() | st.integers(0, 2**31),
              restarts=st.none() | st.integers(0, 1000),
              exit=st.none() | st.tuples(st.integers(0, 255), st.integers(0, 64)).map(
                  lambda p: f"{p[0]}:{p[1]}"),
              partition=st.none() | texts),
    st.builds(NodesFree, src=texts, t=times, nodes=st.lists(names, max_size=50).map(tuple)),
    st.builds(NodeChange, src=texts, t=times, node=names, state=texts),
    st.builds(JobQueued, src=texts, t=times, job=texts),
)


@settings(max_examples=150, deadline=None)
@given(messages)
def test_round_trip(msg: JobEnd | NodesFree | NodeChange | JobQueued) -> None:
    back = decode(encode(msg))
    if isinstance(msg, JobEnd):  # a hostlist carries a set: NodeSet's order, no duplicates
        assert isinstance(back, JobEnd)
        assert sorted(back.nodes) == sorted(msg.nodes)
        back = dataclasses.replace(back, nodes=msg.nodes)
    assert back == msg


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=200))
def test_arbitrary_bytes_never_crash(data: bytes) -> None:
    try:
        decode(data)
    except ProtocolError:
        pass


def test_listener_reports_kernel_credentials(tmp_path: Path) -> None:
    with HookSocket(tmp_path / "hook.sock") as lis:
        assert send(NodeChange(src="t", t=1.0, node="n1", state="down"), str(lis.path))
        got = lis.receive(timeout_s=5)
    assert got.message == NodeChange(src="t", t=1.0, node="n1", state="down")
    assert (got.pid, got.uid, got.gid) == (os.getpid(), os.getuid(), os.getgid())
    assert not (tmp_path / "hook.sock").exists()


def test_listener_refuses_bad_datagram(tmp_path: Path) -> None:
    with HookSocket(tmp_path / "hook.sock") as lis:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.sendto(b"x" * (MAX_DATAGRAM_BYTES + 10), str(lis.path))
        with pytest.raises(ProtocolError, match="more than 4096"):
            lis.receive(timeout_s=5)


def test_send_without_daemon_returns_false(tmp_path: Path) -> None:
    assert send(NodeChange(src="t", t=1.0, node="n1", state="x"), str(tmp_path / "none")) is False


SLURM_ENV = {"SLURM_JOB_ID": "41", "SLURM_ARRAY_JOB_ID": "40", "SLURM_ARRAY_TASK_ID": "1",
             "SLURM_JOB_NODELIST": "n[03-04]", "SLURM_JOB_USER": "ann", "SLURM_JOB_UID": "1001",
             "SLURM_JOB_RESTART_COUNT": "1", "SLURM_JOB_EXIT_CODE2": "0:15",
             "SLURM_JOB_PARTITION": "preemptable", "SLURM_SCRIPT_CONTEXT": "epilog_slurmctld"}


def run_epilog(env: dict[str, str]) -> tuple[int, float]:
    # slurmctld gives its scripts only SLURM_* variables (no PATH): so does this test.
    t0 = time.perf_counter()
    proc = subprocess.run([str(EPILOG)], env=env, capture_output=True, timeout=30, check=False)
    return proc.returncode, time.perf_counter() - t0


def test_epilog_script_sends_one_valid_datagram(tmp_path: Path) -> None:
    with HookSocket(tmp_path / "hook.sock") as lis:
        rc, _ = run_epilog({**SLURM_ENV, "MALLETRAIN_HOOK_SOCKET": str(lis.path)})
        got = lis.receive(timeout_s=5)
        lis.sock.settimeout(0.2)  # type: ignore[union-attr]
        with pytest.raises(socket.timeout):
            lis.sock.recv(MAX_DATAGRAM_BYTES)  # type: ignore[union-attr]
    assert rc == 0
    assert got.message == JobEnd(src="slurm-epilog", t=got.message.t, job="40_1",
                                 nodes=("n03", "n04"), user="ann", uid=1001, restarts=1,
                                 exit="0:15", partition="preemptable")
    assert abs(got.message.t - time.time()) < 60


def test_epilog_plain_job_and_odd_values(tmp_path: Path) -> None:
    env = {"SLURM_JOB_ID": "9", "SLURM_JOB_USER": 'we"ird\\ü', "SLURM_JOB_UID": "oops"}
    with HookSocket(tmp_path / "hook.sock") as lis:
        rc, _ = run_epilog({**env, "MALLETRAIN_HOOK_SOCKET": str(lis.path)})
        msg = lis.receive(timeout_s=5).message
    assert rc == 0
    assert isinstance(msg, JobEnd)
    assert (msg.job, msg.user, msg.uid, msg.nodes) == ("9", 'we"ird\\ü', None, ())


def test_epilog_exits_zero_fast_with_daemon_down(tmp_path: Path) -> None:
    rc, elapsed = run_epilog({**SLURM_ENV, "MALLETRAIN_HOOK_SOCKET": str(tmp_path / "no.sock")})
    assert rc == 0
    assert elapsed < 2.0, f"{elapsed:.3f} s"  # about 7 ms here; generous for a loaded host


def test_epilog_exits_zero_when_socket_is_full(tmp_path: Path) -> None:
    path = tmp_path / "full.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as server, \
            socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as filler:
        server.bind(str(path))
        filler.setblocking(False)
        with pytest.raises(BlockingIOError):
            for _ in range(10_000):
                filler.sendto(b"x" * 512, str(path))
        rc, elapsed = run_epilog({**SLURM_ENV, "MALLETRAIN_HOOK_SOCKET": str(path)})
    assert rc == 0
    assert elapsed < 2.0, f"{elapsed:.3f} s"


def test_epilog_uses_only_the_standard_library() -> None:
    proc = subprocess.run([sys.executable, "-I", "-S", "-c",
                           f"import runpy; runpy.run_path({str(EPILOG)!r}, run_name='x'); "
                           "import sys; print(sorted(m for m in sys.modules "
                           "if m.startswith(('malletrain', 'ClusterShell'))))"],
                          capture_output=True, text=True, check=True, timeout=30)
    assert proc.stdout.strip() == "[]"


def test_listener_refuses_a_path_that_is_not_a_socket(tmp_path: Path) -> None:
    (tmp_path / "hook.sock").write_text("not a socket")
    with pytest.raises(ProtocolError, match="exists and is not a socket"):
        HookSocket(tmp_path / "hook.sock").bind()
    assert (tmp_path / "hook.sock").read_text() == "not a socket"
