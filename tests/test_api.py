"""The daemon API: framing, SO_PEERCRED over the unix socket, munge over TCP, launcher ops."""

from __future__ import annotations

import functools
import json
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from malletrain_core.daemon.api import Dispatcher, TcpApiServer, UnixApiServer
from malletrain_core.daemon.epochs import EpochCoordinator
from malletrain_core.daemon.launchers import LauncherService
from malletrain_core.errors import ValidationError
from malletrain_core.munge import PrivateMunged
from malletrain_core.wire.api import (
    AUTH_PAYLOAD,
    MAX_LINE_BYTES,
    ApiError,
    ApiUnavailable,
    parse_address,
)
from malletrain_core.worker.client import TcpClient, UnixClient

REPO = Path(__file__).resolve().parents[1]
needs_munge = pytest.mark.skipif(shutil.which("munged") is None, reason="munge not installed")


@functools.cache
def _nobody_python() -> tuple[int, str] | None:
    """(uid of nobody, a Python it can run) when we are root and can act as it; else None."""
    if os.getuid() != 0 or shutil.which("runuser") is None:
        return None
    try:
        uid = pwd.getpwnam("nobody").pw_uid
    except KeyError:
        return None
    for python in (sys.executable, "/usr/bin/python3"):
        probe = subprocess.run(["runuser", "-u", "nobody", "--", python, "-c", "import json"],
                               capture_output=True, timeout=30,
                               env={"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(REPO)})
        if probe.returncode == 0:
            return uid, python
    return None


def nobody() -> int | None:
    found = _nobody_python()
    return None if found is None else found[0]


def as_nobody(code: str, *args: str, input: str | None = None) -> subprocess.CompletedProcess:
    """Run Python ``code`` as user nobody, with this checkout importable."""
    found = _nobody_python()
    assert found is not None
    return subprocess.run(["runuser", "-u", "nobody", "--", found[1], "-c", code, *args],
                          input=input, capture_output=True, text=True, timeout=30,
                          env={"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(REPO)})


def make_dispatcher() -> Dispatcher:
    d = Dispatcher()
    d.register("whoami", lambda uid, args: {"uid": uid})
    d.register("echo", lambda uid, args: args)
    d.register("refuse", lambda uid, args: (_ for _ in ()).throw(
        ValidationError("job 3", "nodes", "must be ≥ 1\nsecond line")))
    d.register("crash", lambda uid, args: 1 / 0)
    d.register("unjsonable", lambda uid, args: {"x": object()})
    return d


@pytest.fixture(scope="module")
def tmpdir_short():
    d = tempfile.mkdtemp(prefix="mt-api-")
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def munged(tmpdir_short):
    if shutil.which("munged") is None:
        pytest.skip("munge not installed")
    with PrivateMunged(Path(tmpdir_short) / "munge") as m:
        yield m


@pytest.fixture
def unix_server(tmpdir_short):
    # mode 0o666: any local user may connect, so that the peer-uid test can run as nobody
    server = UnixApiServer(str(Path(tmpdir_short) / "api.sock"), make_dispatcher(),
                           mode=0o666, idle_timeout_s=5)
    server.start()
    yield server
    server.close()


@pytest.fixture
def tcp_server(munged):
    server = TcpApiServer(("127.0.0.1", 0), make_dispatcher(), munged.client(), idle_timeout_s=5)
    server.start()
    yield server
    server.close()


def raw(sock_or_addr, *lines: bytes) -> list[dict]:
    """Send raw lines on a fresh connection and read every reply line until EOF."""
    if isinstance(sock_or_addr, str):
        s = socket.socket(socket.AF_UNIX)
        s.connect(sock_or_addr)
    else:
        s = socket.create_connection(sock_or_addr)
    s.settimeout(5)
    try:
        for line in lines:
            s.sendall(line)
        s.shutdown(socket.SHUT_WR)
    except BrokenPipeError:
        pass  # the server closed the connection (after an oversized line): read its answer
    data = b""
    while chunk := s.recv(65536):
        data += chunk
    s.close()
    return [json.loads(x) for x in data.splitlines()]


# ----- framing --------------------------------------------------------------------------------
@pytest.mark.parametrize("line, fragment", [
    (b"{not json", "malformed request"),
    (b"\xff\xfe", "malformed request"),
    (b"[1, 2]", "expected"),
    (b'{"op": 3}', "expected"),
    (b'{"op": "echo", "args": [1]}', "'args' must be a JSON object"),
    (b'{"op": "nope"}', "unknown op 'nope'; known ops: crash, echo"),
    (b'{"op": "refuse"}', "job 3: nodes: must be ≥ 1 second line"),
    (b'{"op": "crash"}', "internal error in 'crash'"),
    (b'{"op": "unjsonable"}', "internal error in 'unjsonable'"),
])
def test_dispatcher_answers_bad_requests_with_one_line(line, fragment):
    reply = make_dispatcher().dispatch(0, line)
    assert reply.endswith(b"\n") and reply.count(b"\n") == 1
    body = json.loads(reply)
    assert body["ok"] is False and fragment in body["error"]


def test_dispatcher_passes_the_uid_and_args():
    reply = json.loads(make_dispatcher().dispatch(42, b'{"op": "whoami"}'))
    assert reply == {"v": 1, "ok": True, "result": {"uid": 42}}


# ----- unix socket ------------------------------------------------------------------------------
def test_unix_peer_uid_is_ours(unix_server):
    with UnixClient(unix_server.path) as c:
        assert c.call("whoami") == {"uid": os.getuid()}
        assert c.call("echo", a=1, b=[2]) == {"a": 1, "b": [2]}
        with pytest.raises(ApiError, match="must be ≥ 1"):
            c.call("refuse")
        assert c.call("whoami") == {"uid": os.getuid()}, "connection survives an error"


def test_unix_peer_uid_of_another_user(unix_server):
    uid = nobody()
    if uid is None:
        pytest.skip("needs root, runuser and a 'nobody' user")
    code = ("import sys; from malletrain_core.worker.client import UnixClient; "
            "print(UnixClient(sys.argv[1]).call('whoami')['uid'])")
    out = as_nobody(code, unix_server.path)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) == uid


def test_malformed_and_oversized_requests_do_not_stop_the_server(unix_server):
    replies = raw(unix_server.path, b"garbage\n", b'{"op": "whoami"}\n')
    assert replies[0]["ok"] is False and replies[1]["result"]["uid"] == os.getuid()
    replies = raw(unix_server.path, b"x" * (MAX_LINE_BYTES + 10) + b"\n", b'{"op":"whoami"}\n')
    assert len(replies) == 1 and "exceeds" in replies[0]["error"]
    with UnixClient(unix_server.path) as c:
        assert c.call("whoami")["uid"] == os.getuid()


def test_a_client_that_sends_far_too_much_still_reads_the_refusal(unix_server):
    # The server closes after an oversized line; with bytes of it still unread, a plain close
    # makes the kernel reset the connection and the refusal is lost. Repeat: it was a race.
    for size in (MAX_LINE_BYTES + 10, 4 * MAX_LINE_BYTES, 12 * MAX_LINE_BYTES):
        for _ in range(10):
            [reply] = raw(unix_server.path, b"y" * size + b"\n")
            assert "exceeds" in reply["error"]
    with UnixClient(unix_server.path) as c:
        with pytest.raises(ApiError, match="over the daemon's limit"):
            c.call("whoami", blob="z" * MAX_LINE_BYTES)
        assert c.call("whoami")["uid"] == os.getuid()


def test_client_reconnects_after_the_server_dropped_it(unix_server):
    c = UnixClient(unix_server.path)
    assert c.call("whoami")
    c._sock.shutdown(socket.SHUT_RDWR)  # as if the daemon restarted
    assert c.call("whoami") == {"uid": os.getuid()}
    c.close()


def test_unreachable_daemon_is_one_line(tmp_path):
    with pytest.raises(ApiUnavailable, match="is malletraind running"):
        UnixClient(str(tmp_path / "none.sock")).call("whoami")
    with pytest.raises(ApiError, match="HOST:PORT"):
        parse_address("head01:notaport")
    assert parse_address("head01") == ("head01", 7817)
    assert parse_address("[::1]:99") == ("::1", 99)


# ----- TCP + munge ------------------------------------------------------------------------------
@needs_munge
def test_tcp_munge_authenticates_the_uid(tcp_server, munged):
    with TcpClient("127.0.0.1", tcp_server.port, munged.client()) as c:
        assert c.call("whoami") == {"uid": os.getuid()}
        assert c.uid == os.getuid()


@needs_munge
def test_tcp_uid_of_another_user(tcp_server, munged):
    uid = nobody()
    if uid is None:
        pytest.skip("needs root, runuser and a 'nobody' user")
    code = ("import sys; from malletrain_core.worker.client import TcpClient; "
            "from malletrain_core.munge import Munge; "
            "print(TcpClient('127.0.0.1', int(sys.argv[1]), Munge(sys.argv[2])).call('whoami')"
            "['uid'])")
    out = as_nobody(code, str(tcp_server.port), munged.socket)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) == uid


@needs_munge
def test_tcp_refuses_forged_replayed_and_foreign_credentials(tcp_server, munged, tmpdir_short):
    addr = ("127.0.0.1", tcp_server.port)
    request = b'{"op": "whoami"}\n'

    def hello(cred: str) -> bytes:
        return json.dumps({"auth": "munge", "credential": cred}).encode() + b"\n"

    # no authentication at all: a request as the first line
    [r] = raw(addr, request)
    assert "authenticate first" in r["error"]
    [r] = raw(addr, b"\x00\x01garbage\n")
    assert "authenticate first" in r["error"]
    [r] = raw(addr, hello("MUNGE:forged:"), request)
    assert r["ok"] is False and "refused" in r["error"]
    good = munged.client().encode(AUTH_PAYLOAD)
    first = raw(addr, hello(good), request)
    assert first[1]["result"]["uid"] == os.getuid()
    [r] = raw(addr, hello(good), request)
    assert "replayed" in r["error"]
    [r] = raw(addr, hello(munged.client().encode("something else")), request)
    assert "not made for the MalleTrain API" in r["error"]
    with PrivateMunged(Path(tmpdir_short) / "other") as other:
        foreign = other.client().encode(AUTH_PAYLOAD)
    [r] = raw(addr, hello(foreign), request)
    assert "refused" in r["error"]
    with TcpClient(*addr, munged.client()) as c:
        assert c.call("whoami")["uid"] == os.getuid(), "the server is still serving"


# ----- the launcher service ---------------------------------------------------------------------
class Clock:
    t = 100.0

    def __call__(self):
        return self.t


def service(munged, owner: int):
    co = EpochCoordinator()
    co.add_job("55", uid=owner, now=0.0)
    co.set_target("55", ["n1"], 0.0)
    m = munged.client()
    svc = LauncherService(co, lambda key, uid: m.encode(key, restrict_uid=uid),
                          report_addr="127.0.0.1:9", clock=Clock())
    return co, svc, m


@needs_munge
def test_checkin_gives_the_owner_a_run_order_and_a_wrapped_key(munged):
    co, svc, m = service(munged, owner=os.getuid())
    reply = svc.checkin(os.getuid(), {"job": "55", "node": "n1", "addr": "127.0.0.1"})
    assert reply["order"]["kind"] == "run" and reply["order"]["world"] == 1
    assert reply["report_addr"] == "127.0.0.1:9"
    assert m.decode(reply["key"]).payload == co.key("55").hex()
    # while running, no key is handed out again
    again = svc.checkin(os.getuid(), {"job": "55", "node": "n1", "epoch": 0, "state": "running"})
    assert again["order"]["kind"] == "run" and "key" not in again
    assert svc.checkin(os.getuid(), {"job": "99", "node": "n1"})["order"]["kind"] == "wait"
    with pytest.raises(ApiError, match="checkin needs"):
        svc.checkin(os.getuid(), {"job": "55"})


@needs_munge
def test_checkin_refuses_other_users_and_wraps_for_the_owner_only(munged):
    uid = nobody()
    if uid is None:
        pytest.skip("needs root, runuser and a 'nobody' user")
    co, svc, m = service(munged, owner=uid)
    with pytest.raises(ApiError, match=f"belongs to uid {uid}"):
        svc.checkin(12345, {"job": "55", "node": "n1"})
    reply = svc.checkin(uid, {"job": "55", "node": "n1"})
    with pytest.raises(Exception, match="another user"):
        m.decode(reply["key"])  # root cannot read the key meant for the job's user
    code = ("import sys; from malletrain_core.munge import Munge; "
            "print(Munge(sys.argv[1]).decode(sys.stdin.readline()).payload)")
    out = as_nobody(code, munged.socket, input=reply["key"] + "\n")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == co.key("55").hex()


# ----- a handler that holds its reply sees its caller go ------------------------------------
def test_a_holding_handler_sees_its_caller_close_but_not_a_caller_that_waits(tmpdir_short):
    """``caller_gone``: what a held check-in uses to learn that its launcher was killed. A client
    that waits is not gone; one that closed (or was killed) is, within the handler's next look;
    the server's own shutdown of its connections is not taken for the client's."""
    import threading
    import time

    from malletrain_core.daemon.api import caller_gone

    seen: dict[str, list[bool]] = {"wait": [], "close": [], "shutdown": []}
    started = {k: threading.Event() for k in seen}

    def hold(uid, args):
        key = args["key"]
        started[key].set()
        deadline = time.monotonic() + args["hold_s"]
        while time.monotonic() < deadline:
            seen[key].append(caller_gone())
            if seen[key][-1]:
                break
            time.sleep(0.02)
        return {"gone": seen[key][-1]}

    d = Dispatcher()
    d.register("hold", hold)
    path = str(Path(tmpdir_short) / "hold.sock")
    server = UnixApiServer(path, d, mode=0o600, idle_timeout_s=30)
    server.start()
    try:
        # a client that waits for its reply: never gone
        assert not caller_gone(), "outside a request: False"
        assert UnixClient(path).call("hold", key="wait", hold_s=0.5) == {"gone": False}
        assert seen["wait"] and not any(seen["wait"])
        # a client that closes while the reply is held: gone within a look
        s = socket.socket(socket.AF_UNIX)
        s.connect(path)
        s.sendall(b'{"op": "hold", "args": {"key": "close", "hold_s": 10}}\n')
        assert started["close"].wait(5)
        t_close = time.monotonic()
        s.close()
        deadline = time.monotonic() + 5
        while not (seen["close"] and seen["close"][-1]) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert seen["close"][-1] is True and time.monotonic() - t_close < 1.0
        # the server closing its connections: not the client's doing
        s = socket.socket(socket.AF_UNIX)
        s.connect(path)
        s.sendall(b'{"op": "hold", "args": {"key": "shutdown", "hold_s": 1.0}}\n')
        assert started["shutdown"].wait(5)
    finally:
        server.close()
    time.sleep(1.2)
    assert seen["shutdown"] and not any(seen["shutdown"])
    s.close()
