"""Who may see and act on which job, tried as a second real user (``runuser``).

The daemon side runs in this (root) test process; the client side runs as ``mtuser1`` in a
child process, so the uid the daemon sees is the kernel's (SO_PEERCRED, SCM_CREDENTIALS) or
munged's, never a claim. Every refusal is asserted together with the matching success, so a
test cannot pass because nothing works at all.
"""

from __future__ import annotations

import functools
import grp
import json
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from malletrain_core.daemon.api import Dispatcher, TcpApiServer, UnixApiServer
from malletrain_core.daemon.epochs import EpochCoordinator
from malletrain_core.daemon.intake import HookListener, ReportListener
from malletrain_core.daemon.launchers import LauncherService
from malletrain_core.munge import PrivateMunged
from malletrain_core.wire import hooks as protocol
from malletrain_core.wire import reports
from malletrain_core.wire.api import ApiError
from malletrain_core.worker.client import TcpClient, UnixClient

pytestmark = pytest.mark.security

REPO = Path(__file__).resolve().parents[1]
USER = "mtuser1"
ROOT_JOB, USER_JOB = "55", "66"


@functools.cache
def _python_for(user: str) -> str | None:
    for python in (sys.executable, "/usr/bin/python3"):
        probe = subprocess.run(["runuser", "-u", user, "--", python, "-c",
                                "import malletrain_core.daemon.api"], capture_output=True, timeout=60,
                               env={"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(REPO)})
        if probe.returncode == 0:
            return python
    return None


@pytest.fixture(scope="module")
def second_user() -> pwd.struct_passwd:
    """A real non-root user (created with useradd when missing, and kept)."""
    if os.geteuid() != 0 or shutil.which("runuser") is None:
        pytest.skip("needs root and runuser to act as a second user")
    try:
        pwd.getpwnam(USER)
    except KeyError:
        proc = subprocess.run(["useradd", "-m", USER], capture_output=True, text=True,
                              check=False)
        if proc.returncode not in (0, 9):
            pytest.skip(f"cannot create user {USER}: {proc.stderr.strip()}")
    if _python_for(USER) is None:
        pytest.skip(f"no Python that {USER} can run with this checkout importable")
    return pwd.getpwnam(USER)


def as_user(user: str, code: str, *args: str) -> subprocess.CompletedProcess[str]:
    python = _python_for(user)
    assert python is not None
    return subprocess.run(["runuser", "-u", user, "--", python, "-c", code, *args],
                          capture_output=True, text=True, timeout=60, check=False,
                          env={"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(REPO)})


# The client program run as the second user: one call per argument, one JSON line per answer.
CLIENT = """
import json, sys
from malletrain_core.wire.api import ApiError
from malletrain_core.worker.client import TcpClient, UnixClient
from malletrain_core.munge import Munge
kind, where, calls = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
if kind == "unix":
    client = UnixClient(where, timeout_s=10)
else:
    host, port, sock = where.split(",")
    client = TcpClient(host, int(port), Munge(sock), timeout_s=10)
for op, args in calls:
    try:
        print(json.dumps({"ok": True, "result": client.call(op, **args)}))
    except ApiError as exc:
        print(json.dumps({"ok": False, "error": str(exc)}))
"""

CALLS = [["whoami", {}],
         ["checkin", {"job": ROOT_JOB, "node": "n1"}],
         ["checkin", {"job": USER_JOB, "node": "n1"}],
         ["drain", {"job": USER_JOB}]]


@pytest.fixture(scope="module")
def workdir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="mt-priv-"))
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def munged(workdir: Path) -> Iterator[PrivateMunged]:
    if shutil.which("munged") is None:
        pytest.skip("munge not installed")
    with PrivateMunged(workdir / "munge") as m:
        yield m


@pytest.fixture
def daemon_side(munged: PrivateMunged, second_user: pwd.struct_passwd
                ) -> tuple[Dispatcher, EpochCoordinator, list[str]]:
    """A dispatcher as malletraind builds it: the launcher service plus an admin-only op."""
    co = EpochCoordinator()
    for job, uid in ((ROOT_JOB, 0), (USER_JOB, second_user.pw_uid)):
        co.add_job(job, uid=uid, now=0.0)
        co.set_target(job, ["n1"], 0.0)
    m = munged.client()
    dispatcher = Dispatcher(admin_uids={0})
    LauncherService(co, lambda key, uid: m.encode(key, restrict_uid=uid),
                    report_addr="127.0.0.1:9", clock=lambda: 1.0).register(dispatcher)
    drained: list[str] = []
    dispatcher.register("whoami", lambda uid, args: {"uid": uid})
    dispatcher.register("drain", lambda uid, args: drained.append(args["job"]) or "drained",
                        admin=True)
    return dispatcher, co, drained


def run_client(user: str, kind: str, where: str, calls: list | None = None) -> list[dict]:
    out = as_user(user, CLIENT, kind, where, json.dumps(CALLS if calls is None else calls))
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in out.stdout.splitlines()]


def check_user_answers(answers: list[dict], uid: int, drained: list[str]) -> None:
    whoami, foreign, own, admin = answers
    assert whoami == {"ok": True, "result": {"uid": uid}}
    assert foreign["ok"] is False and f"belongs to uid 0, not to uid {uid}" in foreign["error"]
    assert own["ok"] is True and own["result"]["order"]["kind"] == "run" and own["result"]["key"]
    assert admin["ok"] is False and "administrator's operation" in admin["error"]
    assert drained == [], "a refused admin op must not run its handler"


# ----- the unix socket: the group decides who connects, SO_PEERCRED who may do what ----------
def test_unix_socket_without_group_refuses_other_users(workdir: Path, daemon_side) -> None:
    dispatcher, _, _ = daemon_side
    server = UnixApiServer(str(workdir / "api.sock"), dispatcher, idle_timeout_s=5)
    server.start()
    try:
        [answer] = run_client(USER, "unix", server.path, CALLS[:1])
        assert answer["ok"] is False and "Permission denied" in answer["error"]
        with UnixClient(server.path) as c:  # the daemon's own user still gets in
            assert c.call("whoami") == {"uid": 0}
    finally:
        server.close()


def test_unix_socket_group_member_acts_only_on_own_job(workdir: Path, daemon_side,
                                                      second_user: pwd.struct_passwd) -> None:
    dispatcher, _, drained = daemon_side
    server = UnixApiServer(str(workdir / "api.sock"), dispatcher, idle_timeout_s=5,
                           group=second_user.pw_gid)
    server.start()
    try:
        check_user_answers(run_client(USER, "unix", server.path), second_user.pw_uid, drained)
        [answer] = run_client("nobody", "unix", server.path, CALLS[:1])
        assert answer["ok"] is False and "Permission denied" in answer["error"], "not in group"
        with UnixClient(server.path) as c:
            assert c.call("drain", job=USER_JOB) == "drained"
            assert c.call("checkin", job=USER_JOB, node="n1")["order"]["kind"] == "run"
        assert drained == [USER_JOB]
    finally:
        server.close()


def test_unix_socket_user_sees_only_own_jobs(workdir: Path, second_user: pwd.struct_passwd
                                            ) -> None:
    import threading

    from malletrain_core.daemon.service import StatusService
    from malletrain_core.engine import Engine, EngineConfig
    from malletrain_core.events import IdleNode, JobRequest, JobSubmitted, NodesIdle
    from malletrain_core.model import Curve

    engine = Engine(EngineConfig())
    curve = Curve.of([1, 2], [10.0, 20.0])
    engine.handle_many([NodesIdle(0.0, tuple(IdleNode(f"n{i}", None, None) for i in (1, 2))),
                        JobSubmitted(0.0, JobRequest(ROOT_JOB, 1, 1, "root", "", curve)),
                        JobSubmitted(0.0, JobRequest(USER_JOB, 1, 1, USER, "", curve))])

    class Holder:  # what the read-only ops read of a daemon
        lock = threading.RLock()
        clock = staticmethod(time.time)

    Holder.engine = engine  # type: ignore[attr-defined]
    dispatcher = Dispatcher(admin_uids={0})
    StatusService(Holder()).register(dispatcher)
    server = UnixApiServer(str(workdir / "api.sock"), dispatcher, idle_timeout_s=5,
                           group=second_user.pw_gid)
    server.start()
    try:
        jobs, nodes, foreign, own = run_client(USER, "unix", server.path, [
            ["jobs", {}], ["nodes", {}], ["profile", {"job": ROOT_JOB}],
            ["profile", {"job": USER_JOB}]])
        assert [j["job"] for j in jobs["result"]["jobs"]] == [USER_JOB]
        holders = sorted(n["job"] for n in nodes["result"]["nodes"])
        assert holders == ["", USER_JOB], "root's node is shown held, without its job"
        assert foreign["ok"] is False and "belongs to another user" in foreign["error"]
        assert own["ok"] is True and own["result"]["job"] == USER_JOB
        with UnixClient(server.path) as c:  # root sees both
            assert sorted(j["job"] for j in c.call("jobs")["jobs"]) == [ROOT_JOB, USER_JOB]
    finally:
        server.close()


# ----- TCP with munge: the credential decides ---------------------------------------------------
def test_tcp_user_acts_only_on_own_job(munged: PrivateMunged, daemon_side,
                                       second_user: pwd.struct_passwd) -> None:
    dispatcher, _, drained = daemon_side
    server = TcpApiServer(("127.0.0.1", 0), dispatcher, munged.client(), idle_timeout_s=5)
    server.start()
    try:
        where = f"127.0.0.1,{server.port},{munged.socket}"
        check_user_answers(run_client(USER, "tcp", where), second_user.pw_uid, drained)
        with TcpClient("127.0.0.1", server.port, munged.client()) as c:
            assert c.call("drain", job=ROOT_JOB) == "drained"
        assert drained == [ROOT_JOB]
        with pytest.raises(ApiError, match="administrator"):
            dispatch_as(dispatcher, second_user.pw_uid, "drain", job=ROOT_JOB)
    finally:
        server.close()


def dispatch_as(dispatcher: Dispatcher, uid: int, op: str, **args: object) -> object:
    reply = json.loads(dispatcher.dispatch(uid, json.dumps({"op": op, "args": args}).encode()))
    if not reply["ok"]:
        raise ApiError(reply["error"])
    return reply["result"]


# ----- reports: only the holder of a job's key can report for it ------------------------------
FORGER = """
import json, socket, sys
from malletrain_core.wire import reports
from malletrain_core.worker.client import TcpClient
from malletrain_core.munge import Munge
host, port, sock, report_port, own, other = sys.argv[1:7]
munge = Munge(sock)
reply = TcpClient(host, int(port), munge).call("checkin", job=own, node="n1")
key = bytes.fromhex(munge.decode(reply["key"]).payload)
with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
    for job, seq in ((other, 1), (own, 1)):
        r = reports.Report(job=job, epoch=0, seq=seq, t=1.0, samples=8.0, world=1)
        s.sendto(reports.sign(r, key), ("127.0.0.1", int(report_port)))
print("sent")
"""


def test_user_cannot_report_for_another_users_job(munged: PrivateMunged, daemon_side) -> None:
    dispatcher, co, _ = daemon_side
    server = TcpApiServer(("127.0.0.1", 0), dispatcher, munged.client(), idle_timeout_s=5)
    server.start()
    listener = ReportListener("127.0.0.1", 0, key_for=co.key)
    try:
        out = as_user(USER, FORGER, "127.0.0.1", str(server.port), munged.socket,
                      str(listener.address[1]), USER_JOB, ROOT_JOB)
        assert out.returncode == 0, out.stderr
        got: list[reports.Report] = []
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline and sum(listener.dropped.values()) + len(got) < 2:
            got += listener.drain()
            time.sleep(0.02)
        assert [r.job for r in got] == [USER_JOB], "the user's own report arrives"
        assert listener.dropped == {"bad signature on a report": 1}
    finally:
        listener.close()
        server.close()


# ----- the hook socket: SlurmUser's group may send; the kernel's uid is checked as well -------
SENDER = """
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
try:
    s.sendto(sys.argv[2].encode(), sys.argv[1])
    print("sent")
except PermissionError:
    print("denied")
"""


def test_users_cannot_send_hook_datagrams(workdir: Path, second_user: pwd.struct_passwd) -> None:
    good = protocol.encode(protocol.JobEnd(src="epilog", t=1.0, job=USER_JOB))
    hook = HookListener(workdir / "hook.sock", allowed_uids={0}, decode=protocol.decode,
                        group="slurm" if _group_exists("slurm") else None)
    try:
        assert as_user(USER, SENDER, str(hook.path), good.decode()).stdout.strip() == "denied"
    finally:
        hook.close()
    # Even through a socket opened to everyone by mistake, the kernel-reported uid is checked.
    hook = HookListener(workdir / "hook.sock", allowed_uids={0}, decode=protocol.decode,
                        mode=0o622)
    try:
        assert as_user(USER, SENDER, str(hook.path), good.decode()).stdout.strip() == "sent"
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.sendto(good, str(hook.path))
        got: list[object] = []
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline and len(got) + sum(hook.dropped.values()) < 2:
            got += hook.drain()
            time.sleep(0.02)
        assert got == [protocol.decode(good)], "root's datagram is heard"
        assert hook.dropped == {"sender not allowed": 1}
    finally:
        hook.close()


def _group_exists(name: str) -> bool:
    try:
        grp.getgrnam(name)
        return True
    except KeyError:
        return False
