"""The exact dynamic program on node counts (a multiple-choice knapsack).

V_j(m) = max_{k ∈ K_j, k ≤ m} V_{j−1}(m − k) + v_j(k). Each stage is one vectorised numpy
step over a sliding window of the previous stage, so the cost is O(|N| · Σ_j |K_j|) element
operations with |J| Python-level steps; the counts are recovered by walking the stages back.
Capacity is capped at min(|N|, Σ_j max_j).
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ..errors import InfeasibleError
from ..model import Problem
from .objective import value_tables


def forward(tables: list[np.ndarray], capacity: int) -> list[np.ndarray]:
    """The DP's stages: ``stages[j][m]`` is the best value of the first j jobs on ≤ m nodes."""
    cap = min(capacity, sum(len(t) - 1 for t in tables))
    best = np.zeros(cap + 1)
    stages = [best]
    for table in tables:
        kmax = min(len(table) - 1, cap)
        # Row i of the window view is best shifted by k = kmax − i (−inf where m < k): a
        # (kmax+1) × (cap+1) block whose column maxima are the next stage.
        padded = np.concatenate((np.full(kmax, -np.inf), best))
        shifted = sliding_window_view(padded, cap + 1)
        best = (shifted + table[kmax::-1, None]).max(axis=0)
        stages.append(best)
    return stages


def backtrack(tables: list[np.ndarray], stages: list[np.ndarray], m: int) -> list[int]:
    """Counts reaching ``stages[-1][m]``.

    Each stage's choice is recovered by redoing its (bit-identical) sums at the one m on the
    path, instead of storing an argmax per stage.
    """
    m = min(m, len(stages[-1]) - 1)
    counts = [0] * len(tables)
    for j in range(len(tables) - 1, -1, -1):
        table = tables[j]
        kmax = min(len(table) - 1, m)
        k = int(np.argmax(stages[j][m - kmax:m + 1][::-1] + table[:kmax + 1]))
        counts[j] = k
        m -= k
    return counts


def solve_counts(tables: list[np.ndarray], capacity: int) -> tuple[list[int], float]:
    """Maximise Σ_j tables[j][k_j] subject to Σ_j k_j ≤ capacity; returns (counts, value)."""
    stages = forward(tables, capacity)
    m = int(np.argmax(stages[-1]))
    value = float(stages[-1][m])
    if value == -np.inf:
        raise InfeasibleError("no allocation satisfies the jobs' bounds")
    return backtrack(tables, stages, m), value


def solve(problem: Problem) -> tuple[dict[str, int], float]:
    """Exact optimum of the FreeTrain objective without side constraints."""
    counts, value = solve_counts(value_tables(problem), problem.nodes)
    return {j.id: k for j, k in zip(problem.jobs, counts)}, value
