"""The read-only API ops over a real unix socket: answers, refusals, and the daemon's lock."""

from __future__ import annotations

import threading
import time

import pytest
from cli_daemon import T0, build, serving

from malletrain_core.daemon.service import StatusService
from malletrain_core.engine import Engine, EngineConfig
from malletrain_core.engine.router import Router
from malletrain_core.events import IdleNode, NodesIdle
from malletrain_core.wire.api import ApiError
from malletrain_core.worker.client import UnixClient


@pytest.fixture
def api(tmp_path):
    daemon, backend, clock = build(tmp_path / "state")
    sock = tmp_path / "api.sock"
    with serving(daemon, sock), UnixClient(str(sock), timeout_s=10) as client:
        yield daemon, client


def test_ops_answer_plain_json(api):
    daemon, client = api
    status = client.call("status")
    assert status["backend"] == "scripted" and status["now"] == T0 + 60
    assert status["daemon"]["cycles"] == 2 and status["engine"]["admitted"] == 2
    jobs = client.call("jobs")["jobs"]
    assert [(j["job"], j["state"], j["nodes"]) for j in jobs] == [
        ("101", "running", 4), ("102", "running", 3), ("103", "queued", 0)]
    assert client.call("jobs", state="running", user="alice")["jobs"][0]["job"] == "101"
    nodes = client.call("nodes")["nodes"]
    assert [n["node"] for n in nodes] == [f"n0{i}" for i in range(1, 9)]
    assert nodes[4] == {"node": "n05", "state": "free", "job": "", "hole_end": T0 + 5 * 3600,
                        "trainer": ""}
    profile = client.call("profile", job=101)  # a number is taken as the id
    assert profile["measured"] == [[4, 390.0]] and profile["table"][0] == [1, 97.5]


@pytest.mark.parametrize("op, args, message", [
    ("jobs", {"state": "sleeping"}, "unknown job state 'sleeping'; use one of queued, "
                                    "profiling, running, done"),
    ("jobs", {"user": 7}, "jobs: 'user' must be a user name"),
    ("profile", {}, 'profile needs a job id: {"job": "123"}'),
    ("profile", {"job": "404"}, "job 404 is not known to malletraind"),
])
def test_refusals_are_one_line(api, op, args, message):
    with pytest.raises(ApiError) as err:
        api[1].call(op, **args)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_handlers_wait_for_the_daemon_lock(api):
    daemon, client = api
    answers: list[object] = []
    with daemon.lock:  # a cycle in progress
        caller = threading.Thread(target=lambda: answers.append(client.call("nodes")))
        caller.start()
        time.sleep(0.3)
        assert answers == []
    caller.join(10)
    assert len(answers) == 1


def test_a_router_of_engines_is_read_as_one(tmp_path):
    engines = {"a": Engine(EngineConfig()), "b": Engine(EngineConfig())}
    router = Router(engines, node_owner=lambda n: "a" if n < "n05" else "b",
                    job_owner=lambda req: "a")
    router.handle_many([NodesIdle(T0, (IdleNode("n01", T0 + 60, None),
                                       IdleNode("n09", None, None)))])

    class Holder:
        engine = router
        lock = threading.RLock()
        counters = None
        clock = staticmethod(time.time)

    nodes = StatusService(Holder()).nodes(0, {})["nodes"]
    assert nodes == [{"node": "n01", "state": "free", "job": "", "hole_end": T0 + 60,
                      "trainer": "a"},
                     {"node": "n09", "state": "free", "job": "", "hole_end": None,
                      "trainer": "b"}]


@pytest.fixture
def users(monkeypatch):
    """uids 1001 and 1002 are alice and bob (the account database is the boundary mocked)."""
    import pwd
    names = {1001: "alice", 1002: "bob"}

    def getpwuid(uid):
        if uid not in names:
            raise KeyError(uid)
        return pwd.struct_passwd((names[uid], "x", uid, uid, "", "/", "/bin/sh"))
    monkeypatch.setattr("malletrain_core.daemon.service.pwd.getpwuid", getpwuid)


def test_a_user_sees_only_their_own_jobs(tmp_path, users):
    daemon, _backend, _clock = build(tmp_path / "state")
    service = StatusService(daemon, admin_uids={0})
    assert [j["job"] for j in service.jobs(1001, {})["jobs"]] == ["101"]
    assert [j["job"] for j in service.jobs(1002, {})["jobs"]] == ["102"]
    assert service.jobs(1002, {"user": "alice"})["jobs"] == []  # a filter cannot widen it
    assert service.jobs(4242, {})["jobs"] == []  # no account: no job
    assert [j["job"] for j in service.jobs(0, {})["jobs"]] == ["101", "102", "103"]
    holders = {n["node"]: n["job"] for n in service.nodes(1001, {})["nodes"]}
    assert set(holders.values()) == {"101", ""}  # bob's nodes are held, not named
    assert sum(1 for n in service.nodes(1001, {})["nodes"] if n["state"] == "held") == 7
    assert {n["job"] for n in service.nodes(0, {})["nodes"]} == {"101", "102", ""}
    assert service.profile(1001, {"job": "101"})["job"] == "101"
    with pytest.raises(ApiError, match="belongs to another user"):
        service.profile(1002, {"job": "101"})
    with pytest.raises(ApiError, match="not known"):  # unknown stays unknown, for anyone
        service.profile(1002, {"job": "404"})
    assert service.status(1002, {})["jobs"]["running"] == 2  # counts are public


def test_the_dispatchers_admins_see_every_job(tmp_path, users):
    from malletrain_core.daemon.api import Dispatcher
    daemon, _backend, _clock = build(tmp_path / "state")
    service = StatusService(daemon)
    service.register(Dispatcher(admin_uids={0, 1002}))
    assert len(service.jobs(1002, {})["jobs"]) == 3
    assert [j["job"] for j in service.jobs(1001, {})["jobs"]] == ["101"]
