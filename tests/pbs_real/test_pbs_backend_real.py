"""PbsBackend against the real server: submit, grow onto idle vnodes, shrink, preemption by a
``prod`` job, finish. Each step is checked against PBS's own view (qstat), not only against
the backend's events."""

from __future__ import annotations

import time
from collections.abc import Callable

from devtools.localcluster.pbs import PbsComplex
from devtools.localcluster.pbs_helpers import job, state, subjob, submit, wait_state
from malletrain_core.backends.pbs.backend import PbsBackend
from malletrain_core.events import (
    Event,
    Finish,
    Grow,
    JobSubmitted,
    NodesIdle,
    NodesReclaimed,
    Shrink,
    WorkerStarted,
    WorkerStopped,
)


def poll_until(backend: PbsBackend, done: Callable[[list[Event]], bool],
               timeout_s: float = 30.0, interval_s: float = 0.3) -> list[Event]:
    seen: list[Event] = []
    deadline = time.monotonic() + timeout_s
    while True:
        seen += backend.poll(time.time())
        if done(seen):
            return seen
        if time.monotonic() > deadline:
            raise AssertionError(f"not seen within {timeout_s:g} s; events: {seen}")
        time.sleep(interval_s)


def on(backend: PbsBackend, node: str) -> str:
    (sid,) = [s for s, (_, where) in backend.workers.items() if where == node]
    return sid


def test_backend_drives_an_elastic_job(pbs: PbsComplex, test_user: str) -> None:
    backend = PbsBackend(pbs.runner(), grant_timeout_s=60)
    first = backend.poll(time.time())
    idle = [n.name for e in first if isinstance(e, NodesIdle) for n in e.nodes]
    assert idle == pbs.node_names
    assert all(n.hole_end is None for e in first if isinstance(e, NodesIdle) for n in e.nodes)

    array = submit(pbs, test_user, "-q", "malletrain", "-J", "1-4", "-l", "select=1:ncpus=2",
                   "-v", "MALLETRAIN_MIN_NODES=2,MALLETRAIN_MODEL=resnet50")
    ev = poll_until(backend, lambda ev: any(isinstance(e, JobSubmitted) for e in ev))
    (req,) = [e.job for e in ev if isinstance(e, JobSubmitted)]
    assert (req.id, req.min_nodes, req.max_nodes, req.model, req.owner) == (
        array, 2, 4, "resnet50", test_user)

    t0 = time.monotonic()
    assert backend.execute([Grow(array, ("n02", "n03"), 600.0)], time.time()) == []
    ev = poll_until(backend, lambda ev: len([e for e in ev if isinstance(e, WorkerStarted)]) == 2)
    print(f"grow onto 2 vnodes: workers seen running after {time.monotonic() - t0:.2f} s")
    assert sorted(e.node for e in ev if isinstance(e, WorkerStarted)) == ["n02", "n03"]
    on_n02, on_n03 = on(backend, "n02"), on(backend, "n03")
    for sid, node in ((on_n02, "n02"), (on_n03, "n03")):
        attrs = job(pbs, sid)
        assert attrs["job_state"] == "R"
        assert str(attrs["exec_vnode"]).strip("()").split(":")[0] == node, attrs
        assert attrs["queue"] == "mt_preemptable"

    backend.execute([Shrink(array, ("n03",))], time.time())
    ev = poll_until(backend, lambda ev: WorkerStopped in {type(e) for e in ev})
    assert [(e.job_id, e.node) for e in ev if isinstance(e, WorkerStopped)] == [(array, "n03")]
    assert state(pbs, on_n03) == "Q"  # back in the stopped queue: nothing restarts it

    t0 = time.monotonic()
    prod = submit(pbs, test_user, "-q", "prod", "-l", "select=1:ncpus=2:host=n02")
    ev = poll_until(backend, lambda ev: any(isinstance(e, NodesReclaimed) and "n02" in e.nodes
                                            for e in ev))
    print(f"preemption by prod seen by the backend after {time.monotonic() - t0:.2f} s")
    # taken as preempted while PBS still requeues it (R or E, substate 60-63), or once queued
    attrs = job(pbs, on_n02)
    assert attrs["job_state"] == "Q" or int(str(attrs.get("substate"))) in range(60, 64), attrs
    wait_state(pbs, on_n02, "Q")
    wait_state(pbs, prod, "R", 30)
    assert not [e for e in ev if isinstance(e, WorkerStopped)]  # reclaimed, not stopped
    assert backend.workers == {}

    backend.execute([Finish(array)], time.time())
    wait_state(pbs, array, "F", 30)
    assert all(state(pbs, subjob(array, i)) in ("X", "F") for i in range(1, 5))
    later = poll_until(backend, lambda ev: True)
    assert not [e for e in later if getattr(e, "job_id", None) == array]
    assert array not in backend.jobs


