"""A tiny fake of training jobs on a batch system, to drive the engine in tests.

Each job has a true throughput ``truth(time, k)``; while it runs on k ≥ min nodes and is not
restarting it gains ``truth · dt`` samples per step and reports them cumulatively with its
world size. A rescale stops progress for the job's restart delay (the first report at the new
scale comes after it). The fake also checks, for every batch of actions, the engine's
invariants: actions name only nodes the engine had free or held, no job gains and loses nodes
at once, a running job is checkpointed before a planned rescale, and no node serves two jobs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from malletrain_core.engine import Engine, JobPhase
from malletrain_core.events import (
    Action,
    Checkpoint,
    Event,
    Finish,
    Grow,
    IdleNode,
    JobRequest,
    JobSubmitted,
    NodesIdle,
    NodesReclaimed,
    ProgressReport,
    Shrink,
)
from malletrain_core.model import Curve

Truth = Callable[[float, int], float]


def curve_truth(curve: Curve) -> Truth:
    return lambda _t, k: curve.at(k)


@dataclass
class FakeJob:
    request: JobRequest
    truth: Truth
    up_s: float = 20.0
    down_s: float = 10.0
    nodes: set[str] = field(default_factory=set)
    samples: float = 0.0
    resume_at: float = 0.0
    rescales: int = 0


def check_actions(engine: Engine, before_free: frozenset[str], before_map: dict[str, str],
                  actions: Sequence[Action], events: Sequence[Event] = ()) -> None:
    """Assert the engine's invariants on one batch of actions (the answer to ``events``)."""
    finished = {a.job_id for a in actions if isinstance(a, Finish)}
    gone = {n for e in events if isinstance(e, NodesReclaimed) for n in e.nodes}
    usable = set(before_free) | {n for n, j in before_map.items() if j in finished}
    for event in events:
        if isinstance(event, NodesIdle):
            usable |= {n.name for n in event.nodes if n.name not in before_map}
        if isinstance(event, NodesReclaimed):
            usable -= set(event.nodes)
    shrunk: dict[str, set[str]] = {}
    grown: dict[str, set[str]] = {}
    checkpointed: set[str] = set()
    seen_grow = False
    for action in actions:
        if isinstance(action, Checkpoint):
            assert not shrunk and not seen_grow, "checkpoints come before every rescale"
            checkpointed.add(action.job_id)
        elif isinstance(action, Shrink):
            assert not seen_grow, "shrinks come before grows"
            for node in action.nodes:
                assert before_map.get(node) == action.job_id, f"{node} not held by {action.job_id}"
            shrunk.setdefault(action.job_id, set()).update(action.nodes)
        elif isinstance(action, Grow):
            seen_grow = True
            released = set().union(*shrunk.values()) if shrunk else set()
            for node in action.nodes:
                assert node in usable or node in released, f"{node} was neither free nor released"
            assert action.time_limit_s is not None and action.time_limit_s >= 0
            grown.setdefault(action.job_id, set()).update(action.nodes)
    assert not set(shrunk) & set(grown), "keep rule: no job both gains and loses nodes"
    for job_id in set(shrunk) | set(grown):
        had = sum(1 for n, j in before_map.items() if j == job_id and n not in gone)
        if had > len(shrunk.get(job_id, ())) or (had and job_id in grown):
            assert job_id in checkpointed, f"{job_id} rescaled without a checkpoint"
    all_grown = [n for nodes in grown.values() for n in nodes]
    assert len(all_grown) == len(set(all_grown)), "a node granted twice"
    owners: dict[str, str] = {}
    for job_id, view in engine.jobs.items():
        for node in view.nodes:
            assert node not in owners, f"{node} held by {owners[node]} and {job_id}"
            owners[node] = job_id
        if view.nodes and view.phase is not JobPhase.DONE:
            assert view.min_nodes <= len(view.nodes) <= view.max_nodes, f"{job_id} out of bounds"
    assert owners == dict(engine.node_map)
    assert not set(owners) & engine.idle_nodes


class FakeCluster:
    """Plays jobs for an engine and checks every batch of actions it returns."""

    def __init__(self, engine: Engine, report_every_s: float = 10.0) -> None:
        self.engine = engine
        self.dt = report_every_s
        self.now = 0.0
        self.jobs: dict[str, FakeJob] = {}
        self.actions: list[Action] = []

    def send(self, *events: Event) -> list[Action]:
        before_free = self.engine.idle_nodes
        before_map = dict(self.engine.node_map)
        actions = self.engine.handle_many(events)
        check_actions(self.engine, before_free, before_map, actions, events)
        self._apply(actions)
        self.actions.extend(actions)
        return actions

    def idle(self, names: Iterable[str], hole_s: float | None = None) -> list[Action]:
        end = None if hole_s is None else self.now + hole_s
        return self.send(NodesIdle(self.now, tuple(IdleNode(n, end) for n in names)))

    def reclaim(self, names: Iterable[str]) -> list[Action]:
        names = tuple(names)
        for job in self.jobs.values():
            lost = job.nodes & set(names)
            if lost:
                job.nodes -= lost
                job.resume_at = self.now + job.down_s
        return self.send(NodesReclaimed(self.now, names))

    def submit(self, request: JobRequest, truth: Truth, up_s: float = 20.0,
               down_s: float = 10.0) -> list[Action]:
        self.jobs[request.id] = FakeJob(request, truth, up_s, down_s)
        return self.send(JobSubmitted(self.now, request))

    def _apply(self, actions: Sequence[Action]) -> None:
        for action in actions:
            job = self.jobs.get(action.job_id)
            if job is None:
                continue
            if isinstance(action, (Grow, Shrink)):
                had = len(job.nodes)
                if isinstance(action, Grow):
                    job.nodes |= set(action.nodes)
                else:
                    job.nodes -= set(action.nodes)
                job.rescales += 1
                job.resume_at = self.now + (job.up_s if len(job.nodes) > had or had == 0
                                            else job.down_s)
            elif isinstance(action, Finish):
                job.nodes.clear()

    def run(self, seconds: float) -> None:
        """Advance time in report steps; every running job reports at each step."""
        end = self.now + seconds
        while self.now + self.dt <= end + 1e-9:
            self.now += self.dt
            reports: list[Event] = []
            for job_id, job in self.jobs.items():
                k = len(job.nodes)
                if k < job.request.min_nodes or self.now < job.resume_at:
                    continue
                gained = min(self.dt, self.now - job.resume_at)
                job.samples += job.truth(self.now, k) * gained
                reports.append(ProgressReport(self.now, job_id, job.samples, k))
            for report in reports:
                self.send(report)
