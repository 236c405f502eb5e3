"""The Job Profiling Advisor (JPA): which scales to measure a job at, in which order, whose
nodes it may borrow, and the profiling runs in progress inside one engine.

A profiled job is scaled once to the largest scale it can get and then stepped down through
the powers of two below it (64, 32, 16, …; 53, 32, 16, …, within its bounds), each step
measured over one window of progress reports: on Polaris with Horovod a scale-up cost several
times a scale-down, so one expensive scale-up and cheap scale-downs are the paper's inverse
order. The order follows the costs actually measured:
where scale-ups have proved cheaper than scale-downs, the job starts small and steps up. The
job trains all along.

Nodes come from the free pool first. Where that is not enough, the JPA may borrow from ONE
running job at a time (the least recently interrupted), never leaving it below its minimum, so
no job is stopped to profile another and no two jobs are interrupted at once. A job that cannot
get even its minimum waits in the queue.

A running job whose curve stops below its maximum (it was profiled when few nodes were free,
or it reuses a model's curve measured on fewer nodes) is measured once more at the largest
scale it can reach, when that is at least twice what is known, so that the believed curve
above it rests on a measurement rather than on the bounded extrapolation alone. The store
keeps measured points only. Each scale a profile measures goes into the store at once: the
other jobs of the model start once the first point is there and take each further point as
their prior (:meth:`Advisor.share`). What a job's profile measured stays its prior, followed
by one factor while its later estimates agree (:func:`.curves.corrected_curve`). A user who
opts out of profiling and brings no curve gets one measurement at the largest scale
available, and linear scaling is assumed from there.

The choices that depend on no state (the scales, their order, the lender) are
:mod:`.scales`; the curve arithmetic is :mod:`.curves`; the store's side is :mod:`.learning`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

from ..model import Curve
from .config import EngineConfig, EngineStats, JobPhase
from .curves import measured_curve
from .jobs import JobRecord, Source
from .learning import StoreLearning
from .monitor import Monitor
from .pool import NodePool
from .scales import Lender, choose_lender, choose_upward, plan_scales

__all__ = ["Advisor", "Lender", "ProfileRun", "choose_lender", "choose_upward", "plan_scales"]


@dataclass
class ProfileRun:
    """One job's profiling in progress: the planned scales and where it stands.

    ``probe``: the single measurement of a job whose user assumes linear scaling;
    ``extension``: one more, larger scale for a running job; ``lender``: the running job whose
    nodes this run borrowed (at most one run borrows at a time).
    """

    job_id: str
    scales: list[int]
    upward: bool = False
    probe: bool = False
    extension: bool = False
    index: int = 0
    step_start: float = 0.0
    step_size: int = 0
    lender: str | None = None
    cut: int | None = None
    """The scale a reclaim cut the current step short of: once nodes are idle again before
    the smaller scale is measured, a one-scale run goes back up to it (:meth:`Advisor.restore`)."""

    @property
    def target(self) -> int:
        return self.scales[self.index]

    @property
    def finished(self) -> bool:
        return self.index >= len(self.scales)

    def truncate_to(self, size: int, now: float) -> None:
        """Measure at ``size`` now (the nodes above it are gone); later steps stay below it."""
        rest = [] if self.upward else [k for k in self.scales[self.index + 1:] if k < size]
        self.scales = self.scales[:self.index] + [size] + rest
        self.step_start = now


class Advisor(StoreLearning):
    """The JPA at work in one engine: starts, steps and ends profiling runs.

    It moves nodes only through the engine's :class:`NodePool`, so its moves become the same
    checkpoint/shrink/grow actions as the allocator's. Jobs it had to send back to the queue
    (a reclaim left them below their minimum before anything was measured) are listed in
    ``sent_back`` for the engine to requeue.
    """

    def __init__(self, config: EngineConfig, pool: NodePool, monitor: Monitor,
                 jobs: Mapping[str, JobRecord], store: MutableMapping[str, Curve],
                 stats: EngineStats) -> None:
        self.config = config
        self.pool = pool
        self.monitor = monitor
        self.jobs = jobs
        self.store = store
        self.stats = stats
        self.runs: dict[str, ProfileRun] = {}
        self.borrower: str | None = None
        self.sent_back: list[str] = []
        self.remeasured: set[tuple[str, int]] = set()  # (job, scale): measured again once
        self.seen: dict[str, object] = {}  # job -> (full scales, stored scales) found nothing new
        self.far_memo: dict[tuple[int, ...], dict[int, bool]] = {}

    def state_dict(self) -> dict[str, Any]:
        """The runs in progress and the loan as plain data (what it remembers only to save
        work is left out); :meth:`load_state_dict` reads it."""
        return {"runs": {job: dataclasses.asdict(run) for job, run in self.runs.items()},
                "borrower": self.borrower, "sent_back": list(self.sent_back),
                "remeasured": sorted([job, k] for job, k in self.remeasured)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take the state :meth:`state_dict` wrote."""
        self.runs = {str(job): ProfileRun(**run) for job, run in state["runs"].items()}
        self.borrower = state["borrower"]
        self.sent_back = [str(job) for job in state["sent_back"]]
        self.remeasured = {(str(job), int(k)) for job, k in state["remeasured"]}
        self.seen.clear()
        self.far_memo.clear()

    # ------------------------------------------------------------- queries
    def profiling_model(self, model: str) -> bool:
        """Whether a job declaring ``model`` must wait for the model's profile: a job of that
        model is being profiled and has measured nothing yet (once it has, the store holds
        the points so far and the waiting jobs start on them, :meth:`share`)."""
        return bool(model) and model not in self.store and any(
            self.jobs[jid].req.model == model and not run.probe
            for jid, run in self.runs.items())

    def due(self, now: float) -> bool:
        """Whether any run needs a step (a window complete, a step timed out, nodes lost)."""
        return any(self._step_due(run, now) for run in self.runs.values())

    def report_due(self, job_id: str, now: float) -> bool:
        """Whether the job is being profiled and its current step is due, or it measured a
        scale its model's stored curve should learn (:meth:`learn`)."""
        run = self.runs.get(job_id)
        if run is not None:
            return self._step_due(run, now)
        job = self.jobs.get(job_id)
        return job is not None and bool(self._new_points(job))

    def _step_due(self, run: ProfileRun, now: float) -> bool:
        size = len(self.jobs[run.job_id].nodes)
        if size != run.step_size or run.step_size != run.target:
            return True
        if self.monitor.window_done(run.job_id, run.target, run.step_start):
            return True
        return now - run.step_start > self.step_timeout_s()

    def step_timeout_s(self) -> float:
        """How long a step may wait for its window before the scale is skipped."""
        cfg = self.config
        costs = [c for c in self.monitor.typical_costs() if c is not None]
        rescale_s = max([cfg.default_scale_up_s, cfg.default_scale_down_s] + costs)
        return 3.0 * cfg.profile_window_s + 2.0 * rescale_s

    def _lenders(self, exclude: str) -> Iterable[Lender]:
        for job in self.jobs.values():
            if (job.phase is JobPhase.RUNNING and job.nodes and job.id != exclude
                    and job.id not in self.pool.delta):
                yield Lender(job.id, len(job.nodes) - job.req.min_nodes, job.last_interrupted,
                             job.order)

    def reachable(self, job: JobRecord) -> tuple[int, Lender | None]:
        """The largest scale ``job`` could have now (its nodes, the free ones, one lender's
        spare) and the lender it would need."""
        want = job.req.max_nodes
        have = len(job.nodes) + len(self.pool.free)
        lender = None
        if have < want and self.borrower is None:
            lender = choose_lender(self._lenders(job.id))
        spare = min(want - have, lender.spare) if lender else 0
        return min(want, have + spare), lender

    # ------------------------------------------------------------- starting runs
    def start(self, job: JobRecord, now: float) -> bool:
        """Profile a queued job (or probe it once); ``False`` if it cannot get its minimum."""
        req = job.req
        probe = not (self.config.profiling and req.profile)
        top, lender = self.reachable(job)
        if top < req.min_nodes:
            return False
        up_s, down_s = self.monitor.typical_costs()
        upward = not probe and choose_upward(up_s, down_s, self.config.default_scale_up_s,
                                             self.config.default_scale_down_s)
        scales = [top] if probe else plan_scales(top, req.min_nodes, upward)
        self._launch(job, ProfileRun(req.id, scales, upward=upward, probe=probe), lender, now)
        return True

    def extend(self, now: float) -> None:
        """Measure one larger scale of at most one running job whose curve stops short."""
        if not self.config.profiling or (self.borrower is not None and not self.pool.free):
            return
        spare_bound: int | None = None
        for job in self.jobs.values():
            if (job.phase is not JobPhase.RUNNING or job.id in self.pool.delta
                    or job.source not in (Source.PROFILED, Source.STORE)):
                continue
            known = job.known_top(self.monitor)
            if known >= job.req.max_nodes:
                continue
            if spare_bound is None:  # what any one lender could give: bounds reachable()
                spare_bound = 0 if self.borrower is not None else max(
                    (lender.spare for lender in self._lenders("")), default=0)
            need = max(2 * known, job.req.min_nodes)
            if len(job.nodes) + len(self.pool.free) + spare_bound < need:
                continue  # cannot reach twice what is known: skip the lender search
            top, lender = self.reachable(job)
            if top >= max(2 * known, job.req.min_nodes):
                self._launch(job, ProfileRun(job.id, [top], extension=True), lender, now)
                self.stats.profile_extensions += 1
                return

    def restore(self, now: float) -> None:
        """Nodes the allocation left idle go back to a one-scale run (a probe, an extension)
        whose step a reclaim cut short before the smaller scale was measured: the scale is the
        point of such a run, so it measures it after all rather than leave the nodes idle for a
        window (a job that does not report: for the step's whole timeout, 58 s in
        bench/e2e.py). Only nodes nobody else was given. A profiling run's cut step is measured
        where it is, its next steps being smaller anyway (restoring it too cost 0.2 point of
        UB_oracle on a 2-day Summit replay: 96.6 against 96.8 %)."""
        for run in list(self.runs.values()):
            free = len(self.pool.free)
            job = self.jobs[run.job_id]
            size = len(job.nodes)
            if not free or run.cut is None or run.finished or size != run.target \
                    or run.target >= run.cut or not (run.probe or run.extension):
                continue
            run.scales[run.index] = min(run.cut, size + free)
            if run.target == run.cut:
                run.cut = None
            self._move(run, job, now)

    def remeasure(self, now: float) -> None:
        """Measure again, on nodes the allocation left idle, a larger scale of one running
        job whose estimate there is partial and no better than at its current scale: a window
        cut short (a preemption, a slow restart) must not keep the job from growing for ever
        while nodes go unused."""
        free = len(self.pool.free)
        if not self.config.profiling or not free or self.borrower is not None:
            return
        for job in self.jobs.values():
            if job.phase is not JobPhase.RUNNING or job.id in self.pool.delta or not job.nodes:
                continue
            size = len(job.nodes)
            rates = self.monitor.throughput(job.id)
            here = rates.get(size)
            if here is None:
                continue
            for k in sorted(self.monitor.provisional(job.id)):
                if (size < k <= min(size + free, job.req.max_nodes) and rates[k] <= here
                        and (job.id, k) not in self.remeasured):
                    self.remeasured.add((job.id, k))
                    self._launch(job, ProfileRun(job.id, [k], extension=True), None, now)
                    self.stats.profile_extensions += 1
                    return

    def _launch(self, job: JobRecord, run: ProfileRun, lender: Lender | None,
                now: float) -> None:
        run.step_start = now
        self.runs[job.id] = run
        job.phase = JobPhase.PROFILING
        if lender is not None and run.target > len(job.nodes) + len(self.pool.free):
            run.lender, self.borrower = lender.job_id, job.id
        self._move(run, job, now)

    # ------------------------------------------------------------- stepping
    def advance(self, now: float) -> None:
        """Step every run that is due: next scale, or the end of profiling; then let the store
        learn what running jobs measured (:meth:`learn`)."""
        for job_id in list(self.runs):
            self._step(self.runs[job_id], now)
        self.learn()

    def _step(self, run: ProfileRun, now: float) -> None:
        job = self.jobs[run.job_id]
        size = len(job.nodes)
        if size < run.step_size:  # a reclaim took nodes from the job being profiled
            if size < job.req.min_nodes:
                for name in self.pool.longest_lived(self.pool.free, run.step_size - size, now):
                    self.pool.assign(run.job_id, name)
                size = len(job.nodes)
            if size < job.req.min_nodes:
                self._end(job, run, aborted=True)
                return
            run.cut = max(run.cut or 0, run.target)
            run.truncate_to(size, now)
            run.step_size = size
            return
        if size != run.target:
            self._move(run, job, now)
            return
        if self.monitor.window_done(run.job_id, size, run.step_start):
            run.index += 1
            if not (run.probe or run.extension):
                self.share(job, measured_curve(self.settled(job.id)))
        elif now - run.step_start > self.step_timeout_s():
            run.index += 1  # no window at this scale (the job does not report): skip it
        else:
            return
        run.cut = None  # the cut step is over: the next ones are planned, not restored
        if run.finished:
            self._end(job, run)
        else:
            self._move(run, job, now)

    def _move(self, run: ProfileRun, job: JobRecord, now: float) -> None:
        """Bring the job to the run's current scale."""
        target, size = run.target, len(job.nodes)
        if target < size:
            for name in self.pool.shortest_lived(job.nodes, size - target, now):
                self.pool.release(job.id, name)
        elif target > size:
            for name in self.pool.longest_lived(self.pool.free, target - size, now):
                self.pool.assign(job.id, name)
            self._borrow(run, job, target - len(job.nodes), now)
            got = len(job.nodes)
            if got < target:
                if got < job.req.min_nodes or got <= size:
                    self._end(job, run, aborted=got < job.req.min_nodes)
                    return
                run.truncate_to(got, now)
        run.step_size = len(job.nodes)
        run.step_start = now

    def _borrow(self, run: ProfileRun, job: JobRecord, short: int, now: float) -> None:
        if short <= 0:
            return
        if run.lender is None and self.borrower is None:
            best = choose_lender(self._lenders(job.id))
            if best is not None:
                run.lender, self.borrower = best.job_id, job.id
        lender = self.jobs.get(run.lender) if run.lender else None
        if lender is None or lender.phase is not JobPhase.RUNNING:
            return
        give = min(short, len(lender.nodes) - lender.req.min_nodes)
        for name in self.pool.shortest_lived(lender.nodes, max(0, give), now):
            self.pool.release(lender.id, name)
            self.pool.assign(job.id, name)

    # ------------------------------------------------------------- ending runs
    def _end(self, job: JobRecord, run: ProfileRun, aborted: bool = False) -> None:
        self.drop(job.id)
        measured = self.monitor.throughput(job.id)
        if aborted and not measured and job.prior is None and not run.extension:
            for name in sorted(job.nodes):
                self.pool.release(job.id, name)
            job.phase = JobPhase.QUEUED
            self.sent_back.append(job.id)
            return
        job.phase = JobPhase.RUNNING
        if run.extension:
            self.remember(job)
            return
        self.stats.profiled += 1
        if run.probe and measured:
            k0 = max(measured)
            job.set_source(Source.LINEAR, probe_point=(k0, measured[k0]))
        elif measured:
            # What profiling measured is the job's prior from now on, followed like a stored
            # curve: one factor while its estimates agree with it (curves.corrected_curve).
            # Rebuilt from the monitor at every report, the curve took each new noisy estimate
            # at the running scale into its slopes (0.13 point of UB_oracle and 960 rescales on
            # a 2-day Summit replay, in place).
            job.set_source(Source.PROFILED, prior=measured_curve(self.settled(job.id)))
            self.remember(job)
        else:
            job.set_source(Source.ASSUMED)

    def drop(self, job_id: str) -> None:
        """Forget the job's run (it ended, or its profiling did) and any loan it held."""
        self.runs.pop(job_id, None)
        if self.borrower == job_id:
            self.borrower = None
