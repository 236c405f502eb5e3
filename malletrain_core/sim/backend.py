"""The simulated batch system: a trace of idle nodes and performance-model jobs.

:class:`SimBackend` implements the :class:`~malletrain_core.backends.base.Backend` protocol, so
the Engine drives it exactly as it drives Slurm: ``poll(now)`` returns what happened up to
``now`` (nodes idle or reclaimed, jobs submitted, progress reports, jobs completed) and
``execute(actions, now)`` carries out grows, shrinks, checkpoints and finishes, answering with
worker confirmations. A reclaimed node kills the worker on it before the engine hears of it,
as on a real machine. Nothing here knows which policy the engine plays.

Grow time limits are not enforced: the traces give no hole ends, so every grow carries the
engine's default limit (72 h), far beyond the idle fragments of the traces used here.
"""

from __future__ import annotations

import heapq
import logging
import math
from collections import defaultdict
from collections.abc import Sequence

import numpy as np

from ..events import (
    Action,
    Checkpoint,
    EndReason,
    Event,
    Finish,
    Grow,
    IdleNode,
    JobEnded,
    JobRequest,
    JobSubmitted,
    NodesIdle,
    NodesReclaimed,
    ProgressReport,
    Shrink,
    WorkerStarted,
    WorkerStopped,
)
from ..interfaces import Backend
from .perfmodel import JobModel, PerfParams
from .traces import Trace
from .workloads import SimJob

log = logging.getLogger(__name__)

_SUBMIT, _REPORT, _COMPLETE, _SAMPLE = range(4)


