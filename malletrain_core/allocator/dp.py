"""The exact dynamic program on node counts (a multiple-choice knapsack).

V_j(m) = max_{k ∈ K_j, k ≤ m} V_{j−1}(m − k) + v_j(k). Each stage is one vectorised numpy
step over a sliding window of the previous stage, so the cost is O(|N| · Σ_j |K_j|) element
operations with |J| Python-level steps. Capacity is capped at min(|N|, Σ_j max_j).
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ..errors import InfeasibleError
from ..model import Problem
from .objective import value_tables


def solve_counts(tables: list[np.ndarray], capacity: int) -> tuple[list[int], float]:
    """Maximise Σ_j tables[j][k_j] subject to Σ_j k_j ≤ capacity; returns (counts, value)."""
    cap = min(capacity, sum(len(t) - 1 for t in tables))
    best = np.zeros(cap + 1)
    choices: list[np.ndarray] = []
    for table in tables:
        kmax = min(len(table) - 1, cap)
        # padded[m + i] = best[m + i − kmax]; window i ↔ k = kmax − i.
        padded = np.concatenate((np.full(kmax, -np.inf), best))
        windows = sliding_window_view(padded, kmax + 1)
        candidates = windows + table[kmax::-1]
        pick = np.argmax(candidates, axis=1)
        best = candidates[np.arange(cap + 1), pick]
        choices.append((kmax - pick).astype(np.int32))
    m = int(np.argmax(best))
    value = float(best[m])
    if value == -np.inf:
        raise InfeasibleError("no allocation satisfies the jobs' bounds")
    counts = [0] * len(tables)
    for j in range(len(tables) - 1, -1, -1):
        k = int(choices[j][m])
        counts[j] = k
        m -= k
    return counts, value


def solve(problem: Problem) -> tuple[dict[str, int], float]:
    """Exact optimum of the FreeTrain objective without side constraints."""
    counts, value = solve_counts(value_tables(problem), problem.nodes)
    return {j.id: k for j, k in zip(problem.jobs, counts)}, value
