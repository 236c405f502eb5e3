"""The contract every batch-system backend keeps, written once in the engine's terms.

A scenario drives a :class:`World` — a batch system's state behind its own commands (a
simulated Slurm or PBS at the subprocess boundary, or the toy batch system) — and one or more
backends over it: the world changes (a job is submitted, a node is taken, a user cancels),
the backend is polled and must report exactly the engine events of the contract, and the
engine's actions (Grow, Shrink, Finish) given to ``execute`` must change the world as meant.
tests/test_backend_contract.py runs every scenario on every registered batch system.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from malletrain_core.backends.base import Backend
from malletrain_core.engine import Engine, EngineConfig
from malletrain_core.events import (
    EndReason,
    Event,
    Finish,
    Grow,
    IdleNode,
    JobEnded,
    JobSubmitted,
    NodesIdle,
    NodesReclaimed,
    Shrink,
    WorkerStarted,
    WorkerStopped,
)

T = 1_800_000_000.0


class World(Protocol):
    """A batch system as the scenarios change it (what users, other jobs and admins do)."""

    name: str

    def backend(self) -> Backend:
        """A new backend over this batch system's state (a daemon start or restart)."""

    def add_node(self, name: str) -> None:
        """A node of MalleTrain's partition or queue, idle."""

    def submit(self, min_nodes: int, max_nodes: int, owner: str) -> str:
        """An elastic job submitted by ``owner``; returns the id the backend will report."""

    def take(self, node: str) -> None:
        """Another job of the batch system takes ``node``, preempting a worker there."""

    def free(self, node: str) -> None:
        """That other job left ``node``: idle again."""

    def complete(self, job_id: str) -> None:
        """The training is done: the job's workers exit successfully."""

    def cancel(self, job_id: str) -> None:
        """The owner cancels the whole job with the batch system's own command."""

    def running(self, job_id: str) -> set[str]:
        """The nodes where the batch system runs a worker of ``job_id``."""


def of(events: list[Event], kind: type) -> list:
    return [e for e in events if isinstance(e, kind)]


def started(events: list[Event]) -> set[tuple[str, str]]:
    return {(e.job_id, e.node) for e in of(events, WorkerStarted)}


def setup(world: World, nodes: int = 3, max_nodes: int = 2) -> tuple[Backend, str]:
    """``nodes`` idle nodes n1.., one job (1..max_nodes) of alice's, polled once."""
    for i in range(1, nodes + 1):
        world.add_node(f"n{i}")
    job = world.submit(1, max_nodes, "alice")
    backend = world.backend()
    events = backend.poll(T)
    assert len(of(events, JobSubmitted)) == 1
    return backend, job


def running_on(world: World, backend: Backend, job: str, nodes: tuple[str, ...],
               now: float) -> None:
    """Grow ``job`` onto ``nodes`` and confirm the workers with a poll."""
    assert backend.execute([Grow(job, nodes, None)], now) == []
    assert started(backend.poll(now + 1)) == {(job, n) for n in nodes}
    assert set(nodes) <= world.running(job)


# ----------------------------------------------------------------------------- scenarios
def submit_and_offer(world: World) -> None:
    """A new job is reported once, with its bounds and owner; idle nodes are offered once,
    and a poll with nothing new reports nothing."""
    for name in ("n1", "n2", "n3"):
        world.add_node(name)
    job = world.submit(1, 2, "alice")
    backend = world.backend()
    events = backend.poll(T)
    (sub,) = of(events, JobSubmitted)
    assert (sub.job.id, sub.job.min_nodes, sub.job.max_nodes, sub.job.owner) == (
        job, 1, 2, "alice")
    assert events == [sub, NodesIdle(T, (IdleNode("n1"), IdleNode("n2"), IdleNode("n3")))]
    assert backend.poll(T + 1) == []


def grow_onto_idle_nodes(world: World) -> None:
    """Grow starts one worker per node, confirmed by WorkerStarted at the next poll; a grow
    beyond the job's tasks fails at once with WorkerStopped for that node."""
    backend, job = setup(world)
    assert backend.execute([Grow(job, ("n1", "n2", "n3"), None)], T + 1) == [
        WorkerStopped(T + 1, job, "n3")]
    assert backend.poll(T + 2) == [WorkerStarted(T + 2, job, "n1"),
                                   WorkerStarted(T + 2, job, "n2")]
    assert world.running(job) == {"n1", "n2"}
    assert backend.poll(T + 3) == []


def shrink(world: World) -> None:
    """Shrink stops the worker (WorkerStopped, the node stays offered: no NodesIdle, no
    NodesReclaimed), and the job can grow onto that node again (a few seconds later: Slurm's
    backend does not restart a task where it has just left, see ``REUSE_SETTLE_S``)."""
    backend, job = setup(world)
    running_on(world, backend, job, ("n1", "n2"), T + 1)
    assert backend.execute([Shrink(job, ("n2",))], T + 3) == []
    assert backend.poll(T + 4) == [WorkerStopped(T + 4, job, "n2")]
    assert world.running(job) == {"n1"}
    assert backend.poll(T + 5) == []
    running_on(world, backend, job, ("n2",), T + 8)


