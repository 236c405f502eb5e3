"""What the Job Profiling Advisor keeps of measured curves: the per-model curve store, shared
with the model's running jobs as their prior, and what it learns from them.

Each scale a profile measures goes into the store at once, so the model's other jobs start
on the first point and take each further one (:meth:`StoreLearning.share`); a running job's
full-window estimate at a scale the store lacks fills the gaps a cut profile left, and one at
a scale of the profile's ladder replaces the stand-ins a cut profile measured near it
(:meth:`StoreLearning.learn`). The store keeps measured points only.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping

from .. import shortcuts
from ..model import Curve
from .config import JobPhase
from .curves import corrected_curve, measured_curve, merge_curves
from .jobs import JobRecord, Source
from .monitor import Monitor

GAP = 1.5
"""A running job's measurement joins its model's stored curve only at least this factor away
from every stored scale (:meth:`StoreLearning.learn`)."""


def on_ladder(k: int) -> bool:
    """Whether scale ``k`` is one the profile's ladder measures below its top (a power of two,
    :func:`.scales.plan_scales`)."""
    return k >= 1 and k & (k - 1) == 0


class StoreLearning:
    """The store side of :class:`~.profiler.Advisor` (a mixin: the advisor holds the state)."""

    monitor: Monitor
    jobs: Mapping[str, JobRecord]
    store: MutableMapping[str, Curve]
    seen: dict[str, object]
    """Job -> (its count of full-window scales, its model's stored scales) when the store
    last found nothing new in it."""
    far_memo: dict[tuple[int, ...], dict[int, bool]]
    """Stored curve's scales -> scale -> :meth:`_is_far` (see :meth:`_far_from`)."""

    def learn(self) -> None:
        """Add to a model's stored curve a scale a running job of the model measured over a
        full window, where the store has no point within :data:`GAP` of it.

        A reclaim that cuts a profile short leaves its model's curve with the scales measured
        so far (on a 2-day Summit replay, seed 1: two models with 32 and 64 nodes only, every
        smaller scale believed linear below 32, 25 % under the truth at one node). The jobs of
        the model run at many scales anyway; what they measure there fills the gaps without
        a dedicated probe. Scales closer to a stored one are left out: two estimates a few
        nodes apart would put their noise into the slope between them. A scale above the
        largest stored one is taken however close: the curve there is an extrapolation.

        A scale of the profile's ladder (a power of two, :func:`.scales.plan_scales`) the
        store lacks is taken however close too, and replaces the stored scales off the ladder
        within :data:`GAP` of it: those are what a reclaim left a cut profile (25 for 32, 12
        for 16), stand-ins between which the linear curve misses the bend at the planned scale
        (on a Theta window of the profiler sweep: AlexNet's curve 4 % low at 32 nodes, between
        25 and 40)."""
        for job in self.jobs.values():
            new = self._new_points(job)
            if new:
                self._drop_stand_ins(job.req.model, new)
                self.share(job, measured_curve(new))

    def _drop_stand_ins(self, model: str, new: Mapping[int, float]) -> None:
        """Remove from ``model``'s stored curve the scales off the ladder within :data:`GAP`
        of a ladder scale in ``new`` (see :meth:`learn`)."""
        ladder = [k for k in new if on_ladder(k)]
        old = self.store[model]
        keep = [(k, p) for k, p in zip(old.nodes, old.throughput)
                if on_ladder(k) or not any(s / GAP < k < s * GAP for s in ladder)]
        if ladder and keep and len(keep) < len(old.nodes):
            self.store[model] = Curve(tuple(k for k, _ in keep), tuple(p for _, p in keep))

    def _new_points(self, job: JobRecord) -> dict[int, float]:
        """The job's full-window estimates its model's stored curve lacks (see :meth:`learn`)."""
        model = job.req.model
        if (job.phase is not JobPhase.RUNNING or not model or model not in self.store
                or job.source not in (Source.PROFILED, Source.STORE)):
            return {}
        stored = self.store[model].nodes
        # Whether anything is new depends only on which scales have a full window (a set that
        # only grows, so its size names it) and on the stored scales, not on the estimates:
        # the job's next reports, which move its estimates, need not be looked at again.
        key = (self.monitor.full_count(job.id), stored)
        if self.seen.get(job.id) == key:
            if shortcuts.CHECKED:
                shortcuts.check("learning.unchanged", {}, self._far_points(job, stored))
            return {}
        new = self._far_points(job, stored)
        if not new:
            self.seen[job.id] = key  # nothing to learn until a scale or the store is new
        return new

    def _far_points(self, job: JobRecord, stored: tuple[int, ...]) -> dict[int, float]:
        """The job's full-window estimates at scales :data:`GAP` away from ``stored``."""
        far = self._far_from(stored)
        new = {}
        for k, v in self.settled(job.id, full_only=True).items():
            ok = far.get(k)
            if ok is None:
                ok = far[k] = self._is_far(k, stored)
            if ok:
                new[k] = v
        return new

    @staticmethod
    def _is_far(k: int, stored: tuple[int, ...]) -> bool:
        # above the largest stored scale the curve is an extrapolation (its marginal rate
        # halved per doubling), far worse than one estimate's noise: a measurement there counts;
        # so does a ladder scale the store lacks (see learn)
        return (k > max(stored) or (on_ladder(k) and k not in stored)
                or all(not s / GAP < k < s * GAP for s in stored))

    def _far_from(self, stored: tuple[int, ...]) -> dict[int, bool]:
        """Scale → whether it is :data:`GAP` away from every scale of ``stored``, remembered
        per stored curve: this check runs for every job at every report and re-plan (28 % of
        a month's replay in the what-if profile), over few distinct scales and curves."""
        if stored not in self.far_memo and len(self.far_memo) >= 256:
            self.far_memo.clear()  # curves the store no longer holds: bounded for a daemon
        return self.far_memo.setdefault(stored, {})

    def settled(self, job_id: str, full_only: bool = False) -> dict[int, float]:
        """The job's estimates over a full window (all of them where none is full, unless
        ``full_only``)."""
        measured = self.monitor.throughput(job_id)
        partial = self.monitor.provisional(job_id)
        full = {k: v for k, v in measured.items() if k not in partial}
        return full if full or full_only else measured

    def remember(self, job: JobRecord) -> None:
        """Merge what the job measured (never an extrapolated point) into its model's stored
        curve."""
        if not job.req.model or job.source not in (Source.PROFILED, Source.STORE):
            return
        measured = self.monitor.throughput(job.id)
        curve: Curve | None
        if job.source == Source.PROFILED:
            curve = measured_curve(self.settled(job.id))
        elif job.prior is not None and measured:
            curve = corrected_curve(job.prior, measured, extrapolate=False)
        else:
            curve = job.prior
        if job.source == Source.PROFILED:
            self.share(job, curve)
        elif curve is not None:
            self.store[job.req.model] = merge_curves(self.store.get(job.req.model), curve)

    def share(self, job: JobRecord, curve: Curve | None) -> None:
        """Store what a job being (or just) profiled has measured, and make it the prior of
        the running jobs of its model that started on the store.

        Jobs of a model being profiled waited for the whole profile, seven windows and their
        rescales from 64 nodes down: at the start of a 2-day Summit replay 43 of 50 jobs
        waited while most of the idle nodes stayed idle. They now start once the profile has
        its first point (the largest scale: linear below it, their own reports correct it)
        and take each further point as it is measured."""
        model = job.req.model
        if not model or curve is None:
            return
        self.store[model] = stored = merge_curves(self.store.get(model), curve)
        for other in self.jobs.values():
            if (other.req.model == model and other.source in (Source.STORE, Source.PROFILED)
                    and other.phase is not JobPhase.DONE and other.prior is not stored):
                other.set_source(other.source, stored)
