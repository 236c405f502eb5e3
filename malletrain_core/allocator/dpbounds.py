"""Where the DP's optimum can lie: per stage, the node counts a best allocation can pass through.

A cell (j, m) of the DP (the first j jobs on ≤ m nodes) lies on an allocation worth at least
``τ`` only if P_j(m) + S_j(cap − m) ≥ τ, P_j being the best value of the first j jobs and S_j
that of the others. For any price λ ≥ 0 (Lagrangian relaxation of the capacity),

    P_j(m) ≤ λ·m + Σ_{i ≤ j} h_i(λ),   S_j(r) ≤ λ·r + Σ_{i > j} h_i(λ),
    h_i(λ) = max_k v_i(k) − λ·k,

so for every pair of prices (λ_a for the first jobs, λ_b for the others) the cells worth τ
satisfy (λ_a − λ_b)·m ≥ τ − Σ_{i≤j} h_i(λ_a) − λ_b·cap − Σ_{i>j} h_i(λ_b): a lower bound on m
where λ_a > λ_b, an upper one where λ_a < λ_b. Every stage thus gets one interval of counts
(the bound is concave in m) from a few prices around the one that fills the capacity.
:func:`windows` returns those intervals, widened by a margin that covers the rounding of the
sums, so a cell outside them is provably below τ; the DP computes only inside them.
"""

from __future__ import annotations

import numpy as np

PRICES = 8
"""Prices λ > 0 tried per solve (besides λ = 0), geometric around the last one that filled
the capacity."""
RATIO = 1.15
"""Ratio between neighbouring prices."""
_RECENTRE = 24
"""How many times the prices may move before giving up on bounds for a problem."""
_REL_EPS = 1e-9
"""Margin on τ, relative to the magnitude of the sums (floating-point rounding of ≤ a few
hundred additions is ~1e-14 of it)."""

_centre = [1.0]
"""The price that filled the capacity at the last solve: the next solve's prices surround it."""


class Bounds:
    """The prices' relaxation of one problem: feasible value, upper bound, per-stage windows."""

    def __init__(self, tables: list[np.ndarray], cap: int, tops: list[int]) -> None:
        width = max(tops, default=0) + 1
        grid = np.full((len(tables), width), -np.inf)
        for row, table, top in zip(grid, tables, tops):
            row[:top + 1] = table[:top + 1]
        self.cap = cap
        self.ok = False
        self.lower = -np.inf
        self.upper = np.inf
        if not tables or not np.isfinite(grid[:, 0]).all():
            return
        ks = np.arange(width, dtype=np.float64)
        centre = _centre[0]
        step = RATIO ** PRICES
        below, above = 0.0, np.inf  # a price known to overfill, one known to fit
        for _ in range(_RECENTRE):
            prices = np.concatenate(([0.0], centre * RATIO ** np.arange(
                -(PRICES // 2), PRICES - PRICES // 2)))
            reduced = grid[None, :, :] - prices[:, None, None] * ks
            picks = reduced.argmax(axis=2)
            demand = picks.sum(axis=1)
            if demand[0] <= cap:
                break  # every job at its top fits: λ = 0 is tight
            if demand[-1] > cap:
                below = prices[-1]
            elif demand[1] <= cap:
                above = prices[1]
            else:
                break
            if below > 0 and above < np.inf:
                centre = float(np.sqrt(below * above))
            else:  # far off (the first solve, or a new scale): widen the search
                centre = centre * step if below > 0 else centre / step
                step *= step
            if not 0.0 < centre < np.inf:
                return
        else:
            return
        fits = np.flatnonzero(demand <= cap)
        if not len(fits):
            return
        if prices[fits[0]] > 0:
            _centre[0] = float(prices[fits[0]])
        h = np.take_along_axis(reduced, picks[:, :, None], 2)[:, :, 0]  # (prices, jobs)
        chosen = np.take_along_axis(grid, picks[fits[0]][:, None], 1)[:, 0]
        self.lower = float(chosen.sum())  # a feasible allocation: Lagrangian at a fitting price
        if fits[0] > 0:  # and the steps towards the next lower price's picks that still fit
            more = picks[fits[0] - 1] - picks[fits[0]]
            gain = np.take_along_axis(grid, picks[fits[0] - 1][:, None], 1)[:, 0] - chosen
            up = np.flatnonzero(more > 0)
            order = up[np.argsort(-gain[up] / more[up], kind="stable")]
            fit = np.cumsum(more[order]) <= cap - demand[fits[0]]
            self.lower += float(np.maximum(gain[order[fit]], 0.0).sum())
        prefix = np.zeros((len(tables) + 1, len(prices)))
        np.cumsum(h.T, axis=0, out=prefix[1:])
        self.upper = float((prices * cap + prefix[-1]).min())
        self.prices = prices
        self.prefix = prefix
        self.eps = _REL_EPS * (float(np.abs(grid[np.isfinite(grid)]).sum())
                               + float(np.abs(h).sum()) + float(prices[-1]) * cap * len(tables)
                               + abs(self.lower) + 1.0)
        self.ok = bool(np.isfinite(self.upper) and np.isfinite(self.lower))

    def windows(self, tau: float) -> tuple[list[int], list[int]] | None:
        """Per stage j = 0 … J, the counts [lo_j, hi_j] outside which no cell reaches ``tau``
        (provably, rounding included); None where some stage has none (τ is above the
        optimum's upper bound)."""
        prices, prefix, cap = self.prices, self.prefix, self.cap
        suffix = prices * cap + (prefix[-1] - prefix)  # (stages, prices): λ_b·cap + Σ_{i>j}
        need = (tau - self.eps) - prefix[:, :, None] - suffix[:, None, :]
        gap = prices[:, None] - prices[None, :]
        if ((gap == 0) & (need > 0)).any():
            return None
        with np.errstate(divide="ignore", invalid="ignore"):
            at = need / gap
        lo = np.where(gap > 0, at, -np.inf).max(axis=(1, 2))
        hi = np.where(gap < 0, at, np.inf).min(axis=(1, 2))
        lo = np.clip(np.floor(lo) - 1, 0, cap)
        hi = np.clip(np.ceil(hi) + 1, 0, cap)
        if (lo > hi).any():
            return None
        return lo.astype(int).tolist(), hi.astype(int).tolist()
