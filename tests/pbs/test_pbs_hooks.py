"""The PBS hooks, each run in a fresh process on the fake ``pbs`` module, as PBS runs them."""

from __future__ import annotations

import ast
import hashlib
import hmac
import json
import re
import socket
import time
from pathlib import Path

import pytest
from pbs_testlib import FIXTURES, GOLDEN, HOOK

from malletrain_core.jobsecret import derive
from malletrain_core.wire import hooks as protocol


def periodic_fixture(path: Path, vnodes: dict[str, str], alarm: int = 20) -> Path:
    lines = ["pbs.event().type=periodic", "pbs.event().hook_name=mt_periodic",
             f"pbs.event().alarm={alarm}"]
    lines += [f'pbs.event().vnode_list["{name}"].state={state}' for name, state in vnodes.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def with_alarm(src: str, dest: Path, alarm_s: int) -> Path:
    text = (FIXTURES / f"{src}.in").read_text().splitlines()
    text = [f"pbs.event().alarm={alarm_s}" if ln.startswith("pbs.event().alarm=") else ln
            for ln in text]
    dest.write_text("\n".join(text) + "\n")
    return dest


# ---- periodic: the free vnodes --------------------------------------------------------------

def test_periodic_offers_exactly_the_free_idle_unreserved_vnodes(run_hook):
    run = run_hook("periodic_mixed")
    assert run.returncode == 0 and run.accepted, run.stderr + run.log
    assert len(run.datagrams) == 1
    msg = protocol.decode(run.datagrams[0])
    assert isinstance(msg, protocol.NodesFree)
    assert msg.src == "pbs-periodic"
    # n02 runs a shared job, n06 is in a reservation that has started, n10 belongs to another
    # queue, n16 carries a reservation; n14's reservation is far away; n08 has a bit set that
    # has no name in pbsnodes (0x10000) and is therefore not free.
    assert msg.nodes == ("n01", "n07", "n11", "n14")
    assert abs(msg.t - time.time()) < 60


@pytest.mark.parametrize("state, free", [
    ("free", True), ("0", True), ("0x0", True),
    ("job-busy", False), ("job-exclusive", False), ("busy", False), ("offline", False),
    ("down", False), ("down,offline", False), ("resv-exclusive", False), ("sleep", False),
    ("maintenance", False), ("Stale", False), ("provisioning", False),
    ("0x8000", False),    # marked down by the communication layer: no word, still not free
    ("0x80000", False),   # needs credentials
    ("0x4000", False),    # offline by mom
])
def test_periodic_free_means_no_state_bit_at_all(run_hook, hook_dir, state, free):
    fixture = periodic_fixture(hook_dir / "one.in", {"probe": state, "anchor": "job-busy"})
    run = run_hook(fixture)
    assert run.accepted, run.log
    offered = [n for m in run.messages() for n in m["nodes"]]
    assert offered == (["probe"] if free else [])


def test_periodic_splits_a_large_pool_over_datagrams_within_the_limit(run_hook, hook_dir):
    names = {f"x1000c{c}s{s}b0n{n}": "free" for c in range(6) for s in range(8) for n in range(8)}
    run = run_hook(periodic_fixture(hook_dir / "big.in", names))
    assert run.accepted, run.log
    assert len(run.datagrams) > 1
    assert all(len(d) <= protocol.MAX_DATAGRAM_BYTES for d in run.datagrams)
    got = [n for d in run.datagrams for n in protocol.decode(d).nodes]
    assert sorted(got) == sorted(names) and len(got) == len(set(got))


def test_periodic_sends_nothing_when_nothing_is_free(run_hook):
    run = run_hook("periodic_none_free")
    assert run.accepted and run.datagrams == []


# ---- modifyvnode: a node changed state ------------------------------------------------------

def test_modifyvnode_reports_the_new_state_in_pbs_words(run_hook):
    run = run_hook("modifyvnode_down")
    assert run.accepted
    [msg] = [protocol.decode(d) for d in run.datagrams]
    assert isinstance(msg, protocol.NodeChange)
    assert msg.node == "n03" and set(msg.state.split(",")) == {"down", "offline"}
    assert msg.src == "pbs-modifyvnode"


def test_modifyvnode_taken_by_a_job(run_hook):
    [msg] = run_hook("modifyvnode_busy").messages()
    assert (msg["node"], msg["state"]) == ("n07", "job-exclusive")


def test_modifyvnode_ignores_changes_that_leave_the_state_alone(run_hook):
    run = run_hook("modifyvnode_same_state")
    assert run.accepted and run.datagrams == []


# ---- jobobit: a worker ended, was preempted or requeued -------------------------------------

def test_jobobit_sees_a_preempted_worker_requeued(run_hook):
    run = run_hook("jobobit_preempted")
    assert run.accepted
    [raw] = run.datagrams
    msg = protocol.decode(raw)
    assert isinstance(msg, protocol.JobEnd)
    assert (msg.job, msg.nodes, msg.user) == ("123[4].pbs-server", ("n07",), "alice")
    assert (msg.restarts, msg.exit, msg.partition) == (2, "-11:0", "mt_preemptable")
    assert json.loads(raw)["requeued"] is True


def test_jobobit_completed_worker(run_hook):
    [msg] = run_hook("jobobit_completed").messages()
    assert (msg["exit"], msg["requeued"], msg["restarts"]) == ("0:0", False, 1)


def test_jobobit_signal_exit_and_repeated_vnodes(run_hook):
    [raw] = run_hook("jobobit_killed").datagrams
    msg = protocol.decode(raw)
    assert msg.exit == "0:15" and msg.nodes == ("n02",) and msg.restarts == 3


def test_jobobit_ignores_jobs_of_other_queues(run_hook):
    run = run_hook("jobobit_other_queue")
    assert run.accepted and run.datagrams == []


# ---- execjob_epilogue: a worker whose batch script was killed outside PBS --------------------

@pytest.mark.parametrize("fixture,rerun", [
    ("epilogue_launcher_killed", True),   # 128 + SIGKILL: the launcher killed, not by PBS
    ("epilogue_qdel", False),             # 256 + SIGTERM: PBS's own kill (qdel, qrerun)
    ("epilogue_qdel_launcher_exit", False),  # 128 + SIGTERM: the launcher ending on a qdel
    ("epilogue_completed", False),        # training done
    ("epilogue_failed", False),           # the launcher's own failure exit
    ("epilogue_other_queue", False),      # not a MalleTrain worker
])
def test_epilogue_requeues_only_a_worker_killed_outside_pbs(run_hook, fixture, rerun):
    """PBS never runs a finished subjob again: a worker whose script died of a signal PBS did
    not send goes back to its queue (job.rerun()), so the job keeps its whole range; the
    OpenPBS 23.06 complex did so (exit 137 -> requeued, run_count 2; qdel's 271 and
    qdel -Wforce's 265 left alone)."""
    run = run_hook(fixture)
    assert run.accepted and run.datagrams == []
    assert ("pbs.event().job._rerun=True" in run.record.splitlines()) is rerun, run.record
    assert ("requeued, so that the job keeps its subjob" in run.log) is rerun, run.log


@pytest.mark.parametrize("exit_status", ["137", "271", "143"])
def test_a_worker_pbs_is_ending_is_never_requeued_whatever_it_exits_with(run_hook, hook_dir,
                                                                        exit_status):
    """A qdel's TermJob runs the preterm event on the mom, which notes the worker; its
    epilogue then leaves it ended even at 128 + SIGKILL (the queue's kill_delay ran out and
    PBS's own SIGKILL came: seen in CI on a loaded machine, the qdel'd subjob requeued and
    never ending), and lets the note go."""
    run = run_hook("preterm_worker")
    assert run.accepted and run.datagrams == [], run.log
    marks = list(hook_dir.glob("malletrain-terminated-*"))
    assert [m.name for m in marks] == ["malletrain-terminated-123[2].pbs-server"]
    ended = hook_dir / "epilogue_after_term.in"
    ended.write_text((FIXTURES / "epilogue_launcher_killed.in").read_text().replace(
        "Exit_status=137", f"Exit_status={exit_status}"))
    run = run_hook(ended)
    assert run.accepted and "pbs.event().job._rerun=True" not in run.record.splitlines()
    assert "requeued" not in run.log and not list(hook_dir.glob("malletrain-terminated-*"))
    # the next life of the same subjob, killed outside PBS, is requeued again
    run = run_hook("epilogue_launcher_killed")
    assert "pbs.event().job._rerun=True" in run.record.splitlines(), run.record


def test_preterm_leaves_other_queues_alone(run_hook, hook_dir):
    other = hook_dir / "preterm_other.in"
    other.write_text((FIXTURES / "preterm_worker.in").read_text().replace(
        "queue=mt_preemptable", "queue=workq"))
    assert run_hook(other).accepted and not list(hook_dir.glob("malletrain-terminated-*"))


# ---- queuejob: routing and refusal ----------------------------------------------------------

def test_queuejob_routes_an_elastic_job_to_the_preemptable_queue(run_hook):
    run = run_hook("queuejob_route")
    assert run.accepted, run.record + run.log
    assert run.record == (GOLDEN / "queuejob_route.out").read_text()


def test_queuejob_keeps_what_the_user_set(run_hook):
    run = run_hook("queuejob_route_defaults")
    assert run.accepted
    lines = set(run.record.splitlines())
    assert "pbs.event().job.Resource_List[place]=scatter:excl" in lines
    assert "pbs.event().job.queue=mt_preemptable" in lines


def test_queuejob_leaves_other_queues_alone(run_hook):
    run = run_hook("queuejob_other_queue")
    assert run.accepted
    lines = set(run.record.splitlines())
    assert {"pbs.event().job.queue=workq", "pbs.event().job.Rerunable=False"} <= lines
    assert not any("place" in ln for ln in lines)


@pytest.mark.parametrize("fixture, fragment", [
    ("queuejob_no_array", "no -J range given"),
    ("queuejob_multichunk", "asks for 3 nodes per worker"),
    ("queuejob_min_above_max", "MALLETRAIN_MIN_NODES=8 must be between 1 and the 4 workers"),
    ("queuejob_min_not_number", "MALLETRAIN_MIN_NODES=two is not a whole number"),
    ("queuejob_not_rerunable", "-r n: preempted MalleTrain workers must be requeued"),
    ("queuejob_shared_place", "place=pack:shared would share nodes"),
    ("queuejob_interactive", "cannot be interactive"),
    ("queuejob_nodes_syntax", "-l nodes is not supported"),
    ("queuejob_direct_preemptable", "do not submit to mt_preemptable directly"),
])
def test_queuejob_refuses_impossible_requests_saying_how_to_fix(run_hook, fixture, fragment):
    run = run_hook(fixture)
    assert not run.accepted
    assert run.reject_msg is not None and run.reject_msg.startswith("MalleTrain: ")
    assert fragment in run.reject_msg
    assert "\n" not in run.reject_msg


def test_queuejob_site_limit(run_hook):
    assert run_hook("queuejob_too_many").accepted
    run = run_hook("queuejob_too_many", config={"max_nodes": 16})
    assert not run.accepted and "use -J 1-16" in run.reject_msg


def test_queuejob_entry_queue_comes_from_the_config(run_hook):
    run = run_hook("queuejob_other_queue", config={"entry_queue": "workq", "queue": "elastic"})
    assert not run.accepted and "no -J range given" in run.reject_msg


# ---- the daemon down, failures, the alarm ---------------------------------------------------

@pytest.mark.parametrize("fixture", ["periodic_mixed", "modifyvnode_down", "jobobit_preempted",
                                     "queuejob_route"])
def test_hooks_accept_when_the_daemon_is_down(run_hook, fixture):
    run = run_hook(fixture, daemon=False)
    assert run.returncode == 0 and run.accepted
    assert run.stderr == "" and "cannot send" not in run.log


def test_hooks_accept_when_the_socket_is_stale(run_hook, hook_dir):
    stale = hook_dir / "stale.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(stale))
    sock.close()  # the file stays, nobody listens: ECONNREFUSED
    run = run_hook("modifyvnode_down", daemon=False, config={"socket": str(stale)})
    assert run.accepted and "cannot send" not in run.log


def test_unusable_config_falls_back_to_defaults_and_says_so(run_hook, hook_dir):
    bad = hook_dir / "bad.json"
    bad.write_text("{not json")
    run = run_hook("queuejob_route", daemon=False, env={"PBS_HOOK_CONFIG_FILE": str(bad)})
    assert run.accepted and "unreadable" in run.log
    run = run_hook("periodic_mixed", config={"sockett": "/x", "max_nodes": "many"})
    assert run.accepted and "unknown key 'sockett'" in run.log
    assert "max_nodes must be a int" in run.log
    assert len(run.datagrams) == 1


def test_a_failure_inside_a_hint_hook_is_logged_and_accepted(run_hook):
    run = run_hook("periodic_mixed", env={"FAKEPBS_FAIL": "vnode_list"})
    assert run.accepted and run.datagrams == []
    assert "failed: RuntimeError: fake server failure" in run.log


def test_a_failure_while_checking_an_elastic_job_refuses_it(run_hook):
    run = run_hook("queuejob_route", env={"FAKEPBS_FAIL": "server"})
    assert not run.accepted and "submission check failed (RuntimeError)" in run.reject_msg
    # A regular job never reaches the failing call and goes through.
    assert run_hook("queuejob_other_queue", env={"FAKEPBS_FAIL": "server"}).accepted


def test_the_alarm_stops_a_hint_hook_which_still_accepts(run_hook, hook_dir):
    fixture = with_alarm("periodic_mixed", hook_dir / "slow.in", 1)
    t0 = time.monotonic()
    run = run_hook(fixture, env={"FAKEPBS_PARAM_DELAY_S": "20"})
    assert time.monotonic() - t0 < 10
    assert run.accepted and run.datagrams == []
    assert "alarm: hook mt_periodic stopped" in run.log


def test_the_alarm_during_a_submission_check_refuses_the_job(run_hook, hook_dir):
    fixture = with_alarm("queuejob_route", hook_dir / "slow.in", 1)
    run = run_hook(fixture, env={"FAKEPBS_PARAM_DELAY_S": "20"})
    assert not run.accepted and "timed out" in run.reject_msg


def test_hook_script_is_standard_library_only():
    source = HOOK.read_text()
    imports = {ln.split()[1].split(".")[0] for ln in source.splitlines()
               if ln.startswith(("import ", "from "))}
    assert imports == {"errno", "hashlib", "hmac", "json", "os", "re", "socket", "time", "pbs"}


def test_mt_launch_gives_the_secret_the_daemon_derives():
    """The hook's job_secret (run by the moms) and jobsecret.derive (run by the daemon) must
    agree: both are lifted out of their sources and compared."""
    tree = ast.parse(HOOK.read_text())
    keep = [n for n in tree.body if (isinstance(n, ast.FunctionDef) and n.name == "job_secret")
            or (isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == "_JOB_SECRET_LABEL")]
    assert len(keep) == 2
    space: dict = {"hashlib": hashlib, "hmac": hmac, "re": re}
    exec(compile(ast.Module(body=keep, type_ignores=[]), str(HOOK), "exec"), space)  # noqa: S102
    key = bytes(range(40))
    for job in ("12[].pbsserver", "12[7].pbsserver", "3[].srv.example.org"):
        assert space["job_secret"](key.hex(), job) == derive(key, job)


def test_hook_never_swallows_system_exit():
    """accept()/reject() end a hook by raising SystemExit: no handler may catch it silently."""
    tree = ast.parse(HOOK.read_text())
    for node in ast.walk(tree):
        if not isinstance(node, ast.Try):
            continue
        names = [ast.unparse(h.type) if h.type is not None else "<bare>" for h in node.handlers]
        assert "<bare>" not in names and "BaseException" not in names
        if "Exception" in names and any(isinstance(n, ast.Call) and getattr(
                n.func, "attr", "") in ("accept", "reject") for n in ast.walk(node)):
            # A try that may end the hook re-raises SystemExit before anything broad.
            assert names[0] == "SystemExit" and isinstance(node.handlers[0].body[0], ast.Raise)


# ---- modifyjob: users do not steer their workers; postqueuejob: a new job wakes the daemon ---

def test_modifyjob_refuses_a_user_changing_a_worker_array(run_hook):
    run = run_hook("modifyjob_user")
    assert not run.accepted
    assert run.reject_msg is not None and run.reject_msg.startswith("MalleTrain: ")
    assert "qdel the job and submit again with -q malletrain" in run.reject_msg
    assert "\n" not in run.reject_msg and run.datagrams == []


@pytest.mark.parametrize("fixture", ["modifyjob_root", "modifyjob_other_queue"])
def test_modifyjob_lets_pbs_admins_and_other_queues_through(run_hook, fixture):
    run = run_hook(fixture)
    assert run.accepted, run.log


def test_postqueuejob_announces_a_new_array_of_the_preemptable_queue(run_hook):
    [msg] = [protocol.decode(d) for d in run_hook("postqueuejob_array").datagrams]
    assert isinstance(msg, protocol.JobQueued)
    assert (msg.src, msg.job) == ("pbs-postqueuejob", "12[].head1")


@pytest.mark.parametrize("fixture", ["postqueuejob_subjob", "postqueuejob_other_queue"])
def test_postqueuejob_is_quiet_for_subjobs_and_other_queues(run_hook, fixture):
    run = run_hook(fixture)
    assert run.accepted and run.datagrams == []