class SimBackend(Backend):
    """A trace-driven cluster running :class:`JobModel` jobs; ``samples`` timeline points
    (evenly spaced over the trace) record used nodes and net progress for the plots."""

    name = "sim"

    def __init__(self, trace: Trace, jobs: Sequence[SimJob], requests: Sequence[JobRequest],
                 params: PerfParams | None = None, seed: int = 0, samples: int = 400,
                 confirmations: bool = True, hole_ends: bool = False) -> None:
        if len(jobs) != len(requests):
            raise ValueError("one request per job")
        self.trace = trace
        self.params = params or PerfParams()
        self.confirmations = confirmations
        self._names = trace.node_names
        self._ends = reclaim_times(trace) if hole_ends else None
        self._open = [IdleNode(name) for name in self._names] if self._ends is None else []
        """Without hole ends, each node's IdleNode is the same value at every offer: built
        once (a month at 4,000 nodes offers nodes millions of times)."""
        self.idle: set[str] = set()
        self.owner: dict[str, str] = {}
        self.held: dict[str, set[str]] = {}
        self.joining: dict[str, set[str]] = defaultdict(set)
        """In place: a job's nodes whose processes are still starting to join its group."""
        self.models: dict[str, JobModel] = {}
        self._version: dict[str, int] = {}
        self._heap: list[tuple[float, int, int, str, int]] = []
        self._seq = 0
        self._step = 0
        self._initial_pending = True
        self.invalid_actions = 0
        self.now = trace.start
        for i, spec in enumerate(jobs):
            rng = np.random.default_rng([seed, i, 3])
            self.models[spec.id] = JobModel(spec, self.params, rng)
            self.held[spec.id] = set()
            self._version[spec.id] = 0
            self._push(max(spec.submit_time, trace.start), _SUBMIT, spec.id, 0)
        self._requests = {r.id: r for r in requests}
        n = max(samples, 1)
        self.sample_times = trace.start + trace.span_s * np.arange(1, n + 1) / n
        self.sample_net = np.zeros(n)
        self.sample_node_s = np.zeros(n)
        self._sample_i = 0
        for k, t in enumerate(self.sample_times[:-1]):
            self._push(float(t), _SAMPLE, "", k)

    # -- scheduling --------------------------------------------------------------------------

    def _push(self, t: float, kind: int, job: str, version: int) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, kind, job, version))

    def _reschedule(self, job: str, t: float, first: bool) -> None:
        """New report and completion timers for ``job`` after its rate changed at ``t``."""
        self._version[job] += 1
        v = self._version[job]
        m = self.models[job]
        if m.world == 0 or m.done_time is not None:
            return
        p = self.params
        period = p.report_fast_s if first or t - m.restart_t < p.fast_window_s else \
            p.report_slow_s
        delay = m.costs.first_report_s
        if first and delay is not None:  # the first report once training resumes
            self._push(max(t, m.stall_until) + delay, _REPORT, job, v)
        else:
            self._push(t + period, _REPORT, job, v)
        if m.spec.work is not None:
            dt = m.time_to_progress(m.spec.work)
            if math.isfinite(dt):
                self._push(t + dt, _COMPLETE, job, v)

    def next_time(self) -> float | None:
        """The time of the next thing that happens, or ``None`` when nothing is left."""
        if self._initial_pending:
            return self.trace.start
        candidates = []
        if self._step < self.trace.steps:
            candidates.append(float(self.trace.times[self._step]))
        if self._heap:
            candidates.append(self._heap[0][0])
        return min(candidates) if candidates else None

    def _step_ends(self, s: int) -> list[float]:
        """When each node that became idle at step ``s`` is taken back (the trace knows)."""
        assert self._ends is not None
        lo, hi = int(self.trace.offsets[s]), int(self.trace.offsets[s + 1])
        return self._ends[0][lo:hi][self.trace.idle[lo:hi]].tolist()

    # -- the Backend protocol ----------------------------------------------------------------

    def poll(self, now: float) -> list[Event]:
        """Everything that happened up to ``now``, in time order."""
        self.now = now
        events: list[Event] = []
        if self._initial_pending:
            self._initial_pending = False
            initial = self.trace.initial.tolist()
            names = [self._names[i] for i in initial]
            self.idle.update(names)
            if names:
                events.append(NodesIdle(self.trace.start, self._offered(
                    initial, names, None if self._ends is None
                    else self._ends[1][self.trace.initial].tolist())))
        trace = self.trace
        while self._step < trace.steps and trace.times[self._step] <= now:
            t, added, removed = trace.step(self._step)
            self._step += 1
            if len(removed):
                gone = [self._names[i] for i in removed.tolist()]
                self._reclaim(t, gone)
                events.append(NodesReclaimed(t, tuple(gone)))
            if len(added):
                indices = added.tolist()
                fresh = [self._names[i] for i in indices]
                self.idle.update(fresh)
                events.append(NodesIdle(t, self._offered(
                    indices, fresh, None if self._ends is None
                    else self._step_ends(self._step - 1))))
        while self._heap and self._heap[0][0] <= now:
            t, _, kind, job, version = heapq.heappop(self._heap)
            if kind == _SAMPLE:
                self._sample(t, version)
            elif kind == _SUBMIT:
                events.append(JobSubmitted(t, self._requests[job]))
            elif version == self._version[job]:
                ev = self._report(t, job) if kind == _REPORT else self._complete(t, job)
                if ev is not None:
                    events.append(ev)
        return events

    def _offered(self, indices: list[int], names: list[str],
                 ends: list[float] | None) -> tuple[IdleNode, ...]:
        """The IdleNodes of nodes ``indices`` (named ``names``), with their holes' ``ends``
        where the trace tells them."""
        if ends is None:
            opened = self._open
            return tuple([opened[i] for i in indices])
        return tuple(IdleNode(n, _end(e)) for n, e in zip(names, ends))

    def execute(self, actions: Sequence[Action], now: float) -> list[Event]:
        """Carry out the engine's actions at ``now``; returns worker confirmations."""
        started: dict[str, list[str]] = defaultdict(list)
        stopped: dict[str, list[str]] = defaultdict(list)
        for action in actions:
            job = action.job_id
            model = self.models.get(job)
            if model is None or model.done_time is not None:
                if isinstance(action, (Grow, Shrink)):
                    self.invalid_actions += 1
                continue
            if isinstance(action, Checkpoint):
                # In place the epoch coordinator saves only before a change that cannot be
                # in place (the model's rescale does); the engine's order changes nothing.
                if not model.costs.inplace:
                    model.checkpoint(now)
            elif isinstance(action, Finish):
                model.finish(now)
                self._release(job)
                self._version[job] += 1
            elif isinstance(action, Shrink):
                for name in action.nodes:
                    if self.owner.get(name) == job:
                        del self.owner[name]
                        self.held[job].discard(name)
                        stopped[job].append(name)
                    else:
                        self.invalid_actions += 1
            elif isinstance(action, Grow):
                for name in action.nodes:
                    if name in self.idle and name not in self.owner:
                        self.owner[name] = job
                        self.held[job].add(name)
                        started[job].append(name)
                    else:
                        self.invalid_actions += 1
        if self.invalid_actions and (started or stopped):
            log.debug("%d actions named nodes that were not available", self.invalid_actions)
        confirmations: list[Event] = []
        for job in dict.fromkeys([*stopped, *started]):
            model = self.models[job]
            if len(self.held[job]) != model.world:
                if model.costs.inplace:
                    self._change_in_place(job, now, stopped.get(job, []),
                                          started.get(job, []))
                else:
                    model.rescale(now, len(self.held[job]))
                self._reschedule(job, now, first=True)
            if self.confirmations:
                confirmations.extend(WorkerStopped(now, job, n) for n in stopped.get(job, ()))
                confirmations.extend(WorkerStarted(now, job, n) for n in started.get(job, ()))
        return confirmations

    def _joiners(self, job: str, t: float) -> set[str]:
        """``job``'s nodes still starting to join at ``t`` (none once its join is over: the
        model ends a join at the change that leaves no joiner)."""
        joining = self.joining[job]
        if joining and self.models[job].join_until <= t:
            joining.clear()
        return joining

    def _joiners_gone(self, job: str, t: float, names: list[str]) -> int:
        """How many of ``names``, leaving ``job`` at ``t``, had not joined yet."""
        joining = self._joiners(job, t)
        gone = len(joining.intersection(names))
        joining.difference_update(names)
        return gone

    def _change_in_place(self, job: str, t: float, stopped: list[str],
                         started: list[str]) -> None:
        """A planned change of an in-place job: the nodes let go (saying which had not
        joined), then the nodes added, which join the group if it is running."""
        model = self.models[job]
        if stopped:
            model.rescale(t, model.world - len(stopped),
                          joiners_gone=self._joiners_gone(job, t, stopped))
        if started:
            joining = self._joiners(job, t)  # before the grow starts a join of its own
            joiners = model.world > 0
            model.rescale(t, model.world + len(started))
            if joiners:
                joining.update(started)

    # -- what the trace and the jobs do ------------------------------------------------------

    def _reclaim(self, t: float, names: list[str]) -> None:
        lost: dict[str, list[str]] = defaultdict(list)
        for name in names:
            self.idle.discard(name)
            job = self.owner.pop(name, None)
            if job is not None:
                self.held[job].discard(name)
                lost[job].append(name)
        for job, gone in lost.items():
            self.models[job].preempt(t, len(self.held[job]),
                                     joiners_gone=self._joiners_gone(job, t, gone))
            self._reschedule(job, t, first=True)

    def _release(self, job: str) -> None:
        for name in self.held[job]:
            self.owner.pop(name, None)
        self.held[job] = set()
        self.joining[job].clear()

    def _report(self, t: float, job: str) -> Event | None:
        m = self.models[job]
        m.advance(t)
        restarting = m.restarting  # the noise's draw leaves it as it is
        event = None
        if not restarting:
            event = ProgressReport(t, job, m.progress, m.world, m.epoch)
            m.redraw_noise()
        self._reschedule(job, t, first=restarting)
        return event

    def _complete(self, t: float, job: str) -> Event | None:
        m = self.models[job]
        m.advance(t)
        work = m.spec.work
        if work is None or m.progress < work * (1 - 1e-9) - 1e-6:
            self._reschedule(job, t, first=False)
            return None
        m.progress = max(m.progress, work)
        m.finish(t)
        self._release(job)
        self._version[job] += 1
        return JobEnded(t, job, EndReason.COMPLETED)

    def _sample(self, t: float, k: int) -> None:
        self.settle(t)
        self._record(k)

    def _record(self, k: int) -> None:
        self.sample_net[k] = sum(m.net for m in self.models.values())
        self.sample_node_s[k] = sum(m.node_s for m in self.models.values())

    def settle(self, t: float) -> None:
        """Bring every job's accounting up to ``t``."""
        for m in self.models.values():
            if m.done_time is None and m.t < t:
                m.advance(t)

    def close(self) -> None:
        """End of the trace: account every job up to its end and take the last sample."""
        self.settle(self.trace.end)
        self._record(len(self.sample_times) - 1)


def _end(t: float | None) -> float | None:
    return None if t is None or math.isinf(t) else t


def reclaim_times(trace: Trace) -> tuple[np.ndarray, np.ndarray]:
    """The true end of every idle hole of ``trace``: (for each transition, the time of the
    node's next transition; for each node, its first transition), ``inf`` where none follows.

    Given as hole ends to a clairvoyant engine, an upper reference for reclaim prediction.
    """
    t = np.repeat(trace.times, np.diff(trace.offsets))
    nodes = np.asarray(trace.nodes)
    order = np.lexsort((t, nodes))
    following = np.full(len(nodes), np.inf)
    if len(order) > 1:
        same = nodes[order[1:]] == nodes[order[:-1]]
        following[order[:-1][same]] = t[order[1:]][same]
    first = np.full(len(trace.node_names), np.inf)
    if len(order):
        is_first = np.ones(len(order), dtype=bool)
        is_first[1:] = nodes[order[1:]] != nodes[order[:-1]]
        first[nodes[order[is_first]]] = t[order[is_first]]
    return following, first
