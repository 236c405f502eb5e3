"""The replay loop: a virtual clock that jumps from one happening to the next.

At each time the backend reports what happened, the Engine re-plans once for the whole burst,
and the backend executes the actions; worker confirmations go back to the engine at the same
time. The Engine is the production one: the loop only moves time and carries events.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..model import DEFAULT_LOOKAHEAD_S, Curve
from .backend import SimBackend
from .perfmodel import PerfParams
from .policies import job_requests, make_engine
from .traces import Trace
from .workloads import SimJob

ProgressFn = Callable[[float], None]
"""Called now and then with the share of the trace replayed so far (0 … 1)."""


@dataclass
class RunResult:
    """One policy on one seed: the figures of the results table and the plot series."""

    policy: str
    seed: int
    net_samples: float
    trained_samples: float
    node_seconds: float
    rescales: int
    rescale_loss: float
    preemptions: int
    preemption_loss: float
    completed_jobs: int
    mean_jct_s: float | None
    wall_s: float
    invalid_actions: int
    makespan_s: float | None = None
    rolled_back_samples: float = 0.0
    """Samples trained and then undone by a restart from a checkpoint (not in
    ``trained_samples``, which is what the jobs kept)."""
    restores: int = 0
    """How many restarts from a checkpoint undid completed training."""
    cpu_s: float = 0.0
    """CPU seconds of the replay's process (its wall time counts other processes' too)."""
    engine: dict[str, Any] = field(default_factory=dict)
    sample_times: np.ndarray = field(default_factory=lambda: np.zeros(0))
    sample_net: np.ndarray = field(default_factory=lambda: np.zeros(0))
    sample_node_s: np.ndarray = field(default_factory=lambda: np.zeros(0))


def replay(trace: Trace, jobs: Sequence[SimJob], policy: str, *, seed: int = 0,
           lookahead_s: float = DEFAULT_LOOKAHEAD_S, params: PerfParams | None = None,
           catalogue: dict[str, Curve] | None = None, progress: ProgressFn | None = None,
           engine_options: dict[str, Any] | None = None) -> RunResult:
    """Play ``jobs`` on ``trace`` under ``policy`` with the real Engine."""
    wall0 = time.perf_counter()
    cpu0 = time.process_time()
    costs = (params or PerfParams()).costs
    options = dict(engine_options or {})
    if costs.inplace:  # the defaults a site running jobs in place would set
        up, down = costs.declared(0.0, 0.0)
        options.setdefault("default_scale_up_s", up)
        options.setdefault("default_scale_down_s", down)
    engine = make_engine(policy, lookahead_s, **options)
    requests = job_requests(policy, jobs, seed, catalogue, costs)
    backend = SimBackend(trace, jobs, requests, params, seed,
                         hole_ends=policy == "malletrain-clairvoyant")
    span = max(trace.span_s, 1e-9)
    next_note = 0.0
    end = trace.end
    while True:
        now = backend.next_time()
        if now is None or now >= end:
            break
        events = backend.poll(now)
        if not events:
            continue
        actions = engine.handle_many(events)
        for _ in range(8):
            if not actions:
                break
            confirmations = backend.execute(actions, now)
            actions = engine.handle_many(confirmations) if confirmations else []
        if progress is not None:
            done = (now - trace.start) / span
            if done >= next_note:
                progress(done)
                next_note = done + 0.002
    backend.close()
    if progress is not None:
        progress(1.0)
    models = list(backend.models.values())
    jcts = [m.done_time - m.spec.submit_time for m in models if m.done_time is not None
            and m.spec.work is not None]
    finite = [m for m in models if m.spec.work is not None]
    makespan = (max(m.done_time for m in finite if m.done_time is not None)
                - min(m.spec.submit_time for m in finite)
                if finite and len(jcts) == len(finite) else None)
    stats = engine.stats
    stats_dict = stats.to_dict() if hasattr(stats, "to_dict") else dict(vars(stats))
    return RunResult(
        policy=policy, seed=seed,
        net_samples=float(sum(m.net for m in models)),
        trained_samples=float(sum(m.progress for m in models)),
        rolled_back_samples=float(sum(m.restored_loss for m in models)),
        restores=sum(m.restores for m in models),
        node_seconds=float(sum(m.node_s for m in models)),
        rescales=sum(m.rescales for m in models),
        rescale_loss=float(sum(m.rescale_loss for m in models)),
        preemptions=sum(m.preemptions for m in models),
        preemption_loss=float(sum(m.preemption_loss for m in models)),
        completed_jobs=len(jcts),
        mean_jct_s=float(np.mean(jcts)) if jcts else None,
        wall_s=time.perf_counter() - wall0, cpu_s=time.process_time() - cpu0,
        invalid_actions=backend.invalid_actions, makespan_s=makespan,
        engine=stats_dict,
        sample_times=backend.sample_times, sample_net=backend.sample_net,
        sample_node_s=backend.sample_node_s)
