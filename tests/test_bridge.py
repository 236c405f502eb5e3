"""EpochBridge: planned shrinks wait for their epoch to drain, lost nodes restart the epoch."""

from __future__ import annotations

from malletrain_core.daemon.bridge import EpochBridge, uid_of
from malletrain_core.daemon.epochs import EpochCoordinator
from malletrain_core.events import (
    Checkpoint,
    EndReason,
    Grow,
    JobEnded,
    JobRequest,
    JobSubmitted,
    NodesReclaimed,
    Shrink,
    WorkerStarted,
    WorkerStopped,
)
from malletrain_core.interfaces import Backend, TaskView


class FakeBackend(Backend):
    name = "fake"

    def __init__(self):
        self.queued = []
        self.executed = []

    def poll(self, now):
        out, self.queued = self.queued, []
        return out

    def execute(self, actions, now):
        self.executed.extend(actions)
        return []

    def view(self):
        return TaskView(frozenset(), frozenset(), frozenset())


def running_job(now=0.0, nodes=("n1", "n2")):
    """A bridge whose job 7 trains in epoch 0 on ``nodes``."""
    backend = FakeBackend()
    co = EpochCoordinator(checkpoint_timeout_s=30.0, join_timeout_s=10.0,
                          random=lambda n: bytes(n))
    bridge = EpochBridge(backend, co, uid_of=lambda user: 1000)
    backend.queued = [JobSubmitted(now, JobRequest("7", 1, 4, owner="alice"))]
    backend.queued += [WorkerStarted(now, "7", n) for n in nodes]
    bridge.poll(now)
    for n in nodes:
        co.checkin("7", n, now)
    assert co.current("7").members == tuple(nodes)
    for n in nodes:
        co.checkin("7", n, now, epoch=0, state="running")
    return backend, co, bridge


def test_submission_registers_the_owner_and_started_workers_join_the_target():
    _, co, _ = running_job()
    assert co.owner("7") == 1000
    assert co.state("7").target == ("n1", "n2")


def test_planned_shrink_waits_for_the_checkpoint_and_a_grow_onto_the_node_waits_for_it():
    backend, co, bridge = running_job()
    bridge.execute([Checkpoint("7"), Shrink("7", ("n2",)), Grow("8", ("n2",), 600.0)], 1.0)
    assert backend.executed == []  # n2 still trains in epoch 0
    assert co.draining("7") == {"n2"}
    assert co.checkin("7", "n1", 2.0, epoch=0, state="running").kind == "checkpoint"
    bridge.poll(3.0)
    assert backend.executed == []
    co.acknowledge_checkpoint("7", 0, 4.0)
    assert co.current("7").members == ("n1",) and co.draining("7") == set()
    assert bridge.releasable()
    bridge.poll(4.5)
    assert backend.executed == [Shrink("7", ("n2",)), Grow("8", ("n2",), 600.0)]
    assert bridge.deferred == []


def test_a_grow_still_waiting_here_is_taken_back_by_a_shrink_of_its_nodes():
    """Job 8's grow onto n2 and n3 waits for job 7's epoch to leave n2; the engine then shrinks
    job 8 off n2 (seen in the revival test: it granted n2 to another job since). The grow must
    not reach the batch system for n2 once job 7 is gone from it, nor the shrink either (no task
    of job 8 was ever there), and the view no longer shows job 8 on n2."""
    backend, co, bridge = running_job()
    backend.queued = [JobSubmitted(1.0, JobRequest("8", 1, 4, owner="bob"))]
    bridge.poll(1.0)
    bridge.execute([Shrink("7", ("n2",)), Grow("8", ("n2", "n3"), 600.0)], 1.0)
    assert backend.executed == []  # the grow waits whole
    assert ("8", "n2") in bridge_view(bridge).running
    bridge.execute([Shrink("8", ("n2",))], 2.0)
    assert ("8", "n2") not in bridge_view(bridge).running
    assert backend.executed == [Grow("8", ("n3",), 600.0)]  # n3 need not wait any more
    co.acknowledge_checkpoint("7", 0, 4.0)
    bridge.poll(4.5)
    assert backend.executed == [Grow("8", ("n3",), 600.0), Shrink("7", ("n2",))]
    assert bridge.deferred == []


def bridge_view(bridge: EpochBridge) -> TaskView:
    view = bridge.view()
    assert view is not None
    return view


def test_shrink_of_a_job_without_a_running_epoch_goes_at_once():
    backend = FakeBackend()
    co = EpochCoordinator(random=lambda n: bytes(n))
    bridge = EpochBridge(backend, co, uid_of=lambda user: 1000)
    backend.queued = [JobSubmitted(0.0, JobRequest("7", 1, 4, owner="alice")),
                      WorkerStarted(0.0, "7", "n1")]
    bridge.poll(0.0)
    bridge.execute([Shrink("7", ("n1",))], 1.0)
    assert backend.executed == [Shrink("7", ("n1",))]


def test_a_shrink_stuck_in_draining_goes_after_max_defer():
    backend, co, bridge = running_job()
    bridge.max_defer_s = 50.0
    bridge.execute([Shrink("7", ("n2",))], 1.0)
    co.checkpoint_timeout_s = 1e9  # the coordinator never moves on by itself
    bridge.poll(20.0)
    assert backend.executed == []
    bridge.poll(51.0)
    assert backend.executed == [Shrink("7", ("n2",))]


def test_preempted_node_is_lost_and_the_survivors_restart_at_once():
    backend, co, bridge = running_job(nodes=("n1", "n2", "n3"))
    backend.queued = [NodesReclaimed(5.0, ("n3",))]
    bridge.poll(5.0)
    assert co.state("7").target == ("n1", "n2")
    epoch = co.current("7")
    assert epoch.number == 1 and epoch.members == ("n1", "n2")
    assert co.checkin("7", "n1", 5.5, epoch=0, state="running").kind == "stop"


def test_a_stopped_worker_outside_a_shrink_is_lost_too():
    backend, co, bridge = running_job()
    backend.queued = [WorkerStopped(5.0, "7", "n2")]
    bridge.poll(5.0)
    assert co.current("7").members == ("n1",)


def test_job_end_forgets_the_job_and_its_deferred_actions():
    backend, co, bridge = running_job()
    bridge.execute([Shrink("7", ("n2",))], 1.0)
    backend.queued = [JobEnded(2.0, "7", EndReason.CANCELLED)]
    bridge.poll(2.0)
    assert co.owner("7") is None and bridge.deferred == []
    assert backend.executed == []


def test_uid_of_names_numbers_and_strangers():
    assert uid_of("root") == 0
    assert uid_of("4242") == 4242
    assert uid_of("no-such-user-here") == -1
    assert uid_of(None) == -1