def preemption(world: World) -> None:
    """Nodes the batch system takes back — a worker's and an idle one — come back as one
    NodesReclaimed (no WorkerStopped); once free again they are offered again."""
    backend, job = setup(world)
    running_on(world, backend, job, ("n1", "n2"), T + 1)
    world.take("n2")
    world.take("n3")
    assert backend.poll(T + 3) == [NodesReclaimed(T + 3, ("n2", "n3"))]
    assert world.running(job) == {"n1"}
    assert backend.poll(T + 4) == []
    world.free("n2")
    assert backend.poll(T + 5) == [NodesIdle(T + 5, (IdleNode("n2"),))]
    running_on(world, backend, job, ("n2",), T + 6)


def shrink_while_starting(world: World) -> None:
    """A shrink of a worker not confirmed yet answers WorkerStopped at once; the batch system
    does not keep it running (even if it had started), it is never reported started, and the
    node stays offered: the job can grow onto it again."""
    backend, job = setup(world)
    assert backend.execute([Grow(job, ("n1", "n2"), None)], T + 1) == []
    assert backend.execute([Shrink(job, ("n2",))], T + 2) == [WorkerStopped(T + 2, job, "n2")]
    assert backend.poll(T + 3) == [WorkerStarted(T + 3, job, "n1")]
    assert backend.poll(T + 4) == []
    assert world.running(job) == {"n1"}
    running_on(world, backend, job, ("n2",), T + 5)


def node_taken_while_starting(world: World) -> None:
    """The batch system takes a node a grow was starting a worker on: NodesReclaimed only,
    no WorkerStarted for it."""
    backend, job = setup(world)
    assert backend.execute([Grow(job, ("n1", "n2"), None)], T + 1) == []
    world.take("n2")
    assert backend.poll(T + 2) == [NodesReclaimed(T + 2, ("n2",)),
                                   WorkerStarted(T + 2, job, "n1")]
    assert world.running(job) == {"n1"}
    assert backend.poll(T + 3) == []


def node_taken_while_shrinking(world: World) -> None:
    """A node taken back while our shrink of its worker is under way: the node is reclaimed
    and the shrink confirmed (WorkerStopped), in that order."""
    backend, job = setup(world)
    running_on(world, backend, job, ("n1", "n2"), T + 1)
    assert backend.execute([Shrink(job, ("n2",))], T + 3) == []
    world.take("n2")
    assert backend.poll(T + 4) == [NodesReclaimed(T + 4, ("n2",)),
                                   WorkerStopped(T + 4, job, "n2")]
    assert backend.poll(T + 5) == [] and world.running(job) == {"n1"}


def training_done(world: World) -> None:
    """Workers that end successfully end the job: JobEnded(COMPLETED), no WorkerStopped; the
    engine's Finish then clears it from the batch system, and nothing more is reported."""
    backend, job = setup(world)
    running_on(world, backend, job, ("n1", "n2"), T + 1)
    world.complete(job)
    assert backend.poll(T + 3) == [JobEnded(T + 3, job, EndReason.COMPLETED)]
    assert backend.execute([Finish(job)], T + 4) == []
    assert backend.poll(T + 5) == []
    assert world.running(job) == set()


def cancelled_by_user(world: World) -> None:
    """The owner's cancel ends the job: JobEnded(CANCELLED) only; its nodes are still offered."""
    backend, job = setup(world)
    running_on(world, backend, job, ("n1",), T + 1)
    world.cancel(job)
    assert backend.poll(T + 3) == [JobEnded(T + 3, job, EndReason.CANCELLED)]
    assert backend.poll(T + 4) == []
    running = world.submit(1, 1, "bob")
    events = backend.poll(T + 5)
    assert [e.job.id for e in of(events, JobSubmitted)] == [running] and len(events) == 1
    running_on(world, backend, running, ("n1",), T + 6)


def cancelled_while_starting(world: World) -> None:
    """The owner cancels a job whose workers are still starting: JobEnded(CANCELLED) only."""
    backend, job = setup(world)
    assert backend.execute([Grow(job, ("n1", "n2"), None)], T + 1) == []
    world.cancel(job)
    assert backend.poll(T + 2) == [JobEnded(T + 2, job, EndReason.CANCELLED)]
    assert backend.poll(T + 3) == [] and world.running(job) == set()


