"""How long an idle node will stay idle: reclaim prediction for lifetime-aware allocation.

An idle node is worth to a job the time it stays idle, not a fixed look-ahead. Two sources:

* the batch scheduler's plan: a node reserved for a waiting job has a known hole end, which
  wins whenever it is given;
* otherwise, the node's idle age ``a`` and a survival function S(t) = P(L ≥ t) of the lengths
  L of past idle fragments at the site: the node's remaining life R = L − a given L > a.

:class:`SurvivalModel` is a life table (Kaplan–Meier on log-spaced length bins): per bin the
fragments that ended in it and those still idle when last seen (right-censored), updated
online by :meth:`SurvivalModel.observe` and serialisable to a plain dict. Between bin edges
S is linear, so every quantity below is an exact integral of that piecewise-linear S.

:class:`LifetimePredictor` turns a node into the two numbers the allocator uses, for a
horizon H: ``life`` = E[min(R, H)] (seconds of idle time the node is expected to offer within
the horizon) and ``risk`` = P(R < H) (the chance it is reclaimed within the horizon, which
costs its job a restart). A node with a known hole end has R known: life = min(R, H), risk =
[R < H].
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ConfigError, ValidationError

DEFAULT_HORIZON_S = 3600.0
"""Idle time beyond this counts no more: later re-plans decide what happens after it."""


def log_edges(lo_s: float = 10.0, hi_s: float = 1e7, per_decade: int = 16) -> np.ndarray:
    """Bin edges 0, lo, …, hi (log-spaced, ``per_decade`` bins a decade); the last bin is open."""
    if not 0 < lo_s < hi_s or per_decade < 1:
        raise ValidationError("survival", "edges", "need 0 < lo < hi and ≥ 1 bin a decade")
    n = int(math.ceil(math.log10(hi_s / lo_s) * per_decade))
    return np.concatenate(([0.0], np.geomspace(lo_s, hi_s, n + 1)))


class SurvivalModel:
    """A life table of idle-fragment lengths (see the module docstring).

    ``edges`` are the bin edges e_0 = 0 < e_1 < … < e_B; bin b holds lengths in [e_b, e_{b+1})
    and lengths ≥ e_B are clipped into the last bin. The survival at the edges follows the
    actuarial (Kaplan–Meier) rule S(e_{b+1}) = S(e_b) · (1 − d_b / (n_b − c_b / 2)), with d_b
    the fragments that ended in bin b, c_b those censored in it and n_b those that reached e_b;
    with no censoring S(e_b) is the share of fragments with L ≥ e_b.
    """

    def __init__(self, edges: Sequence[float] | np.ndarray | None = None) -> None:
        e = np.asarray(log_edges() if edges is None else edges, dtype=float)
        if e.ndim != 1 or len(e) < 2 or e[0] != 0.0 or np.any(np.diff(e) <= 0):
            raise ValidationError("survival", "edges", "give increasing bin edges starting at 0")
        self.edges = e
        self.ended = np.zeros(len(e) - 1, dtype=np.int64)
        self.censored = np.zeros(len(e) - 1, dtype=np.int64)
        self._cache: dict[float, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}

    # ----------------------------------------------------------------- learning
    @classmethod
    def from_fragments(cls, lengths: Iterable[float], censored: Iterable[float] = (),
                       edges: Sequence[float] | np.ndarray | None = None) -> SurvivalModel:
        """A model of complete fragment ``lengths`` (seconds) and fragments still idle after
        ``censored`` seconds."""
        model = cls(edges)
        model.observe_many(lengths)
        model.observe_many(censored, censored=True)
        return model

    def _bins(self, lengths: Iterable[float]) -> np.ndarray:
        arr = np.asarray(list(lengths) if not isinstance(lengths, np.ndarray) else lengths,
                         dtype=float).ravel()
        if arr.size and (np.any(~np.isfinite(arr)) or np.any(arr < 0)):
            raise ValidationError("survival", "length", "fragment lengths must be finite "
                                  "seconds ≥ 0")
        idx = np.searchsorted(self.edges, arr, side="right") - 1
        return np.minimum(idx, len(self.ended) - 1)

    def observe_many(self, lengths: Iterable[float], censored: bool = False) -> None:
        """Count many fragments at once (see :meth:`observe`)."""
        idx = self._bins(lengths)
        if idx.size:
            target = self.censored if censored else self.ended
            target += np.bincount(idx, minlength=len(target))
            self._cache.clear()

    def observe(self, length: float, censored: bool = False) -> None:
        """Count one idle fragment of ``length`` seconds; ``censored``: it was still idle then
        (it lasted at least that long)."""
        self.observe_many([length], censored)

    @property
    def count(self) -> int:
        """Fragments counted (ended and censored)."""
        return int(self.ended.sum() + self.censored.sum())

    # ----------------------------------------------------------------- the survival function
    def survival_at_edges(self) -> np.ndarray:
        """S(e_0 … e_B): S(0) = 1; the share still idle at each edge (1 everywhere when empty)."""
        at_risk = np.cumsum((self.ended + self.censored)[::-1])[::-1]
        denom = at_risk - self.censored / 2.0
        with np.errstate(divide="ignore", invalid="ignore"):
            hazard = np.where(denom > 0, self.ended / np.where(denom > 0, denom, 1.0), 0.0)
        return np.concatenate(([1.0], np.cumprod(1.0 - np.minimum(hazard, 1.0))))

    def survival(self, t: float | np.ndarray) -> np.ndarray:
        """S(t) = P(L ≥ t), linear between edges and flat beyond the last."""
        return np.interp(np.asarray(t, dtype=float), self.edges, self.survival_at_edges())

    def _tables(self, horizon_s: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        cached = self._cache.get(horizon_s)
        if cached is not None:
            return cached
        e, s = self.edges, self.survival_at_edges()
        # Beyond the last edge S stays flat: extend the grid so that e + H is covered.
        top = e[-1] + horizon_s
        grid = np.concatenate((e, [top])) if top > e[-1] else e
        sg = np.concatenate((s, [s[-1]])) if top > e[-1] else s
        integral = np.concatenate(([0.0], np.cumsum(np.diff(grid) * (sg[1:] + sg[:-1]) / 2.0)))
        tables = (grid, sg, integral)
        if len(self._cache) > 8:
            self._cache.clear()
        self._cache[horizon_s] = tables
        return tables

    def _integral(self, t: np.ndarray, grid: np.ndarray, sg: np.ndarray,
                  integral: np.ndarray) -> np.ndarray:
        """∫_0^t S exactly for the piecewise-linear S (a quadratic inside a bin)."""
        i = np.clip(np.searchsorted(grid, t, side="right") - 1, 0, len(grid) - 2)
        x0, x1 = grid[i], grid[i + 1]
        s0, s1 = sg[i], sg[i + 1]
        dx = t - x0
        slope = (s1 - s0) / (x1 - x0)
        return integral[i] + dx * s0 + 0.5 * slope * dx * dx

    def residual(self, age_s: float | np.ndarray, horizon_s: float = DEFAULT_HORIZON_S
                 ) -> tuple[np.ndarray, np.ndarray]:
        """For nodes idle for ``age_s`` seconds: (E[min(R, H)], P(R < H)) with R = L − age
        given L ≥ age, H = ``horizon_s``. With no data a node is assumed to stay (H, 0).

        A node idle longer than every fragment on record is in a hole longer than any seen,
        not about to end: its age is taken as the last bin edge the survival still reaches."""
        age = np.maximum(np.asarray(age_s, dtype=float), 0.0)
        if self.count == 0:
            return np.full(age.shape, float(horizon_s)), np.zeros(age.shape)
        reached = np.flatnonzero(self.survival_at_edges() > 0)
        age = np.minimum(age, self.edges[reached[-1]])
        grid, sg, integral = self._tables(float(horizon_s))
        s_a = np.interp(age, grid, sg)
        s_h = np.interp(age + horizon_s, grid, sg)
        area = self._integral(age + horizon_s, grid, sg, integral) - \
            self._integral(age, grid, sg, integral)
        alive = s_a > 0
        safe = np.where(alive, s_a, 1.0)
        life = np.where(alive, area / safe, 0.0)
        risk = np.where(alive, 1.0 - s_h / safe, 1.0)
        return np.clip(life, 0.0, horizon_s), np.clip(risk, 0.0, 1.0)

    # ----------------------------------------------------------------- state
    def to_dict(self) -> dict[str, list[float] | list[int]]:
        """The whole state as plain lists (JSON-ready)."""
        return {"edges": self.edges.tolist(), "ended": self.ended.tolist(),
                "censored": self.censored.tolist()}

    @classmethod
    def from_dict(cls, state: Mapping[str, Any]) -> SurvivalModel:
        """The inverse of :meth:`to_dict`; refuses a state whose counts do not fit its edges."""
        try:
            model = cls(state["edges"])
            ended = np.asarray(state["ended"], dtype=np.int64)
            censored = np.asarray(state["censored"], dtype=np.int64)
        except (KeyError, TypeError, ValueError) as exc:
            raise ValidationError("survival", "state", f"unreadable ({exc}); give the dict "
                                  "SurvivalModel.to_dict() wrote") from None
        if ended.shape != model.ended.shape or censored.shape != model.censored.shape or \
                np.any(ended < 0) or np.any(censored < 0):
            raise ValidationError("survival", "state", "counts do not match the bin edges; "
                                  "give the dict SurvivalModel.to_dict() wrote")
        model.ended[:] = ended
        model.censored[:] = censored
        return model


@dataclass
class LifetimePredictor:
    """Per-node (life, risk) for the allocator (see the module docstring).

    ``survival`` is ``None`` for a plan-only predictor: nodes without a hole end are then
    assumed to stay idle beyond the horizon. ``learn_online``: fragments the engine sees end
    (an idle node reclaimed) are added to ``survival`` as they happen.
    """

    survival: SurvivalModel | None = None
    horizon_s: float = DEFAULT_HORIZON_S
    learn_online: bool = True

    def __post_init__(self) -> None:
        h = self.horizon_s
        if isinstance(h, bool) or not isinstance(h, (int, float)) or not 0 < h < math.inf:
            raise ConfigError(f"lifetime: horizon_s = {h!r}: give a finite number of seconds > 0")

    def predict(self, ages_s: Sequence[float] | np.ndarray,
                holes_s: Sequence[float | None]) -> tuple[np.ndarray, np.ndarray]:
        """(life, risk) per node from its idle age and its known remaining hole (or ``None``)."""
        h = self.horizon_s
        ages = np.asarray(ages_s, dtype=float)
        known = np.array([x is not None for x in holes_s], dtype=bool)
        hole = np.array([h if x is None else x for x in holes_s], dtype=float)
        if self.survival is not None:
            life, risk = self.survival.residual(ages, h)
        else:
            life, risk = np.full(ages.shape, h), np.zeros(ages.shape)
        life = np.where(known, np.minimum(np.maximum(hole, 0.0), h), life)
        risk = np.where(known, (hole < h).astype(float), risk)
        return life, risk

    def observe(self, length_s: float) -> None:
        """An idle fragment of ``length_s`` seconds ended (its node was reclaimed)."""
        if self.learn_online and self.survival is not None and math.isfinite(length_s) and \
                length_s >= 0:
            self.survival.observe(length_s)

    def to_dict(self) -> dict[str, Any]:
        return {"horizon_s": self.horizon_s, "learn_online": self.learn_online,
                "survival": None if self.survival is None else self.survival.to_dict()}

    def state_dict(self) -> dict[str, Any]:
        """What it learned, as :meth:`to_dict` writes it (the horizon is configuration)."""
        return self.to_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Take the fragment counts of a :meth:`state_dict` where both it and this predictor
        learn them; the horizon and the learning switch stay as configured."""
        if self.survival is not None and state.get("survival") is not None:
            self.survival = SurvivalModel.from_dict(state["survival"])

    @classmethod
    def from_dict(cls, state: Mapping[str, Any]) -> LifetimePredictor:
        surv = state.get("survival")
        return cls(None if surv is None else SurvivalModel.from_dict(surv),
                   float(state.get("horizon_s", DEFAULT_HORIZON_S)),
                   bool(state.get("learn_online", True)))


