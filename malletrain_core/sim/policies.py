"""The policies the simulator compares, and what each one is told about the jobs.

Every policy runs the same Engine; they differ only in the allocation function and in the
curves the jobs bring at submission:

* ``malletrain`` — no curve, profiling on: the JPA measures each job (declared model names
  let later jobs of a model reuse the measured curve); the engine never sees a true curve;
* ``malletrain-lifetime`` — the same, with each idle node valued at its predicted remaining
  idle time (:mod:`malletrain_core.engine.survival`; learned from the Summit fragments unless the
  caller passes a ``lifetime`` predictor) instead of the fixed look-ahead;
* ``malletrain-clairvoyant`` — the same, told every idle node's true reclaim time by the
  trace: an upper reference for reclaim prediction;
* ``freetrain-exact`` — the true curve, supplied by the user, trusted (profiling off);
* ``freetrain-linear`` — the user assumes P(k) = k·P(1) from a one-node measurement;
* ``freetrain-mismatched`` — another model's true curve (picked by the seed), scaled to this
  job's P(1), as a user who copies a colleague's profile would;
* every other registered allocation policy (``malletrain_core.allocator.POLICIES``) that is
  not an exact solver — ``equal``, ``greedy``, ``rigid`` (:mod:`malletrain_core.allocator.baselines`)
  and any policy added there — played on the true curves;
* ``oracle`` — no run: the upper bound UB_oracle of :mod:`.bounds`.

FreeTrain variants and baselines declare the true rescale costs (those of the cost model in use,
:mod:`.costs`); MalleTrain measures them. Under an in-place cost model (``inplace``,
``inplace-gpu``) the engine's default costs (used until a job's first change is measured) are
that model's, as a site running jobs in place would configure them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import allocator
from ..errors import ConfigError
from ..events import JobRequest
from ..model import DEFAULT_LOOKAHEAD_S, Curve
from .costs import RESTART, RescaleCosts
from .workloads import SimJob

ALLOCATION_POLICIES = tuple(p for p in allocator.POLICIES if p not in allocator.SOLVERS)
"""Registered allocation policies played as they are, on the jobs' true curves."""
POLICIES = ("malletrain", "malletrain-lifetime", "malletrain-clairvoyant", "freetrain-exact",
            "freetrain-linear", "freetrain-mismatched", *ALLOCATION_POLICIES, "oracle")
RUN_POLICIES = tuple(p for p in POLICIES if p != "oracle")
PROFILED = ("malletrain", "malletrain-lifetime", "malletrain-clairvoyant")
"""The policies that measure the jobs (MalleTrain) rather than trust declared curves."""
LIFETIME_POLICIES = ("malletrain-lifetime", "malletrain-clairvoyant")
"""The policies that value idle nodes by their (predicted or true) remaining idle time."""


def parse_policies(text: str) -> list[str]:
    """A comma-separated policy list, checked; ``all`` names every policy."""
    names = [p.strip() for p in text.split(",") if p.strip()]
    if names == ["all"]:
        return list(POLICIES)
    unknown = [p for p in names if p not in POLICIES]
    if unknown or not names:
        raise ConfigError(f"--policies: unknown policy {', '.join(unknown) or '(none)'}; "
                          f"choose from {','.join(POLICIES)} or 'all'")
    return list(dict.fromkeys(names))


def linear_curve(curve: Curve, max_nodes: int) -> Curve:
    """P(k) = k·P(1) up to ``max_nodes``."""
    p1 = curve.at(1)
    return Curve.of([1, max_nodes], [p1, p1 * max_nodes]) if max_nodes > 1 else \
        Curve.of([1], [p1])


def mismatched_curves(jobs: Sequence[SimJob], catalogue: dict[str, Curve],
                      seed: int) -> list[Curve]:
    """For each job another model's curve from ``catalogue``, scaled to the job's P(1)."""
    rng = np.random.default_rng([seed, 11])
    names = sorted(catalogue)
    out = []
    for job in jobs:
        others = [m for m in names if m != job.model]
        if not others:
            raise ConfigError("freetrain-mismatched needs curves of at least two models")
        other = catalogue[others[int(rng.integers(len(others)))]]
        p_other = other.at(1)
        out.append(other.scaled(job.curve.at(1) / p_other) if p_other > 0 else other)
    return out


def job_requests(policy: str, jobs: Sequence[SimJob], seed: int,
                 catalogue: dict[str, Curve] | None = None,
                 costs: RescaleCosts = RESTART) -> list[JobRequest]:
    """What each job declares at submission under ``policy`` (rescale costs as ``costs``
    makes them)."""
    if policy in PROFILED:
        return [JobRequest(id=j.id, min_nodes=j.min_nodes, max_nodes=j.max_nodes, model=j.model,
                           curve=None, profile=True, work=j.work) for j in jobs]
    if policy == "freetrain-linear":
        curves = [linear_curve(j.curve, j.max_nodes) for j in jobs]
    elif policy == "freetrain-mismatched":
        curves = mismatched_curves(jobs, catalogue or {}, seed)
    elif policy in RUN_POLICIES:
        curves = [j.curve for j in jobs]
    else:
        raise ConfigError(f"policy {policy!r} is not simulated; choose from {RUN_POLICIES}")
    declared = [costs.declared(j.scale_up_s, j.scale_down_s) for j in jobs]
    return [JobRequest(id=j.id, min_nodes=j.min_nodes, max_nodes=j.max_nodes, model=j.model,
                       curve=c, profile=False, scale_up_s=up, scale_down_s=down, work=j.work)
            for j, c, (up, down) in zip(jobs, curves, declared)]


def make_engine(policy: str, lookahead_s: float, **config: Any) -> Any:
    """The Engine that plays ``policy`` (profiling only for the MalleTrain policies), built as
    the daemon builds its own (:func:`~malletrain_core.engine.build.build_engine`) from the
    default configuration with the simulation's look-ahead; ``config`` overrides engine
    settings."""
    from ..config import AllocatorConfig, Config
    from ..engine.build import build_engine

    if policy in LIFETIME_POLICIES:
        config = dict(config)
        config["lifetime"] = lifetime_predictor(policy, config.get("lifetime"), lookahead_s)
    config.setdefault("done_retention_s", None)  # the replay counts every finished job
    chosen = allocator.POLICIES[policy] if policy in ALLOCATION_POLICIES else None
    return build_engine(Config(allocator=AllocatorConfig(lookahead_s=lookahead_s)),
                        policy=chosen, name=policy, profiling=policy in PROFILED, **config)


def lifetime_predictor(policy: str, given: Any = None, lookahead_s: float = DEFAULT_LOOKAHEAD_S) -> Any:
    """A private copy of the predictor ``policy`` uses (online learning must not leak from one
    run into the next): ``given``, else the Summit fragment lengths for ``malletrain-lifetime``;
    the plan only (true hole ends from the trace) for ``malletrain-clairvoyant``. The horizon
    is ``given``'s, else the look-ahead."""
    import copy

    from ..engine.survival import LifetimePredictor, SurvivalModel
    from .sources import FRAGMENTS_FILE, _shared_file

    horizon = given.horizon_s if given is not None else lookahead_s
    if policy == "malletrain-clairvoyant":
        return LifetimePredictor(None, horizon, learn_online=False)
    if given is not None:
        return copy.deepcopy(given)
    path = _shared_file(FRAGMENTS_FILE)
    try:
        lengths = np.load(path)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"malletrain-lifetime: cannot read {path} ({exc}); set "
                          "MALLETRAIN_SHARED to the shared data directory") from None
    return LifetimePredictor(SurvivalModel.from_fragments(lengths), horizon)
