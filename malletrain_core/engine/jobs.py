"""One job's record inside an engine: its request, phase, nodes, where its believed curve comes
from, and the allocator's view of it (rebuilt only when something it depends on changed)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from ..events import JobRequest
from ..model import Curve, Job
from .config import EngineConfig, JobPhase, JobView
from .curves import (
    ASSUMED_RATE_PER_NODE,
    conservative_curve,
    corrected_curve,
    linear_curve,
    top_scale,
)
from .monitor import Monitor


class Source:
    """Where a job's believed curve comes from."""

    USER = "user"
    """Supplied at submission."""
    STORE = "store"
    """Measured earlier for a job of the same declared model."""
    PROFILED = "profiled"
    """Measured by the profiler for this job (the points measured by the end of profiling are
    its prior)."""
    LINEAR = "linear"
    """Assumed linear from the job's first measured scale (no profiling)."""
    ASSUMED = "assumed"
    """Nothing measured yet: a placeholder linear curve until reports arrive."""


def curve_state(curve: Curve | None) -> dict[str, list[Any]] | None:
    """A curve as plain data (``None`` stays ``None``); :func:`load_curve` reads it."""
    return None if curve is None else {"nodes": [int(k) for k in curve.nodes],
                                       "throughput": [float(p) for p in curve.throughput]}


def load_curve(state: dict[str, Any]) -> Curve:
    """The curve :func:`curve_state` wrote, point for point."""
    return Curve(tuple(int(k) for k in state["nodes"]),
                 tuple(float(p) for p in state["throughput"]))


@dataclass
class JobRecord:
    """What an engine keeps per job (``nodes`` is the pool's live set for the job)."""

    req: JobRequest
    order: int
    submitted: float
    nodes: set[str] = field(default_factory=set)
    phase: JobPhase = JobPhase.QUEUED
    prior: Curve | None = None
    source: str = ""
    last_interrupted: float | None = None
    probe_point: tuple[int, float] | None = None
    curve: Curve | None = None
    _curve_version: int = -2
    _job: Job | None = None

    @property
    def id(self) -> str:
        return self.req.id

    @staticmethod
    def validate(req: JobRequest) -> None:
        """Refuse a request that cannot be meant, naming the job and the field."""
        Job(req.id, max_nodes=req.max_nodes, min_nodes=req.min_nodes, curve=req.curve,
            scale_up_s=0.0 if req.scale_up_s is None else req.scale_up_s,
            scale_down_s=0.0 if req.scale_down_s is None else req.scale_down_s)

    def state_dict(self) -> dict[str, Any]:
        """The record as plain data (its nodes are the pool's; the allocator's view of it is
        rebuilt when next needed); :meth:`from_state` reads it."""
        req = {f.name: getattr(self.req, f.name) for f in dataclasses.fields(self.req)}
        req["curve"] = curve_state(self.req.curve)
        return {"req": req, "order": self.order, "submitted": self.submitted,
                "phase": self.phase.value, "prior": curve_state(self.prior),
                "source": self.source, "last_interrupted": self.last_interrupted,
                "probe_point": None if self.probe_point is None else list(self.probe_point),
                "curve": curve_state(self.curve), "curve_version": self._curve_version}

    @classmethod
    def from_state(cls, state: dict[str, Any], nodes: set[str]) -> JobRecord:
        """The record :meth:`state_dict` wrote, holding ``nodes`` (the pool's live set)."""
        def curve(key: str, where: dict[str, Any] = state) -> Curve | None:
            return None if where[key] is None else load_curve(where[key])

        req = JobRequest(**{**state["req"], "curve": curve("curve", state["req"])})
        probe = state["probe_point"]
        return cls(req, int(state["order"]), state["submitted"], nodes,
                   JobPhase(state["phase"]), curve("prior"), state["source"],
                   state["last_interrupted"], None if probe is None else (int(probe[0]), probe[1]),
                   curve("curve"), int(state["curve_version"]))

    def set_source(self, source: str, prior: Curve | None = None,
                   probe_point: tuple[int, float] | None = None) -> None:
        self.source, self.prior, self.probe_point = source, prior, probe_point
        self._curve_version = -2

    def known_top(self, monitor: Monitor) -> int:
        """The largest scale the believed curve rests on a measurement for."""
        top = monitor.top_scale(self.req.id)
        if self.source == Source.STORE:
            top = max(top, top_scale(self.prior))
        return top

    def costs(self, monitor: Monitor, config: EngineConfig) -> tuple[float, float]:
        """(scale-up, scale-down) seconds: measured, else declared, else the defaults."""
        req = self.req
        up = monitor.scale_up_s(req.id)
        down = monitor.scale_down_s(req.id)
        if up is None:
            up = req.scale_up_s if req.scale_up_s is not None else config.default_scale_up_s
        if down is None:
            down = (req.scale_down_s if req.scale_down_s is not None
                    else config.default_scale_down_s)
        return up, down

    def believed(self, monitor: Monitor, follow: bool) -> Curve | None:
        """The curve the allocator should use now; ``follow``: correct it by measurements."""
        if self.phase is JobPhase.DONE:
            return self.curve
        version = monitor.version(self.req.id)
        if version == self._curve_version and self.curve is not None:
            return self.curve
        measured = monitor.throughput(self.req.id)
        curve: Curve | None
        if self.source in (Source.USER, Source.STORE, Source.PROFILED) and self.prior is not None:
            curve = corrected_curve(self.prior, measured) if follow and measured else self.prior
        elif self.source == Source.LINEAR and self.probe_point is not None:
            k0, p0 = self.probe_point
            base = linear_curve(k0, p0, self.req.max_nodes)
            curve = corrected_curve(base, measured) if follow and measured else base
        elif measured:
            curve = conservative_curve(measured)
        elif self.phase is JobPhase.RUNNING:
            curve = linear_curve(1, ASSUMED_RATE_PER_NODE, self.req.max_nodes)
        else:
            curve = None
        self.curve, self._curve_version = curve, version
        return curve

    def allocator_job(self, monitor: Monitor, config: EngineConfig, max_nodes: int) -> Job:
        """This job as the allocator sees it now (cached while nothing changed)."""
        curve = self.believed(monitor, config.profiling)
        up_s, down_s = self.costs(monitor, config)
        job = self._job
        if (job is None or job.curve is not curve or job.current_nodes != len(self.nodes)
                or job.max_nodes != max_nodes or job.scale_up_s != up_s
                or job.scale_down_s != down_s):
            job = self._job = Job(self.req.id, max_nodes=max_nodes, min_nodes=self.req.min_nodes,
                                  curve=curve, scale_up_s=up_s, scale_down_s=down_s,
                                  current_nodes=len(self.nodes), owner=self.req.owner,
                                  model=self.req.model)
        return job

    def view(self, monitor: Monitor, config: EngineConfig) -> JobView:
        up_s, down_s = self.costs(monitor, config)
        return JobView(self.req.id, self.phase, tuple(sorted(self.nodes)),
                       self.believed(monitor, config.profiling),
                       MappingProxyType(monitor.throughput(self.req.id)), up_s, down_s,
                       self.req.min_nodes, self.req.max_nodes, self.req.owner, self.req.model,
                       self.submitted)