def trace_fragments(trace: Any) -> tuple[np.ndarray, np.ndarray]:
    """Idle fragments of a :class:`~malletrain_core.sim.traces.Trace`: (lengths of those that
    began and ended inside it, lengths so far of those still idle at its end — right-censored).
    Fragments already idle at its start have no known beginning and are left out."""
    t = np.repeat(np.asarray(trace.times, dtype=float), np.diff(trace.offsets))
    nodes, idle = np.asarray(trace.nodes), np.asarray(trace.idle, dtype=bool)
    order = np.lexsort((t, nodes))
    n_s, t_s, v_s = nodes[order], t[order], idle[order]
    same = np.zeros(len(n_s), dtype=bool)
    if len(n_s) > 1:
        same[:-1] = n_s[1:] == n_s[:-1]
    begins = np.flatnonzero(v_s)
    has_next = same[begins]
    closed = t_s[begins[has_next] + 1] - t_s[begins[has_next]]
    open_len = float(trace.end) - t_s[begins[~has_next]]
    return closed[closed >= 0], open_len[open_len >= 0]


def split_trace(trace: Any, learn_days: float, eval_days: float | None) -> tuple[Any, Any]:
    """(the first ``learn_days`` of a :class:`~malletrain_core.sim.traces.Trace`, the
    ``eval_days`` after them — the rest of the trace when ``None``)."""
    if not learn_days > 0:
        raise ConfigError(f"--learn-days {learn_days}: give a number of days > 0")
    learn = trace.window(learn_days)
    k = int(np.searchsorted(trace.times, trace.start + learn_days * 86400.0, side="right"))
    if k >= trace.steps:
        raise ConfigError(f"--learn-days {learn_days}: the trace has nothing left after it; "
                          "learn on fewer days")
    return learn, trace.window(eval_days, skip_events=k)


def learn_from_trace(trace: Any, horizon_s: float = DEFAULT_HORIZON_S) -> LifetimePredictor:
    """A predictor whose survival model holds the idle fragments of ``trace``."""
    closed, censored = trace_fragments(trace)
    return LifetimePredictor(SurvivalModel.from_fragments(closed, censored), horizon_s)
