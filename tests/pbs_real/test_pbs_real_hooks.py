"""MalleTrain's hooks on the real server: installed by ``pbs_hooks/install.sh`` through qmgr
(the session fixture), run by pbs_server's embedded Python, their datagrams received on a unix
socket outside the server's network namespace, and harmless when nobody listens."""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
from conftest import HOOK_FREQ_S

from devtools.localcluster.pbs import PbsComplex
from devtools.localcluster.pbs_helpers import (
    fill,
    job,
    server_log,
    state,
    subjob,
    submit,
    wait_state,
)
from malletrain_core.wire.hooks import HookSocket

HOOKS = {"mt_queuejob": ("queuejob", 10), "mt_periodic": ("periodic", 20),
         "mt_modifyvnode": ("modifyvnode", 5), "mt_jobobit": ("jobobit", 5),
         "mt_postqueuejob": ("postqueuejob", 5), "mt_modifyjob": ("modifyjob,movejob", 5),
         "mt_epilogue": ("execjob_preterm,execjob_epilogue", 10)}


@pytest.fixture
def listener(pbs: PbsComplex) -> Iterator[HookSocket]:
    """The daemon's side of the hook socket, bound where install.sh pointed the hooks."""
    lst = HookSocket(pbs.hook_socket).bind()
    try:
        yield lst
    finally:
        assert lst.sock is not None
        lst.sock.close()
        pbs.hook_socket.unlink(missing_ok=True)


def datagrams(lst: HookSocket, want: Callable[[dict], bool], timeout_s: float) -> list[dict]:
    """Datagrams received until one that ``want`` accepts (returned last) or the timeout."""
    got: list[dict] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            raw, _pid, uid, _gid = lst.receive_raw(timeout_s=deadline - time.monotonic())
        except socket.timeout:
            break
        msg = json.loads(raw)
        msg["_uid"] = uid
        got.append(msg)
        if want(msg):
            return got
    raise AssertionError(f"no matching datagram within {timeout_s:g} s; got {got}")


def drain(lst: HookSocket) -> None:
    while True:
        try:
            lst.receive_raw(timeout_s=0)
        except (BlockingIOError, socket.timeout):
            return


def hook_failures(cx: PbsComplex) -> list[str]:
    """Server log lines where a MalleTrain hook failed or PBS gave up on a hook."""
    return [ln for ln in server_log(cx).splitlines()
            if ("malletrain:" in ln and ("failed" in ln or "cannot send" in ln))
            or ("mt_" in ln and ("alarm" in ln.lower() or "exception" in ln.lower()))]


def test_install_sh_created_the_hooks_in_the_server(pbs: PbsComplex) -> None:
    for name, (event, alarm) in HOOKS.items():
        text = pbs.run(["qmgr", "-c", f"list hook {name}"]).stdout
        attrs = dict(ln.strip().split(" = ", 1) for ln in text.splitlines() if " = " in ln)
        assert set(attrs["event"].split(",")) == set(event.split(",")), text
        assert attrs["alarm"] == str(alarm), text
        assert attrs["enabled"] == "true" and attrs["order"] == "1", text
        assert attrs["fail_action"] == "none", text
    periodic = pbs.run(["qmgr", "-c", "list hook mt_periodic"]).stdout
    assert f"freq = {HOOK_FREQ_S}" in periodic
    # Idempotent: a second install changes nothing that qmgr shows.
    before = pbs.run(["qmgr", "-c", "list hook"]).stdout
    pbs.install_malletrain(freq_s=HOOK_FREQ_S)
    assert pbs.run(["qmgr", "-c", "list hook"]).stdout == before


