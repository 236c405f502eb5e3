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

import math

import numpy as np

PRICES = 8
"""Prices λ > 0 tried per solve (besides λ = 0), geometric around the one that filled the
capacity at the last solve."""
RATIO = 1.15
"""Ratio between neighbouring prices."""
_RECENTRE = 24
"""How many times the prices may move before giving up on bounds for a problem."""
_REL_EPS = 1e-9
"""Margin on τ, relative to the magnitude of the sums (floating-point rounding of ≤ a few
hundred additions is ~1e-14 of it)."""
_centre = [1.0]
"""The prices' centre: the price that filled the capacity at the last solve."""
_EXPONENTS = np.arange(-(PRICES // 2), PRICES - PRICES // 2)
_LOW, _HIGH = np.array([(a, b) for a in range(PRICES + 1) for b in range(a)]).T
"""Index pairs a > b of the prices (λ_a > λ_b): each gives a lower bound on m."""


def _prices(centre: float) -> np.ndarray:
    return np.concatenate(([0.0], centre * RATIO ** _EXPONENTS))


def _relax(tables: list[np.ndarray], tops: list[int], prices: np.ndarray
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(grid, picks, h): the tables up to their tops (−inf beyond), and at each price (rows)
    each job's (columns) best count and h = its value less the price of its nodes."""
    width = max(tops) + 1
    grid = np.full((len(tables), width), -np.inf)
    for row, table, top in zip(grid, tables, tops):
        row[:top + 1] = table[:top + 1]
    reduced = grid[None, :, :] - prices[:, None, None] * np.arange(width, dtype=np.float64)
    picks = reduced.argmax(axis=2)
    return grid, picks, np.take_along_axis(reduced, picks[:, :, None], 2)[:, :, 0]


class Bounds:
    """The prices' relaxation of one problem: feasible value, upper bound, per-stage windows."""

    def __init__(self, tables: list[np.ndarray], cap: int, tops: list[int]) -> None:
        self.cap = cap
        self.ok = False
        self.lower = -np.inf
        self.upper = np.inf
        # math.isfinite reads a float64 entry as the float it is; np.isfinite on 50 scalars
        # a solve was a fifth of the bounds' time
        if not tables or not all(math.isfinite(t[0]) for t in tables):
            return
        centre = _centre[0]
        step = RATIO ** PRICES
        below, above = 0.0, np.inf  # a price known to overfill, one known to fit
        for _ in range(_RECENTRE):
            prices = _prices(centre)
            grid, picks, h = _relax(tables, tops, prices)
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
        if demand[-1] > cap:
            return
        fit = int(np.flatnonzero(demand <= cap)[0])
        if fit > 0:
            _centre[0] = float(prices[fit])
        rows = np.arange(len(tables))
        chosen = grid[rows, picks[fit]]
        self.lower = float(chosen.sum())  # a feasible allocation: Lagrangian at a fitting price
        if fit > 0:  # and the steps towards the next lower price's picks that still fit
            more = picks[fit - 1] - picks[fit]
            gain = grid[rows, picks[fit - 1]] - chosen
            up = np.flatnonzero(more > 0)
            order = up[np.argsort(-gain[up] / more[up], kind="stable")]
            fits = np.cumsum(more[order]) <= cap - demand[fit]
            self.lower += float(np.maximum(gain[order[fits]], 0.0).sum())
        prefix = np.zeros((len(tables) + 1, len(prices)))
        np.cumsum(h.T, axis=0, out=prefix[1:])
        self.upper = float((prices * cap + prefix[-1]).min())
        self.prices = prices
        self.prefix = prefix
        finite = np.where(np.isfinite(grid), grid, 0.0)
        self.eps = _REL_EPS * (float(np.abs(finite).sum()) + float(np.abs(h).sum())
                               + float(prices[-1]) * cap * len(tables) + abs(self.lower) + 1.0)
        self.ok = bool(np.isfinite(self.upper) and np.isfinite(self.lower))

    def windows(self, tau: float) -> tuple[list[int], list[int]] | None:
        """Per stage j = 0 … J, the counts [lo_j, hi_j] outside which no cell reaches ``tau``
        (provably, rounding included); None where some stage has none (τ is above the
        optimum's upper bound)."""
        prices, prefix, cap = self.prices, self.prefix, self.cap
        if self.upper < tau - self.eps:
            return None
        suffix = prices * cap + (prefix[-1] - prefix)  # (stages, prices): λ_b·cap + Σ_{i>j}
        # Pair (a, b), λ_a > λ_b: m ≥ need / (λ_a − λ_b); pair (b, a): m ≤ −need / (λ_a − λ_b).
        need = np.empty((len(prefix), 2, len(_LOW)))
        np.subtract(tau - self.eps, prefix[:, _LOW], out=need[:, 0])
        need[:, 0] -= suffix[:, _HIGH]
        np.subtract(tau - self.eps, prefix[:, _HIGH], out=need[:, 1])
        need[:, 1] -= suffix[:, _LOW]
        need /= prices[_LOW] - prices[_HIGH]
        ends = np.floor(need.max(axis=2)) - 1  # (lo, −hi) less a margin for the division
        lo = np.clip(ends[:, 0], 0, cap)
        hi = np.clip(-ends[:, 1], 0, cap)
        if (lo > hi).any():
            return None
        return lo.astype(int).tolist(), hi.astype(int).tolist()
