"""Hostile input: every parser that reads bytes from outside the daemon answers with its own
one-line error, never another exception, and stores nothing it refused.

Covered: hook datagrams (protocol.decode), signed reports (reports.parse/verify, ReplayGuard),
API request lines (Dispatcher.dispatch), journal events (codec.from_dict), the TOML
configuration (config.load), trace files (idle CSV, SWF, the fragment .npy), the elastic range
check of job_submit.lua, and the daemon's intake fed through real sockets.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from malletrain_core import config
from malletrain_core.daemon import codec
from malletrain_core.daemon.api import Dispatcher
from malletrain_core.daemon.intake import MAX_DROP_REASONS, HookListener, ReportListener
from malletrain_core.errors import ConfigError, InputFileError
from malletrain_core.sim import sources, traces
from malletrain_core.wire import hooks as protocol
from malletrain_core.wire import reports

pytestmark = pytest.mark.security

FAST = settings(max_examples=150, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])
KEY = b"k" * 32

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=12)


def one_line(message: str) -> bool:
    return bool(message) and "\n" not in message and "Traceback" not in message


# ----- hook datagrams ---------------------------------------------------------------------------
VALID_HOOKS = [
    protocol.JobEnd(src="epilog", t=1.7e9, job="42_3", nodes=("n01", "n02"), user="alice",
                    uid=1000, restarts=1, exit="0:15", partition="work"),
    protocol.NodesFree(src="pbs", t=1.7e9, nodes=("a", "b")),
    protocol.NodeChange(src="pbs", t=5.0, node="n1", state="down"),
]


def decode_or_refuse(data: bytes) -> protocol.Message | None:
    try:
        msg = protocol.decode(data)
    except protocol.ProtocolError as exc:
        assert one_line(str(exc)), exc
        return None
    assert isinstance(msg, (protocol.JobEnd, protocol.NodesFree, protocol.NodeChange))
    assert protocol.decode(protocol.encode(msg)) == msg
    return msg


@FAST
@given(st.binary(max_size=protocol.MAX_DATAGRAM_BYTES + 64))
def test_decode_arbitrary_bytes(data: bytes) -> None:
    decode_or_refuse(data)


@FAST
@given(st.sampled_from(VALID_HOOKS), st.data())
def test_decode_mutated_datagrams(msg: protocol.Message, data: st.DataObject) -> None:
    raw = bytearray(protocol.encode(msg))
    for _ in range(data.draw(st.integers(1, 4))):
        op = data.draw(st.sampled_from(["flip", "cut", "insert", "delete"]))
        i = data.draw(st.integers(0, max(len(raw) - 1, 0)))
        if op == "flip" and raw:
            raw[i] ^= data.draw(st.integers(1, 255))
        elif op == "cut":
            del raw[i:]
        elif op == "insert":
            raw[i:i] = data.draw(st.binary(min_size=1, max_size=8))
        elif raw:
            del raw[i]
    decode_or_refuse(bytes(raw))


@FAST
@given(st.dictionaries(st.sampled_from(["v", "src", "kind", "t", "job", "nodes", "node",
                                        "state", "uid", "restarts", "exit", "user"]),
                       json_values, max_size=10),
       st.sampled_from(list(protocol.KINDS)))
def test_decode_wrong_types_and_versions(obj: dict, kind: str) -> None:
    obj.setdefault("kind", kind)
    try:
        data = json.dumps(obj).encode()
    except ValueError:
        return
    msg = decode_or_refuse(data)
    if msg is not None:
        assert obj["v"] == protocol.VERSION and isinstance(msg.src, str) and msg.t >= 0


@pytest.mark.parametrize("data, says", [
    (b"[" * 5000, "bytes, more than"),
    (b"[" * 4000, "nested too deeply"),
    (b'{"v": 2, "kind": "job_end", "src": "x", "t": 1, "job": "1"}', "version 2"),
    (b'{"v": true, "kind": "job_end", "src": "x", "t": 1, "job": "1"}', "version True"),
    (b'{"v": 1, "kind": "job_end", "src": "x", "t": 1, "job": "1", "nodes": "n[1-99999999]"}',
     "more than 65536 nodes"),
    (b'{"v": 1, "kind": "job_end", "src": "x", "t": 1, "job": "1", "nodes": "a[1-999]b[1-999]"}',
     "more than 65536 nodes"),
    (b'{"v": 1, "kind": "job_end", "src": "x", "t": 1, "job": "1", "nodes": "@all"}',
     "only names like"),
    (b'{"v": 1, "kind": "job_end", "src": "x", "t": 1, "job": "1", "nodes": "n[1-2]]"}',
     "bad hostlist"),
    (b'{"v": 1, "kind": "job_end", "src": "x", "t": 1e999, "job": "1"}', "unix time"),
    (b'{"v": 1, "kind": "node_change", "src": "x", "t": NaN, "node": "a", "state": "b"}',
     "unix time"),
])
def test_decode_hostile_examples(data: bytes, says: str) -> None:
    t0 = time.monotonic()
    with pytest.raises(protocol.ProtocolError, match=None) as err:
        protocol.decode(data)
    assert says in str(err.value) and one_line(str(err.value))
    assert time.monotonic() - t0 < 1.0, "refusing must be cheap"


# ----- signed reports ---------------------------------------------------------------------------
reports_st = st.builds(reports.Report, job=st.text(min_size=1, max_size=20),
                       epoch=st.integers(0, 2**40), seq=st.integers(0, 2**40),
                       t=st.floats(0, 2e9), samples=st.floats(0, 1e15),
                       world=st.integers(1, 4096), rank=st.just(0),
                       ckpt=st.none() | st.integers(0, 10**9))


def refused(data: bytes, key: bytes = KEY) -> str:
    with pytest.raises(reports.ReportError) as err:
        reports.verify(data, key)
    assert one_line(str(err.value))
    return str(err.value)


@FAST
@given(st.binary(max_size=reports.MAX_BYTES + 32))
def test_report_arbitrary_bytes(data: bytes) -> None:
    refused(data)


@FAST
@given(reports_st, st.binary(min_size=32, max_size=32), st.integers(0, 2000))
def test_report_forged_truncated_and_wrong_version(report: reports.Report, other_key: bytes,
                                                   cut: int) -> None:
    assume(other_key != KEY)
    signed = reports.sign(report, KEY)
    assert reports.verify(signed, KEY) == report
    assert "bad signature" in refused(reports.sign(report, other_key))
    assert "bad signature" in refused(signed[:5] + b"0" * 64 + signed[69:])
    if cut < len(signed):
        refused(signed[:cut])
    assert "report format MTR2, this daemon reads MTR1" in refused(b"MTR2" + signed[4:])
    tampered = signed.replace(b'"world":', b'"world":1', 1)
    if tampered != signed:
        refused(tampered)


@FAST
@given(st.lists(st.tuples(st.sampled_from(["a", "b"]), st.integers(0, 2), st.integers(0, 6)),
                max_size=30))
def test_replay_guard_accepts_each_sequence_number_once_in_order(
        stream: list[tuple[str, int, int]]) -> None:
    guard, last = reports.ReplayGuard(), {}
    for job, epoch, seq in stream:
        report = reports.Report(job=job, epoch=epoch, seq=seq, t=0.0, samples=0.0, world=1)
        fresh = seq > last.get((job, epoch), -1)
        if fresh:
            guard.check(report)
            last[(job, epoch)] = seq
        else:
            with pytest.raises(reports.ReportError, match="replayed"):
                guard.check(report)


# ----- API request lines ------------------------------------------------------------------------
def dispatcher() -> Dispatcher:
    d = Dispatcher(admin_uids={0})
    d.register("echo", lambda uid, args: args)
    d.register("drain", lambda uid, args: "drained", admin=True)
    return d


def check_reply(reply: bytes) -> dict:
    assert reply.endswith(b"\n") and reply.count(b"\n") == 1
    body = json.loads(reply)
    assert isinstance(body, dict) and isinstance(body["ok"], bool)
    if not body["ok"]:
        assert one_line(body["error"]) and set(body) == {"v", "ok", "error"}
    return body


@FAST
@given(st.binary(max_size=2000), st.integers(0, 2**31))
def test_dispatch_arbitrary_lines(line: bytes, uid: int) -> None:
    check_reply(dispatcher().dispatch(uid, line))


@FAST
@given(st.dictionaries(st.sampled_from(["op", "args", "x"]), json_values, max_size=3)
       | st.fixed_dictionaries({"op": st.sampled_from(["echo", "drain", "nope"]),
                                "args": json_values}),
       st.integers(1, 2**31))
def test_dispatch_arbitrary_requests(request: dict, uid: int) -> None:
    try:
        line = json.dumps(request).encode()
    except ValueError:
        return
    body = check_reply(dispatcher().dispatch(uid, line))
    if request.get("op") == "drain":
        assert body["ok"] is False
        if isinstance(request.get("args", {}), dict):
            assert "administrator" in body["error"]
    if body["ok"]:
        assert request["op"] == "echo"


@pytest.mark.parametrize("line", [b"[" * 60000, b'{"op": "echo", "args": ' + b"[" * 60000,
                                  b"\x00" * 100, b"{}" * 1000, b'{"op": "echo"}{"op": "echo"}'])
def test_dispatch_hostile_examples(line: bytes) -> None:
    assert check_reply(dispatcher().dispatch(1000, line))["ok"] is False


# ----- journal events ---------------------------------------------------------------------------
@FAST
@given(st.sampled_from(sorted(codec._TYPES)), st.dictionaries(
    st.sampled_from(["time", "nodes", "job", "job_id", "reason", "samples", "world_size",
                     "epoch", "node", "time_limit_s", "extra"]), json_values, max_size=6))
def test_codec_from_dict_refuses_with_value_error(kind: str, fields: dict) -> None:
    try:
        obj = codec.from_dict({"type": kind, **fields})
    except ValueError as exc:
        assert one_line(str(exc))
        return
    assert type(obj).__name__ == kind


# ----- configuration ----------------------------------------------------------------------------
DEFAULTS_TEXT = config.DOCUMENTED_DEFAULTS.read_text()


def load_text(tmp_path: Path, text: str | bytes) -> config.Config | None:
    path = tmp_path / "fuzz.toml"
    path.write_bytes(text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text)
    try:
        return config.load(path, env={})
    except ConfigError as exc:
        assert one_line(str(exc)), exc
        return None


@FAST
@given(st.binary(max_size=300) | st.text(max_size=300))
def test_config_arbitrary_text(tmp_path: Path, text: str | bytes) -> None:
    load_text(tmp_path, text)


@FAST
@given(st.data())
def test_config_mutated_defaults(tmp_path: Path, data: st.DataObject) -> None:
    lines = DEFAULTS_TEXT.splitlines()
    i = data.draw(st.integers(0, len(lines) - 1))
    key = lines[i].split("=")[0].strip()
    value = data.draw(st.sampled_from(['"x"', "-1", "nan", "inf", "1e999", "[1, 2]", "{a = 1}",
                                       '"²"', '"-0"', "true", "0", "[[[[", '"1_0"', '"nan"']))
    lines[i] = f"{key} = {value}" if "=" in lines[i] else lines[i] + data.draw(
        st.sampled_from(["]", "[", " = ", "x"]))
    cfg = load_text(tmp_path, "\n".join(lines))
    if cfg is not None:
        assert cfg.daemon.poll_interval_s > 0 and cfg.allocator.max_running_jobs >= 0


@pytest.mark.parametrize("text, says", [
    ("a = " + "[" * 3000, "not valid TOML"),
    (b"\xff\xfe[daemon]", "not valid TOML"),
    ("[daemon]\npoll_interval_s = nan", "finite number > 0"),
    ("[daemon]\npoll_interval_s = inf", "finite number > 0"),
    ("[daemon]\napi_port = \"\u00b2\"", "is not an int"),
    ("[slurm]\ncommand_timeout_s = -1", "finite number > 0"),
    ("[allocator]\nuser_max_nodes = { bob = -3 }", "user_max_nodes.bob"),
    ("[allocator]\nmax_running_jobs = -1", "max_running_jobs"),
])
def test_config_hostile_examples(tmp_path: Path, text: str | bytes, says: str) -> None:
    path = tmp_path / "c.toml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(ConfigError) as err:
        config.load(path, env={})
    assert says in str(err.value) and one_line(str(err.value))


def test_config_file_that_is_a_directory(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="is a directory"):
        config.load(tmp_path, env={})


@FAST
@given(st.text(max_size=12))
def test_config_environment_values(value: str) -> None:
    assume("\x00" not in value)
    env = {"MALLETRAIN_DAEMON_API_PORT": value, "MALLETRAIN_DAEMON_POLL_INTERVAL_S": value,
           "MALLETRAIN_PROFILER_ENABLED": value}
    try:
        config.load(config.DOCUMENTED_DEFAULTS, env=env)
    except ConfigError as exc:
        assert one_line(str(exc))


# ----- trace files ------------------------------------------------------------------------------
def refused_file(load, path: Path) -> InputFileError:
    with pytest.raises(InputFileError) as err:
        load(path)
    assert one_line(str(err.value)) and str(path) in str(err.value)
    return err.value


@FAST
@given(st.binary(max_size=400))
def test_idle_csv_garbage(tmp_path: Path, body: bytes) -> None:
    path = tmp_path / "t.csv"
    path.write_bytes(b"unix_time,node,idle\n" + body)
    try:
        trace = traces.read_idle_csv(path, use_cache=False)
    except InputFileError as exc:
        assert one_line(str(exc))
        return
    assert trace.node_names


@pytest.mark.parametrize("body, line", [
    (b"unix_time,node,idle\n1,a,1\n2,b,x\n", 3),
    (b"unix_time,node,idle\n1,a,1\n" + b"9" * 5000 + b",b,1\n", 3),
    (b"unix_time,node,idle\n5,a,1\n4,b,1\n", 3),
    (b"unix_time,node,idle\n1,,1\n", 2),
    (b"time,node\n", 1),
])
def test_idle_csv_errors_name_the_line(tmp_path: Path, body: bytes, line: int) -> None:
    path = tmp_path / "t.csv"
    path.write_bytes(body)
    assert refused_file(lambda p: traces.read_idle_csv(p, use_cache=False), path).line == line


def test_truncated_gzip_trace(tmp_path: Path) -> None:
    import gzip
    path = tmp_path / "t.csv.gz"
    rows = "".join(f"{t},n{t * 7919 % 1000},{t % 2}\n" for t in range(3000))
    data = gzip.compress(("unix_time,node,idle\n" + rows).encode())
    path.write_bytes(data[:len(data) // 2])
    refused_file(lambda p: traces.read_idle_csv(p, use_cache=False), path)


@FAST
@given(st.lists(st.lists(st.sampled_from(["1", "0", "-1", "nan", "inf", "-inf", "1e999", "x",
                                          "9" * 400, "2.5"]), min_size=1, max_size=18),
                max_size=6))
def test_swf_garbage(tmp_path: Path, rows: list[list[str]]) -> None:
    path = tmp_path / "log.swf"
    path.write_text("; header\n" + "\n".join(" ".join(r) for r in rows) + "\n")
    try:
        trace = sources.read_swf(path, machine_nodes=8, use_cache=False)
    except InputFileError as exc:
        assert one_line(str(exc))
        return
    assert trace.end >= trace.start


def test_swf_bad_line_is_named(tmp_path: Path) -> None:
    path = tmp_path / "log.swf"
    path.write_text("; x\n1 0 0 10 4 -1 -1 4 0\n2 zero 0 10 4 -1 -1 4 0\n")
    assert refused_file(lambda p: sources.read_swf(p, use_cache=False), path).line == 3


@pytest.mark.parametrize("cut", [0, 10, 60, 128, 200])
def test_truncated_fragments_npy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                 cut: int) -> None:
    import numpy as np
    target = tmp_path.joinpath(*sources.FRAGMENTS_FILE)
    target.parent.mkdir(parents=True)
    np.save(target, np.arange(1, 100, dtype=np.int64))
    target.write_bytes(target.read_bytes()[:cut])
    monkeypatch.setenv("MALLETRAIN_SHARED", str(tmp_path))
    with pytest.raises(InputFileError, match="cannot read the fragment lengths") as err:
        sources.synthetic(nodes=4, days=0.1)
    assert one_line(str(err.value))


def test_pickled_fragments_are_not_unpickled(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    import numpy as np
    target = tmp_path.joinpath(*sources.FRAGMENTS_FILE)
    target.parent.mkdir(parents=True)
    np.save(target, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    monkeypatch.setenv("MALLETRAIN_SHARED", str(tmp_path))
    with pytest.raises(InputFileError, match="cannot read the fragment lengths"):
        sources.synthetic(nodes=4, days=0.1)


# ----- the daemon's intake, through real sockets: nothing refused gets through ----------------
def settle(listener, want: int, timeout_s: float = 3.0) -> list:
    got: list = []
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        got += listener.drain()
        if len(got) >= want and sum(listener.dropped.values()) + len(got) >= want:
            time.sleep(0.05)
            got += listener.drain()
            break
        time.sleep(0.01)
    return got


HOSTILE_HOOKS = [b"", b"\xff" * 10, b"[" * 4000, b"x" * (protocol.MAX_DATAGRAM_BYTES + 100),
                 b'{"v": 9, "kind": "job_end", "src": "x", "t": 1, "job": "1"}',
                 b'{"v": 1, "kind": "job_end", "src": "x", "t": 1, "job": "1", '
                 b'"nodes": "n[1-99999999]"}',
                 b'{"v": 1, "kind": "nodes_free", "src": "x", "t": 1, "nodes": [1, 2]}',
                 b'{"v": 1, "kind": "job_end", "src": "x", "t": 1, "job": ""}']


def test_hook_intake_stores_nothing_hostile(tmp_path: Path) -> None:
    hook = HookListener(tmp_path / "hook.sock", allowed_uids={os.getuid()},
                        decode=protocol.decode)
    good = protocol.encode(VALID_HOOKS[0])
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            for data in [*HOSTILE_HOOKS, good]:
                s.sendto(data, str(hook.path))
        got = settle(hook, len(HOSTILE_HOOKS) + 1)
        assert got == [VALID_HOOKS[0]]
        assert hook.received == 1
        assert hook.dropped["malformed datagram"] == len(HOSTILE_HOOKS) - 1
        assert hook.dropped["oversized datagram"] == 1
    finally:
        hook.close()


def test_drop_counters_stay_bounded(tmp_path: Path) -> None:
    listener = ReportListener("127.0.0.1", 0, key_for=lambda job: None)
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            for i in range(200):
                report = reports.Report(job=f"job-{i}", epoch=0, seq=1, t=1.0, samples=1.0,
                                        world=1)
                s.sendto(reports.sign(report, KEY), listener.address)
        assert settle(listener, 200) == []
        assert sum(listener.dropped.values()) == 200
        assert len(listener.dropped) <= MAX_DROP_REASONS
    finally:
        listener.close()


def test_report_intake_stores_nothing_hostile() -> None:
    # Received at t = 10 on the daemon's clock, the time the good report also carries.
    listener = ReportListener("127.0.0.1", 0, key_for={"9": KEY}.get, clock=lambda: 10.0)
    good = reports.Report(job="9", epoch=1, seq=5, t=10.0, samples=64.0, world=2)
    signed = reports.sign(good, KEY)
    hostile = [signed[:40], signed + b"x" * reports.MAX_BYTES, b"MTR2" + signed[4:],
               reports.sign(good, b"f" * 32),
               reports.sign(reports.Report(job="other", epoch=1, seq=6, t=1.0, samples=1.0,
                                           world=1), KEY),
               signed.replace(b'"samples":64.0', b'"samples":1e9')]
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            for data in [*hostile, signed, signed]:  # the second copy is a replay
                s.sendto(data, listener.address)
        got = settle(listener, len(hostile) + 2)
        assert got == [good]
        assert sum(listener.dropped.values()) == len(hostile) + 1
        assert listener.dropped["replayed report"] == 1
    finally:
        listener.close()


# ----- job_submit.lua: elastic node ranges, through the same Lua harness as its own tests ----
def lua_range(lo: int, hi: int) -> tuple[int, dict[str, str], list[str]]:
    from test_job_submit_lua import LUA, run_lua, submission
    if LUA is None:
        pytest.skip("lua5.1 not installed (scripts/setup-machine.sh installs it)")
    return run_lua(submission(min_nodes=lo, max_nodes=hi))


NO_VAL, INFINITE = 4294967294, 4294967295


@pytest.mark.parametrize("spec, lo, hi, says", [
    ("4-1", 4, 1, "the minimum is above the maximum; write -N 1-4"),
    ("0-2", 0, 2, "at least one node; write -N 1-2"),
    ("1-99999", 1, 99999, "at most 1000 nodes on this cluster; write -N 1-1000"),
    ("0", 0, NO_VAL, "give the node range"),
    ("1-NO_VAL-1", 1, NO_VAL - 1, "at most 1000 nodes"),
    ("2^31-2^31", 2**31, 2**31, "at most 1000 nodes"),
])
def test_bad_ranges_are_refused_with_one_message(spec: str, lo: int, hi: int,
                                                 says: str) -> None:
    rc, fields, msgs = lua_range(lo, hi)
    assert rc != 0, spec
    assert len(msgs) == 1 and msgs[0].startswith("malletrain: ") and says in msgs[0]
    assert "admin_comment" not in fields and "array_inx" not in fields


@settings(max_examples=25, deadline=None)
@given(st.sampled_from([0, 1, 2, 999, 1000, 1001, 2**31, NO_VAL - 1, NO_VAL, INFINITE])
       | st.integers(0, 1100),
       st.sampled_from([0, 1, 1000, 1001, NO_VAL, INFINITE]) | st.integers(0, 1100))
def test_ranges_accepted_exactly_when_valid(lo: int, hi: int) -> None:
    rc, fields, msgs = lua_range(lo, hi)
    unset = {0, NO_VAL, INFINITE}
    top = lo if hi in unset else hi
    valid = lo not in unset and lo <= top <= 1000
    assert (rc == 0) == valid, (lo, hi, msgs)
    if valid:
        assert fields["admin_comment"] == f"malletrain:min={lo},max={top}"
        assert fields["array_inx"] == f"0-{top - 1}"
    else:
        assert len(msgs) == 1 and "admin_comment" not in fields