def test_queuejob_routes_an_elastic_job_and_refuses_a_bad_one(pbs: PbsComplex,
                                                             test_user: str) -> None:
    mark = len(server_log(pbs))
    array = submit(pbs, test_user, "-q", "malletrain", "-J", "1-4", "-l", "select=1:ncpus=2",
                   "-v", "MALLETRAIN_MIN_NODES=2")
    attrs = job(pbs, array)
    assert attrs["queue"] == "mt_preemptable"
    assert attrs["Resource_List"]["place"] == "excl"  # type: ignore[index]
    assert attrs["Rerunable"] == "True"
    env = attrs["Variable_List"]
    assert env["MALLETRAIN_MIN_NODES"] == 2 and env["MALLETRAIN_MAX_NODES"] == 4  # type: ignore[index]
    # Not started: the queue is stopped, so only MalleTrain starts its workers.
    time.sleep(2)
    assert job(pbs, subjob(array, 1))["job_state"] == "Q"
    res = pbs.run(["qsub", "-q", "malletrain", "-l", "select=1:ncpus=2", "-o", "/dev/null"],
                  user=test_user, input="true\n", check=False)
    assert res.returncode != 0
    assert "MalleTrain: no -J range given" in res.stderr, res.stderr
    res = pbs.run(["qsub", "-q", "mt_preemptable", "-J", "1-2", "-o", "/dev/null"],
                  user=test_user, input="true\n", check=False)
    assert res.returncode != 0 and "submit with -q malletrain" in res.stderr, res.stderr
    assert hook_failures(pbs) == [] or all(
        server_log(pbs).find(ln) < mark for ln in hook_failures(pbs))


def test_hint_hooks_reach_the_listener(pbs: PbsComplex, test_user: str,
                                       listener: HookSocket) -> None:
    mark = len(server_log(pbs))
    free = datagrams(listener, lambda m: m["kind"] == "nodes_free", HOOK_FREQ_S + 5)[-1]
    assert free["src"] == "pbs-periodic" and free["nodes"] == pbs.node_names
    assert free["_uid"] == 0  # sent by pbs_server (root) from its own network namespace
    array = submit(pbs, test_user, "-q", "malletrain", "-J", "1-2", "-l", "select=1:ncpus=2")
    worker = subjob(array, 1)
    drain(listener)
    pbs.run(["qrun", "-H", "(n03)", worker])
    change = datagrams(listener, lambda m: m["kind"] == "node_change", 5)[-1]
    assert change == {**change, "src": "pbs-modifyvnode", "node": "n03",
                      "state": "job-exclusive"}
    wait_state(pbs, worker, "R")
    t0 = time.monotonic()
    pbs.run(["qdel", worker])
    end = datagrams(listener, lambda m: m["kind"] == "job_end", 30)[-1]
    print(f"jobobit datagram {time.monotonic() - t0:.2f} s after qdel")
    assert end["job"] == worker and end["nodes"] == "n03" and end["user"] == test_user
    # Killed, not requeued: qdel sends SIGTERM, then SIGKILL after the queue's kill_delay.
    # Seen on this server: the shell killed by SIGTERM (0:15), exiting with its sleep's
    # 128 + 15 (143:0), and, on a loaded machine, the SIGKILL round (0:9).
    assert end["exit"] in ("0:15", "143:0", "0:9", "137:0") and end["requeued"] is False
    assert end["partition"] == "mt_preemptable"
    drain(listener)
    pbs.qmgr("set node n05 state = offline")
    off = datagrams(listener, lambda m: m["kind"] == "node_change" and m["node"] == "n05", 5)
    assert off[-1]["state"] == "offline"
    new = server_log(pbs)[mark:]
    assert not [ln for ln in new.splitlines() if "malletrain:" in ln and "failed" in ln], new


def test_jobobit_of_a_preempted_worker_says_requeued(pbs: PbsComplex, test_user: str,
                                                     listener: HookSocket) -> None:
    array = fill(pbs, test_user)
    drain(listener)
    t0 = time.monotonic()
    prod = submit(pbs, test_user, "-q", "prod", "-l", "select=1:ncpus=2")
    end = datagrams(listener, lambda m: m["kind"] == "job_end", 30)[-1]
    hint_s = time.monotonic() - t0
    wait_state(pbs, prod, "R", 30)
    print(f"preempted worker's jobobit {hint_s:.2f} s after the prod qsub; prod running "
          f"{time.monotonic() - t0:.2f} s after it")
    assert end["requeued"] is True and end["exit"] == "-11:0", end
    assert end["job"].startswith(array.split("[")[0] + "[")
    # The requeued subjob is back in the stopped queue, queued: only MalleTrain restarts it.
    back = job(pbs, end["job"])
    print({k: back.get(k) for k in ("job_state", "substate", "run_count", "Exit_status",
                                    "Hold_Types", "exec_vnode", "comment")})
    assert back["job_state"] == "Q" and back["queue"] == "mt_preemptable", back