def test_a_vnode_pbs_gives_another_job_is_never_shared_with_a_worker(
        pbs: PbsComplex, test_user: str) -> None:
    """``qrun -H`` does not check a vnode's consumable resources, so the backend itself keeps
    a worker off a vnode that runs another job: a grow onto a vnode taken since the last poll
    is not started, and a worker found sharing its vnode (a grant that raced the other job's
    start, made here by hand with the backend's own qrun) is requeued at the next poll."""
    pbs.qmgr("create queue mt_test_forced queue_type = execution, enabled = true, "
             "started = false")
    try:
        backend = PbsBackend(pbs.runner(), grant_timeout_s=60)
        backend.poll(time.time())
        array = submit(pbs, test_user, "-q", "malletrain", "-J", "1-2", "-l", "select=1:ncpus=2")
        poll_until(backend, lambda ev: any(isinstance(e, JobSubmitted) for e in ev))

        # Taken between the poll and the grow: not started, given back to the engine.
        other = submit(pbs, test_user, "-q", "mt_test_forced", "-l", "select=1:ncpus=2")
        pbs.run(["qrun", "-H", "(n03)", other])
        now = time.time()
        assert backend.execute([Grow(array, ("n03",), 600.0)], now) == [
            WorkerStopped(now, array, "n03"), NodesReclaimed(now, ("n03",))]
        assert state(pbs, subjob(array, 1)) == "Q"

        # The grant that raced: the worker runs beside another job; the next poll requeues it.
        forced = submit(pbs, test_user, "-q", "mt_test_forced", "-l", "select=1:ncpus=2")
        pbs.run(["qrun", "-H", "(n02)", forced])
        pbs.run(["qrun", "-a", "-H", "(n02)", subjob(array, 1)])
        wait_state(pbs, subjob(array, 1), "R", 30)
        ev = poll_until(backend, lambda ev: any(isinstance(e, NodesReclaimed) for e in ev))
        assert [e.nodes for e in ev if isinstance(e, NodesReclaimed)] == [("n02",)]
        wait_state(pbs, subjob(array, 1), "Q", 30)
        assert state(pbs, forced) == "R"
        ev += poll_until(backend, lambda ev: not backend.busy())
        assert not [e for e in ev if isinstance(e, (WorkerStarted, WorkerStopped, NodesIdle))]
        assert backend.workers == {}
        backend.execute([Finish(array)], time.time())
    finally:
        for jid in pbs.run(["qselect", "-q", "mt_test_forced"], check=False).stdout.split():
            pbs.run(["qdel", "-Wforce", jid], check=False)
        pbs.wait_for("the forced jobs gone", lambda: not pbs.run(
            ["qselect", "-q", "mt_test_forced"], check=False).stdout.split(), 30)
        pbs.qmgr("delete queue mt_test_forced")


def test_a_shrink_then_a_grow_onto_the_same_vnodes_within_a_second_loses_nothing(
        pbs: PbsComplex, test_user: str) -> None:
    """``qrerun`` two workers and grow back onto their vnodes at once (bench/e2e.py's planned
    shrink followed by a grow): every subjob of the array stays queued or running, and both
    vnodes run a worker again within the grant timeout."""
    backend = PbsBackend(pbs.runner(), grant_timeout_s=30)
    backend.poll(time.time())
    array = submit(pbs, test_user, "-q", "malletrain", "-J", "1-3", "-l", "select=1:ncpus=2")
    poll_until(backend, lambda ev: any(isinstance(e, JobSubmitted) for e in ev))
    assert backend.execute([Grow(array, ("n02", "n03"), None)], time.time()) == []
    poll_until(backend, lambda ev: len([e for e in ev if isinstance(e, WorkerStarted)]) == 2)
    before = {node: sid for sid, (_, node) in backend.workers.items()}
    backend.execute([Shrink(array, ("n02", "n03"))], time.time())
    poll_until(backend, lambda ev: len([e for e in ev if isinstance(e, WorkerStopped)]) == 2,
               interval_s=0.1)
    t0 = time.monotonic()
    backend.execute([Grow(array, ("n02", "n03"), None)], time.time())
    ev = poll_until(backend, lambda ev: {"n02", "n03"} <= {
        n for _, n in backend.workers.values()}, 30, interval_s=0.1)
    took = time.monotonic() - t0
    print(f"qrerun then qrun -H onto the same vnodes: both running after {took:.2f} s; "
          f"events {ev}")
    after = {node: sid for sid, (_, node) in backend.workers.items()}
    assert after["n02"] != before["n02"] or after["n03"] != before["n03"]
    assert sorted(state(pbs, subjob(array, i)) for i in range(1, 4)) in (
        ["Q", "R", "R"], ["R", "R", "R"])
    backend.execute([Finish(array)], time.time())