def finish_by_engine(world: World) -> None:
    """Finish ends every worker of that job, and only of that job, in the batch system; no
    event follows for it."""
    backend, job = setup(world, nodes=4)
    other = world.submit(1, 2, "bob")
    backend.poll(T + 1)
    running_on(world, backend, job, ("n1", "n2"), T + 2)
    running_on(world, backend, other, ("n3", "n4"), T + 4)
    assert backend.execute([Finish(job)], T + 6) == []
    assert world.running(job) == set() and world.running(other) == {"n3", "n4"}
    assert backend.poll(T + 7) == []
    assert backend.poll(T + 8) == []
    assert backend.execute([Shrink(other, ("n4",))], T + 9) == []
    assert backend.poll(T + 10) == [WorkerStopped(T + 10, other, "n4")]


def reconcile_after_restart(world: World) -> None:
    """A new backend on the same batch system reports every live job (JobSubmitted), every
    usable node and node running a worker (NodesIdle) and every worker (WorkerStarted), and
    can then act on those workers."""
    backend, job = setup(world, nodes=4, max_nodes=3)
    other = world.submit(2, 2, "bob")
    backend.poll(T + 1)
    running_on(world, backend, job, ("n1", "n3"), T + 2)
    world.take("n4")
    backend.poll(T + 4)

    again = world.backend()
    events = again.poll(T + 10)
    assert sorted((e.job.id, e.job.min_nodes, e.job.max_nodes, e.job.owner)
                  for e in of(events, JobSubmitted)) == sorted(
        [(job, 1, 3, "alice"), (other, 2, 2, "bob")])
    (idle,) = of(events, NodesIdle)
    assert idle.nodes == (IdleNode("n1"), IdleNode("n2"), IdleNode("n3"))
    assert started(events) == {(job, "n1"), (job, "n3")}
    assert not of(events, NodesReclaimed) and not of(events, WorkerStopped)
    assert again.poll(T + 11) == []

    assert again.execute([Shrink(job, ("n3",))], T + 12) == []
    assert again.poll(T + 13) == [WorkerStopped(T + 13, job, "n3")]
    running_on(world, again, other, ("n2", "n3"), T + 14)


def restart_after_training_done(world: World) -> None:
    """A job whose training ended while no daemon ran is never reported live: either not at
    all, or JobSubmitted and JobEnded(COMPLETED) in one poll, so that the engine's Finish
    clears what the batch system still holds of it."""
    backend, job = setup(world, max_nodes=3)
    running_on(world, backend, job, ("n1", "n2"), T + 1)
    world.complete(job)
    again = world.backend()
    events = [e for e in again.poll(T + 5) if isinstance(e, (JobSubmitted, JobEnded))]
    if events:
        assert [type(e) for e in events] == [JobSubmitted, JobEnded]
        assert events[0].job.id == job
        assert events[1] == JobEnded(T + 5, job, EndReason.COMPLETED)
        assert again.execute([Finish(job)], T + 6) == []
    assert job not in again.jobs and not again.workers
    assert again.poll(T + 7) == [] and world.running(job) == set()
    other = world.submit(1, 3, "bob")
    assert [e.job.id for e in again.poll(T + 8)] == [other]
    running_on(world, again, other, ("n1", "n2", "n3"), T + 9)


def engine_drives_it(world: World) -> None:
    """The real Engine over the backend: it grows a job onto the idle nodes, and its view of
    which node runs which job stays the batch system's through a preemption and a cancel."""
    for name in ("n1", "n2", "n3"):
        world.add_node(name)
    job = world.submit(1, 2, "alice")
    backend = world.backend()
    engine = Engine(EngineConfig(profiling=False))

    def step(now: float) -> None:
        actions = engine.handle_many(backend.poll(now))
        while actions:
            actions = engine.handle_many(backend.execute(actions, now))

    step(T)
    step(T + 1)
    assert len(world.running(job)) == 2
    assert engine.node_map == {node: job for node in world.running(job)}
    taken = sorted(world.running(job))[0]
    world.take(taken)
    step(T + 2)
    assert taken not in world.running(job) and taken not in engine.idle_nodes
    step(T + 2.5)  # the job, whose probe the preemption cut short, is back at 2 on the idle node
    assert taken not in world.running(job) and len(world.running(job)) == 2
    assert engine.node_map == {node: job for node in world.running(job)}
    assert taken not in engine.idle_nodes
    world.cancel(job)
    step(T + 3)
    assert engine.node_map == {} and world.running(job) == set()
    assert engine.idle_nodes == {"n1", "n2", "n3"} - {taken}


SCENARIOS: dict[str, Callable[[World], None]] = {
    f.__name__: f for f in (submit_and_offer, grow_onto_idle_nodes, shrink, preemption,
                            shrink_while_starting, node_taken_while_starting,
                            node_taken_while_shrinking, training_done, cancelled_by_user,
                            cancelled_while_starting, finish_by_engine, reconcile_after_restart,
                            restart_after_training_done, engine_drives_it)
}