def test_a_worker_whose_launcher_was_killed_goes_back_to_its_queue(pbs: PbsComplex,
                                                                   test_user: str) -> None:
    """A running worker subjob whose batch script is SIGKILLed (as a killed launcher is: the
    script execs it) ends with Exit_status 137, a signal PBS did not send: mt_epilogue puts it
    back in the stopped queue (queued, 1.5 s after the kill here) instead of letting it end
    for good, so the job keeps its range. A qdel (PBS's own SIGTERM) ends its subjob as
    before, whether its shell dies of it (271, here) or exits 143 (seen in CI, where the
    epilogue then took it for a kill and requeued the subjob; the launcher, which catches
    SIGTERM, always exits 143)."""
    array = submit(pbs, test_user, "-q", "malletrain", "-J", "1-2", "-l", "select=1:ncpus=2")
    worker, other = subjob(array, 1), subjob(array, 2)
    pbs.run(["qrun", "-H", "(n02)", worker])
    pbs.run(["qrun", "-H", "(n03)", other])
    wait_state(pbs, worker, "R")
    wait_state(pbs, other, "R")

    def script_pid() -> int | None:
        for proc in psutil.process_iter(["username", "cmdline"]):
            cmd = " ".join(proc.info["cmdline"] or [])
            if proc.info["username"] == test_user and f"{worker}.SC" in cmd:
                return int(proc.pid)
        return None
    pbs.wait_for(f"{worker}'s batch script", lambda: script_pid() is not None, 30,
                 interval_s=0.1)
    pid = script_pid()
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    t0 = time.monotonic()
    pbs.wait_for(f"{worker} back in its queue", lambda: state(pbs, worker) == "Q", 30,
                 interval_s=0.1)
    print(f"{worker} queued again {time.monotonic() - t0:.2f} s after its script was killed")
    back = job(pbs, worker)
    # -18: PBS's own requeue code, which mt_jobobit reports as requeued (a preemption's way)
    assert back["queue"] == "mt_preemptable" and back["Exit_status"] == -18, back
    assert "requeued, so that the job keeps its subjob" in "\n".join(
        p.read_text(errors="replace") for p in pbs.root.glob("mom-n02/mom_logs/*"))
    pbs.run(["qdel", other])
    wait_state(pbs, other, "X", 30)  # PBS's own kill: the subjob ends as before
    print(f"{other} ended by qdel with Exit_status {job(pbs, other).get('Exit_status')}")
    pbs.run(["qdel", array])


@pytest.mark.parametrize("socket_state", ["absent", "stale"])
def test_hooks_never_fail_or_block_pbs_when_nobody_listens(pbs: PbsComplex, test_user: str,
                                                           socket_state: str) -> None:
    """No socket, or a socket file nobody reads: submissions, runs and ends go on at once,
    and the server logs no hook failure (the hooks drop the datagram quietly)."""
    path: Path = pbs.hook_socket
    path.unlink(missing_ok=True)
    if socket_state == "stale":
        HookSocket(path).bind().sock.close()  # type: ignore[union-attr]
    mark = len(server_log(pbs))
    t0 = time.monotonic()
    array = submit(pbs, test_user, "-q", "malletrain", "-J", "1-2", "-l", "select=1:ncpus=2")
    qsub_s = time.monotonic() - t0
    worker = subjob(array, 1)
    pbs.run(["qrun", "-H", "(n02)", worker])
    wait_state(pbs, worker, "R")
    pbs.run(["qdel", worker])
    wait_state(pbs, worker, "X", 30)  # a subjob that ended is "expired"
    time.sleep(HOOK_FREQ_S + 1)  # at least one periodic run
    path.unlink(missing_ok=True)
    new = server_log(pbs)[mark:]
    assert qsub_s < 2.0, qsub_s
    assert not [ln for ln in new.splitlines() if "malletrain:" in ln], new
    assert "mt_periodic" not in new or "alarm" not in new


