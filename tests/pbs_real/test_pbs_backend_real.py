"""PbsBackend against the real server.

First the backend contract every batch system keeps (tests/backend_contract.py: submit, grow,
shrink, preemption by a ``prod`` job, a node taken while a worker starts or stops, training
done, cancels, finish, a restart, the engine over it), each scenario on the real complex
(tests/live_contract.py); then what only a real PBS shows: where the workers run and in which
queue, a preempted subjob taken back while PBS still requeues it, a vnode that ``qrun -H``
would share, a shrink and a grow onto the same vnodes within a second.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from backend_contract import SCENARIOS
from live_contract import LiveWorld, flag_dir_fixture  # noqa: F401  (flag_dir)

from devtools.localcluster.pbs import PbsComplex
from devtools.localcluster.pbs_helpers import job, state, subjob, submit, wait_state
from devtools.waiting import poll_until
from malletrain_core.backends.pbs.backend import PbsBackend
from malletrain_core.events import (
    Action,
    Finish,
    Grow,
    JobSubmitted,
    NodesIdle,
    NodesReclaimed,
    Shrink,
    WorkerStarted,
    WorkerStopped,
)

MOVING_STATES = ("E", "T", "W")
REQUEUEING = range(60, 64)
"""The substates of a subjob PBS is requeuing (it shows R or E meanwhile)."""


class PbsLive(LiveWorld):
    """The contract's World on the local complex: arrays of the test user (both of the
    scenarios' owners: PBS runs no root job) through the ``malletrain`` route queue, vnodes
    taken by ``prod`` jobs pinned to them, training done when the array's flag file appears.
    PBS refuses an array of one subjob (``-J 1-1``): a job of at most one node is submitted
    with two, of which the scenarios use one."""

    name = "pbs"

    def __init__(self, pbs: PbsComplex, test_user: str, flags: Path) -> None:
        super().__init__(pbs.node_names, {"alice": test_user, "bob": test_user},
                         lambda: PbsBackend(pbs.runner(), grant_timeout_s=60))
        self.pbs, self.user, self.flags = pbs, test_user, flags
        self.prod: dict[str, str] = {}   # scenario node -> the prod job on it

    def submit(self, min_nodes: int, max_nodes: int, owner: str) -> str:
        script = (f'while [ ! -e "{self.flags}/done-$PBS_ARRAY_ID" ]; do sleep 0.2; done\n')
        return self.submitted(submit(
            self.pbs, self.user, "-q", "malletrain", "-J", f"1-{max(max_nodes, 2)}", "-l",
            "select=1:ncpus=2", "-v", f"MALLETRAIN_MIN_NODES={min_nodes}", script=script), owner)

    def take(self, node: str) -> None:
        prod = self.prod[node] = submit(self.pbs, self.user, "-q", "prod", "-l",
                                        f"select=1:ncpus=2:host={self.real(node)}")
        wait_state(self.pbs, prod, "R")

    def free(self, node: str) -> None:
        self.deleted(self.prod.pop(node))

    def complete(self, job_id: str) -> None:
        (self.flags / f"done-{job_id}").touch()
        self.pbs.wait_for(f"the workers of {job_id} done", lambda: not self._running(job_id), 30)

    def cancel(self, job_id: str) -> None:
        self.deleted(job_id)

    def deleted(self, job_id: str) -> None:
        """``qdel`` ``job_id`` and wait until it is finished: PBS shows a deleted job running
        unchanged until its mom reports the kill (4 s measured here)."""
        self.pbs.run(["qdel", job_id])
        wait_state(self.pbs, job_id, "F")

    def acted(self, actions: list[Action]) -> None:
        for action in actions:
            if isinstance(action, Finish):  # the backend's qdel
                wait_state(self.pbs, action.job_id, "F")

    def _running(self, job_id: str) -> set[str]:
        return {str(a.get("exec_vnode", "")).strip("()").split(":", 1)[0]
                for sid, a in self.pbs.jobs(job_id).items()
                if sid != job_id and a.get("job_state") == "R"}

    def settle(self) -> None:
        """Until two reads 0.5 s apart show the same jobs and vnodes and no job is exiting,
        being requeued or waiting to run on a free vnode."""
        last: tuple[object, object] | None = None

        def quiet() -> bool:
            nonlocal last
            jobs = {sid: (a.get("job_state"), a.get("substate"), a.get("exec_vnode"))
                    for sid, a in self.pbs.jobs().items()}
            nodes = {n: (a.get("state"), tuple(a.get("jobs", ()))) for n, a in
                     self.pbs.nodes().items()}
            now, last = last, (jobs, nodes)
            moving = [sid for sid, (st, sub, _) in jobs.items() if st in MOVING_STATES
                      or (st == "R" and int(str(sub or 42)) != 42)
                      or int(str(sub or 0)) in REQUEUEING]
            return now == last and not moving
        self.pbs.wait_for("the complex settled", quiet, 60, interval_s=0.5)


NOT_YET = {"training_done": "an array whose every subjob exited 0 leaves qstat at once (as "
           "F, in the history only): unless a poll saw a subjob X in between, PbsBackend "
           "reports the job CANCELLED, not COMPLETED"}
"""Scenarios the real PBS shows the backend does not keep yet, and why."""

LONG_ONLY = {
    "engine_drives_it": "the engine driving a real job is tests/pbs_real/test_pbs_training_e2e.py",
    "preemption": "a real preemption is test_pbs_training_e2e.py's and test_pbs_inplace.py's",
    "reconcile_after_restart": "a daemon restart on PBS is test_pbs_training_e2e.py's",
    "finish_by_engine": "the engine's Finish of a real job is test_pbs_training_e2e.py's",
    "cancelled_while_starting": "a user's qdel is test_pbs_training_e2e.py's",
}
"""The slowest scenarios (25-34 s each on PBS, whose deletions take seconds to show), whose
real-PBS path another real-PBS test already takes: run by `make test-long`
(``MALLETRAIN_LIVE_CONTRACT_ALL=1``), so that the real-PBS tier keeps to its time."""


def marks(name: str) -> list[pytest.MarkDecorator]:
    if name in NOT_YET:
        return [pytest.mark.xfail(reason=NOT_YET[name], strict=True)]
    if name in LONG_ONLY and not os.environ.get("MALLETRAIN_LIVE_CONTRACT_ALL"):
        return [pytest.mark.skip(reason=f"make test-long runs it: {LONG_ONLY[name]}")]
    return []


@pytest.mark.parametrize("scenario", [pytest.param(name, marks=marks(name))
                                      for name in sorted(SCENARIOS)])
def test_contract(scenario: str, pbs: PbsComplex, test_user: str, flag_dir: Path) -> None:
    SCENARIOS[scenario](PbsLive(pbs, test_user, flag_dir))


def on(backend: PbsBackend, node: str) -> str:
    (sid,) = [s for s, (_, where) in backend.workers.items() if where == node]
    return sid


def test_workers_run_in_the_worker_queue_and_a_requeue_is_taken_as_a_preemption(
        pbs: PbsComplex, test_user: str) -> None:
    """The array's bounds and model from its variables, no hole ends (PBS plans none), each
    worker in ``mt_preemptable`` on its vnode; a worker a prod job preempts is taken back
    while PBS still requeues it, and Finish ends the array."""
    backend = PbsBackend(pbs.runner(), grant_timeout_s=60)
    first = backend.poll(time.time())
    assert all(n.hole_end is None for e in first if isinstance(e, NodesIdle) for n in e.nodes)
    array = submit(pbs, test_user, "-q", "malletrain", "-J", "1-4", "-l", "select=1:ncpus=2",
                   "-v", "MALLETRAIN_MIN_NODES=2,MALLETRAIN_MODEL=resnet50")
    ev = poll_until(backend, lambda ev: any(isinstance(e, JobSubmitted) for e in ev))
    (req,) = [e.job for e in ev if isinstance(e, JobSubmitted)]
    assert (req.id, req.min_nodes, req.max_nodes, req.model) == (array, 2, 4, "resnet50")

    t0 = time.monotonic()
    assert backend.execute([Grow(array, ("n02", "n03"), 600.0)], time.time()) == []
    poll_until(backend, lambda ev: len([e for e in ev if isinstance(e, WorkerStarted)]) == 2)
    print(f"grow onto 2 vnodes: workers seen running after {time.monotonic() - t0:.2f} s")
    on_n02 = on(backend, "n02")
    for sid, node in ((on_n02, "n02"), (on(backend, "n03"), "n03")):
        attrs = job(pbs, sid)
        assert attrs["job_state"] == "R"
        assert str(attrs["exec_vnode"]).strip("()").split(":")[0] == node, attrs
        assert attrs["queue"] == "mt_preemptable"

    t0 = time.monotonic()
    prod = submit(pbs, test_user, "-q", "prod", "-l", "select=1:ncpus=2:host=n02")
    ev = poll_until(backend, lambda ev: any(isinstance(e, NodesReclaimed) and "n02" in e.nodes
                                            for e in ev))
    print(f"preemption by prod seen by the backend after {time.monotonic() - t0:.2f} s")
    # taken as preempted while PBS still requeues it (R or E, substate 60-63), or once queued
    attrs = job(pbs, on_n02)
    assert attrs["job_state"] == "Q" or int(str(attrs.get("substate"))) in REQUEUEING, attrs
    wait_state(pbs, on_n02, "Q")
    wait_state(pbs, prod, "R", 30)
    assert not [e for e in ev if isinstance(e, WorkerStopped)]  # reclaimed, not stopped

    backend.execute([Finish(array)], time.time())
    wait_state(pbs, array, "F", 30)
    assert all(state(pbs, subjob(array, i)) in ("X", "F") for i in range(1, 5))


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
