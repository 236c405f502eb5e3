"""The one place an engine is built from MalleTrain's configuration.

``malletraind`` builds its engine (or, with ``[[trainer]]`` tables, a router over one engine
per trainer) here, and so does the simulator (``malletrain simulate``): both read the same
settings the same way, a trainer's own solver, look-ahead and admission cap over the
allocator's. What differs between the two is passed as an override of an
:class:`~.config.EngineConfig` field (the simulator keeps finished jobs and chooses profiling
per policy; the daemon's time limit comes from its batch system).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import numpy as np

from .. import hostlist
from ..config import Config, TrainerConfig
from ..errors import ConfigError, MalleTrainError
from ..events import JobRequest
from ..model import Constraints, Objective
from .config import EngineConfig, Policy
from .engine import Engine
from .router import Router
from .survival import LifetimePredictor, SurvivalModel

log = logging.getLogger("malletraind")


def lifetime_predictor(config: Config,
                       lookahead_s: float | None = None) -> LifetimePredictor | None:
    """The reclaim predictor ``allocator.lifetime`` asks for, or ``None``; its horizon is the
    engine's look-ahead (``lookahead_s``: a ``[[trainer]]``'s own, else the allocator's)."""
    a = config.allocator
    if not a.lifetime:
        return None
    survival = SurvivalModel()
    if a.lifetime_fragments:
        path = a.lifetime_fragments
        try:
            lengths = np.load(path) if path.endswith(".npy") else np.loadtxt(path, ndmin=1)
            survival = SurvivalModel.from_fragments(np.asarray(lengths, dtype=float).ravel())
        except (OSError, ValueError, MalleTrainError) as exc:
            raise ConfigError(f"allocator.lifetime_fragments: cannot read {path} ({exc}); "
                              "give a .npy or a text file of fragment lengths in seconds, "
                              "or leave it empty") from None
    return LifetimePredictor(survival, a.lookahead_s if lookahead_s is None else lookahead_s)


def engine_config(config: Config, trainer: TrainerConfig | None = None,
                  **override: Any) -> EngineConfig:
    """The engine settings of ``trainer`` (else of the whole configuration), then
    ``override`` (field name: value) on top."""
    a, p = config.allocator, config.profiler
    solver, lookahead_s, max_running = a.solver, a.lookahead_s, a.max_running_jobs
    if trainer is not None:
        solver = trainer.solver.strip() or solver
        lookahead_s = trainer.lookahead_s or lookahead_s
        max_running = max_running if trainer.max_running_jobs < 0 else trainer.max_running_jobs
    built = EngineConfig(
        lifetime=None if "lifetime" in override else lifetime_predictor(config, lookahead_s),
        lookahead_s=lookahead_s, objective=Objective(a.objective),
        max_running_jobs=max_running or None,
        constraints=Constraints(user_max_nodes=dict(a.user_max_nodes), min_share=a.min_share),
        solver=solver, profiling=p.enabled, profile_window_s=p.window_s,
        default_scale_up_s=p.default_scale_up_s, default_scale_down_s=p.default_scale_down_s,
        done_retention_s=config.daemon.finished_job_retention_s)
    return dataclasses.replace(built, **override) if override else built


def build_engine(config: Config, trainer: TrainerConfig | None = None, *,
                 policy: Policy | None = None, name: str = "", **override: Any) -> Engine:
    """One engine: :func:`engine_config`'s settings, ``policy`` (an allocation function)
    instead of the configured solver where given."""
    return Engine(engine_config(config, trainer, **override), policy=policy,
                  name=name or (trainer.name if trainer is not None else "default"))


def make_engine(config: Config, **override: Any) -> Engine | Router:
    """One engine, or with ``[[trainer]]`` tables a router over one engine per trainer: nodes
    go to the trainer whose node set names them (else to the trainer without one, else to
    none), jobs to the trainer they name (else to the first)."""
    if not config.trainer:
        return build_engine(config, **override)
    engines = {t.name: build_engine(config, t, **override) for t in config.trainer}
    sets = {t.name: frozenset(hostlist.expand(t.nodes)) for t in config.trainer if t.nodes}
    rest = next((t.name for t in config.trainer if not t.nodes), None)
    first = config.trainer[0].name
    warned: set[str] = set()

    def node_owner(node: str) -> str | None:
        return next((name for name, members in sets.items() if node in members), rest)

    def job_owner(job: JobRequest) -> str:
        if job.trainer in engines:
            return job.trainer
        if job.trainer and job.trainer not in warned:
            warned.add(job.trainer)
            log.warning("job %s asks for trainer %r, which is not configured (%s): it goes "
                        "to trainer %s", job.id, job.trainer, ", ".join(engines), first)
        return first

    return Router(engines, node_owner, job_owner)