SITE_HOOK = '''import pbs
e = pbs.event()
j = e.job
if str(j.Job_Name).startswith("bad"):
    e.reject("site policy: job names may not start with 'bad'")
pbs.logmsg(pbs.LOG_DEBUG, "site_tag saw queue=%s" % (j.queue.name if j.queue else ""))
j.Account_Name = "site-tagged"
e.accept()
'''


def test_a_site_queuejob_hook_runs_beside_malletrains(pbs: PbsComplex, test_user: str,
                                                     tmp_path: Path) -> None:
    """A site's own queuejob hook (order 10) and mt_queuejob (order 1) both act on a
    MalleTrain submission, in order; the site's refusal reaches the user unchanged."""
    script = tmp_path / "site_tag.py"
    script.write_text(SITE_HOOK)
    pbs.qmgr("create hook site_tag", "set hook site_tag event = queuejob",
             "set hook site_tag order = 10",
             f"import hook site_tag application/x-python default {script}")
    try:
        array = submit(pbs, test_user, "-q", "malletrain", "-J", "1-2", "-l",
                       "select=1:ncpus=2")
        attrs = job(pbs, array)
        assert attrs["queue"] == "mt_preemptable" and attrs["Account_Name"] == "site-tagged"
        assert "site_tag saw queue=mt_preemptable" in server_log(pbs)  # ours ran first
        res = pbs.run(["qsub", "-q", "malletrain", "-J", "1-2", "-N", "badjob", "-o",
                       "/dev/null"], user=test_user, input="true\n", check=False)
        assert res.returncode != 0
        assert "site policy: job names may not start with 'bad'" in res.stderr, res.stderr
    finally:
        pbs.qmgr("delete hook site_tag")


def test_users_cannot_steer_their_workers_but_pbs_admins_can(pbs: PbsComplex,
                                                            test_user: str) -> None:
    """mt_modifyjob: the owner's qalter and qmove of an elastic job are refused with one line;
    root's qalter goes through; the owner may still qdel it; other queues are untouched."""
    array = submit(pbs, test_user, "-q", "malletrain", "-J", "1-2", "-l", "select=1:ncpus=2",
                   "-l", "walltime=00:10:00")
    for argv in (["qalter", "-l", "walltime=00:20:00", array], ["qalter", "-N", "other", array],
                 ["qmove", "preemptable", array]):
        res = pbs.run(argv, user=test_user, check=False)
        assert res.returncode != 0, argv
        msg = res.stderr.strip()
        assert msg.count("\n") == 0 and "MalleTrain: jobs in mt_preemptable are" in msg, msg
        assert "qdel the job and submit again with -q malletrain" in msg
    attrs = job(pbs, array)
    assert attrs["queue"] == "mt_preemptable" and attrs["Job_Name"] == "STDIN"
    assert attrs["Resource_List"]["walltime"] == "00:10:00"  # type: ignore[index]
    pbs.run(["qalter", "-l", "walltime=00:15:00", array])  # root: a PBS manager
    assert job(pbs, array)["Resource_List"]["walltime"] == "00:15:00"  # type: ignore[index]
    plain = submit(pbs, test_user, "-q", "prod", "-h", "-l", "select=1:ncpus=2")
    pbs.run(["qalter", "-N", "mine", plain], user=test_user)  # not MalleTrain's: allowed
    assert job(pbs, plain)["Job_Name"] == "mine"
    pbs.run(["qdel", array], user=test_user)  # ending one's own job stays possible
    pbs.wait_for("the array deleted", lambda: job(pbs, array).get("job_state") in
                 (None, "F", "X"), 20)
