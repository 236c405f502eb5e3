"""The exact dynamic program on node counts (a multiple-choice knapsack).

V_j(m) = max_{k ∈ K_j, k ≤ m} V_{j−1}(m − k) + v_j(k). Each stage is one vectorised max-plus
step: a strided (k × m) view of the previous stage plus the job's table, reduced by column
maxima, written into one preallocated grid (a few numpy calls per job, no per-stage
allocation). Four exact savings keep the same answer bit for bit:

* a stage is constant beyond the nodes its jobs can use at all (Σ of their largest useful
  counts), so only that prefix is computed and the rest is filled;
* a count k whose value does not exceed that of a smaller count can never win (stages are
  non-decreasing in m), so a job's rows stop at its last strict running maximum — a believed
  curve held flat, or one past its peak, costs no more than its useful range;
* a cell (j, m) whose best completion is provably below a feasible allocation's value (the
  Lagrangian bounds of :mod:`.dpbounds`, with a margin for rounding) cannot be on the optimum
  nor tie with it, so :func:`solve_counts` computes each stage only on the band of counts that
  the bounds leave (a fifth of the table over the what-if month's first 5 days), the rest
  reading as −inf;
* where the bounds do not apply, the answer is still the first m where the last stage reaches
  its maximum, so each stage is first computed only where the top columns of the last stage
  read it, and everything only when the maximum is already reached at that window's start.

Counts are recovered by walking the stages back. Capacity is capped at min(|N|, Σ_j max_j).
Value tables of unchanged jobs are reused between calls (keyed by the Job object, which the
engine keeps while nothing the table depends on changes), and so is the last answer where the
jobs are the same and the capacity change cannot move it (:func:`reusable`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .. import shortcuts
from ..errors import InfeasibleError
from ..model import Job, Objective, Problem
from .dpbounds import Bounds
from .objective import job_values

_ITEM = np.dtype(np.float64).itemsize
_CACHE_LIMIT = 1024
"""Job ids whose latest table is kept (cleared all at once beyond it)."""
_STALE_LIMIT = 256
"""Tables of jobs absent from the problem being solved (ended, or another engine's) that
:func:`solve` keeps before it drops them all."""
TAIL_STAGES = 2
"""The last stage is first computed on its top TAIL_STAGES × (largest useful count) columns."""
_tables: dict[str, tuple[Job, float, Objective, int, np.ndarray, int]] = {}
"""Job id -> (its latest Job, look-ahead, objective, largest count, value table, the table's
:func:`useful_top`)."""
_last: list[tuple[tuple[Job, ...], float, Objective, list[np.ndarray], int,
                  tuple[list[int], float]]] = []
"""The last problem :func:`solve` answered: (jobs, look-ahead, objective, tables, capacity,
answer)."""


def useful_top(table: np.ndarray) -> int:
    """The largest count whose value beats every smaller count's: the last strict running
    maximum, which is where the table first reaches its maximum."""
    return int(table.argmax())


def forward(tables: list[np.ndarray], capacity: int) -> list[np.ndarray]:
    """The DP's stages: ``stages[j][m]`` is the best value of the first j jobs on ≤ m nodes."""
    cap = min(capacity, sum(len(t) - 1 for t in tables))
    return _forward(tables, cap, [min(useful_top(t), cap) for t in tables], None)[0]


def _forward(tables: list[np.ndarray], cap: int, tops: list[int],
             tail: int | None) -> tuple[list[np.ndarray], list[int]]:
    """Stages and, per stage, the first column computed (0 everywhere when ``tail`` is None).

    With ``tail`` the last stage is computed only on its top ``tail`` columns, and each earlier
    stage only where a later one reads it (``lows``); columns below are left unset.
    """
    reach = [0]
    for top in tops:
        reach.append(min(cap, reach[-1] + top))
    lows = [0] * (len(tables) + 1)
    if tail is not None:
        low = max(0, reach[-1] - tail)
        for j in range(len(tables), 0, -1):
            lows[j] = min(low, reach[j])
            low = max(0, lows[j] - tops[j - 1])
    return _stages(tables, cap, tops, lows, reach, False), lows


def _stages(tables: list[np.ndarray], cap: int, tops: list[int], lo: list[int], hi: list[int],
            windowed: bool) -> list[np.ndarray]:
    """Stage j computed on columns lo[j] … hi[j] from the previous stage as it stands.

    ``windowed``: every cell outside the columns is −inf (:func:`_solve_within`). Otherwise
    each stage is constant beyond its ``hi`` (the nodes its jobs can use at all) and columns
    below ``lo`` are left unset (:func:`_forward`).
    """
    pad = max(tops, default=0)
    width = pad + cap + 1
    if windowed:
        grid = np.full((len(tables) + 1, width), -np.inf)
        grid[0, pad + lo[0]:pad + hi[0] + 1] = 0.0
        work = np.empty((pad + 1, max(b - a for a, b in zip(lo, hi)) + 1))
    else:
        grid = np.empty((len(tables) + 1, width))
        grid[:, :pad] = -np.inf
        grid[0, pad:] = 0.0
        work = np.empty((pad + 1, cap + 1))
    flat = grid.reshape(-1)
    add, best, view = np.add, np.maximum.reduce, np.ndarray
    for j, (table, top) in enumerate(zip(tables, tops)):
        a, b = lo[j + 1], hi[j + 1]
        k0, k1 = 0, top
        if windowed:
            k0, k1 = max(0, a - hi[j]), min(top, b - lo[j])  # counts reaching the window
            if k0 > k1:
                continue
        # Row i is the previous stage shifted right by k = k1 − i (−inf where m < k).
        start = j * width + pad + a
        shifted = view((k1 - k0 + 1, b - a + 1), np.float64, grid, (start - k1) * _ITEM,
                       (_ITEM, _ITEM))
        block = work[:k1 - k0 + 1, :b - a + 1]
        add(shifted, table[k1::-1, None] if k0 == 0 else table[k1:k0 - 1:-1, None], out=block)
        best(block, axis=0, out=flat[start + width:start + width + b - a + 1])
        if b < cap and not windowed:
            flat[start + width + b - a + 1:(j + 2) * width] = flat[start + width + b - a]
    return [grid[j, pad:] for j in range(len(tables) + 1)]


def backtrack(tables: list[np.ndarray], stages: list[np.ndarray], m: int,
              tops: list[int] | None = None) -> list[int]:
    """Counts reaching ``stages[-1][m]``.

    Each stage's choice is recovered by redoing its (bit-identical) sums at the one m on the
    path, instead of storing an argmax per stage. ``tops`` (each table's :func:`useful_top`)
    limits the search to counts that can win; the first best count is the same either way.
    """
    m = min(m, len(stages[-1]) - 1)
    counts = [0] * len(tables)
    for j in range(len(tables) - 1, -1, -1):
        table = tables[j]
        kmax = min(len(table) - 1 if tops is None else tops[j], m)
        k = int((stages[j][m - kmax:m + 1][::-1] + table[:kmax + 1]).argmax())
        counts[j] = k
        m -= k
    return counts


def solve_counts(tables: list[np.ndarray], capacity: int,
                 known_tops: Sequence[int] | None = None) -> tuple[list[int], float]:
    """Maximise Σ_j tables[j][k_j] subject to Σ_j k_j ≤ capacity; returns (counts, value).
    ``known_tops``: each table's :func:`useful_top` where the caller knows it (kept with the
    cached tables: 50 argmax calls a solve were a twentieth of its time).

    The optimum is the first m where the last stage reaches its maximum. The stages are first
    computed only inside the counts that the prices' bounds leave possible
    (:func:`_solve_within`); where those do not apply, only where the last
    :data:`TAIL_STAGES` × (largest useful count) columns of the last stage need them; only if
    the maximum is already reached at that window's start (so the first maximum may lie below
    it) are they computed in full.
    """
    cap = min(capacity, sum(len(t) - 1 for t in tables))
    if known_tops is None:
        tops = [min(useful_top(t), cap) for t in tables]
    else:
        tops = [min(top, cap) for top in known_tops]
        if shortcuts.CHECKED:
            shortcuts.check("dp.tops", tops, [min(useful_top(t), cap) for t in tables])
    answer = _solve_within(tables, cap, tops)
    if answer is None:
        return _solve_tail(tables, cap, tops)
    if shortcuts.CHECKED:
        shortcuts.check("dp.bound", answer, _solve_tail(tables, cap, tops))
    return answer


def _solve_tail(tables: list[np.ndarray], cap: int, tops: list[int]) -> tuple[list[int], float]:
    stages, lows = _forward(tables, cap, tops, TAIL_STAGES * max(tops, default=0))
    last, low = stages[-1], lows[-1]
    m = low + int(last[low:].argmax())
    if low > 0 and last[low] == last[m]:
        stages, _ = _forward(tables, cap, tops, None)
        last = stages[-1]
        m = int(last.argmax())
    value = float(last[m])
    if value == -np.inf:
        raise InfeasibleError("no allocation satisfies the jobs' bounds")
    return backtrack(tables, stages, m, tops), value


def _solve_within(tables: list[np.ndarray], cap: int, tops: list[int]
                  ) -> tuple[list[int], float] | None:
    """The DP on the cells that can reach the value of a known feasible allocation only
    (:mod:`.dpbounds`): the same answer, bit for bit, as the full DP. Every cell left out is
    below that value, so below the optimum, by more than any rounding of the sums: no cell that
    is computed, nor the first maximum, nor the walk back changes (cells left out read as −inf,
    and a computed cell whose best predecessor was left out is itself below the optimum).
    None where the bounds do not apply (no price filling the capacity, a job with no allowed
    count)."""
    bounds = Bounds(tables, cap, tops)
    if not bounds.ok:
        return None
    cols = bounds.windows(bounds.lower)
    if cols is None:
        return None
    low, high = cols[0][-1], cols[1][-1]
    stages = _stages(tables, cap, tops, cols[0], cols[1], True)
    last = stages[-1]
    m = low + int(last[low:high + 1].argmax())
    value = float(last[m])
    if not value >= bounds.lower - bounds.eps / 4:  # cannot happen: the feasible one is in
        return None
    return backtrack(tables, stages, m, tops), value


def cached_values(job: Job, capacity: int, lookahead_s: float, objective: Objective) -> np.ndarray:
    """``job_values(job, capacity, …)``, reused while the same Job object comes back
    (:func:`_cached`)."""
    return _cached(job, capacity, lookahead_s, objective)[0]


def _cached(job: Job, capacity: int, lookahead_s: float, objective: Objective
            ) -> tuple[np.ndarray, int]:
    """``job_values(job, capacity, …)`` and its :func:`useful_top`, reused while the same
    Job object comes back.

    A table for a larger capacity serves a smaller one by its prefix (each entry depends on k
    only). One entry per job id, for its latest Job object: the engine builds a new Job
    whenever a job's view changes, and keeping the superseded ones (keyed by object, as before)
    held thousands of dead Jobs, curves and tables in a long-running daemon before each
    clear.
    """
    kmax = job.max_nodes if job.max_nodes < capacity else capacity
    hit = _tables.get(job.id)
    if hit is not None and hit[0] is job and hit[1] == lookahead_s and hit[2] is objective:
        if hit[3] == kmax:
            return hit[4], hit[5]
        if hit[3] > kmax:  # a prefix holding the first maximum has it first too
            prefix = hit[4][:kmax + 1]
            return prefix, hit[5] if hit[5] <= kmax else useful_top(prefix)
    table = job_values(job, capacity, lookahead_s, objective)
    table.flags.writeable = False
    if len(_tables) >= _CACHE_LIMIT and job.id not in _tables:
        _tables.clear()
    top = useful_top(table)
    _tables[job.id] = (job, lookahead_s, objective, kmax, table, top)
    return table, top


def reusable(tables: list[np.ndarray], old_capacity: int, counts: list[int],
             capacity: int) -> bool:
    """Whether :func:`solve_counts` (``tables``, ``capacity``) answers ``counts`` again, given
    that it answered ``counts`` for the same tables on ``old_capacity``.

    The last stage V(m) and the walk back from a given m do not depend on the capacity (for
    m within it); the answer is the first m where V reaches its maximum over [0, capacity].
    So the old m* = Σ counts stays the answer when it is within the new capacity and either the
    capacity did not grow (a first maximum over a range stays first over a sub-range holding
    it) or the old capacity already held every job's useful top (V is at its overall maximum
    from Σ tops on, so a larger range adds no better m).
    """
    top_sum = sum(len(t) - 1 for t in tables)
    old_cap, cap = min(old_capacity, top_sum), min(capacity, top_sum)
    if sum(counts) > cap:
        return False
    return cap <= old_cap or old_cap >= sum(useful_top(t) for t in tables)


def solve(problem: Problem) -> tuple[dict[str, int], float]:
    """Exact optimum of the FreeTrain objective without side constraints."""
    cached = [_cached(j, problem.nodes, problem.lookahead_s, problem.objective)
              for j in problem.jobs]
    tables = [table for table, _ in cached]
    if len(_tables) > len(problem.jobs) + _STALE_LIMIT:
        live = {j.id for j in problem.jobs}
        for stale in [k for k in _tables if k not in live]:
            del _tables[stale]
    answer: tuple[list[int], float] | None = None
    if _last:
        jobs, lookahead, objective, old_tables, old_cap, old = _last[0]
        if (lookahead == problem.lookahead_s and objective is problem.objective
                and len(jobs) == len(problem.jobs)
                and all(a is b for a, b in zip(jobs, problem.jobs))
                and all(a is b for a, b in zip(old_tables, tables))
                and reusable(tables, old_cap, old[0], problem.nodes)):
            answer = old
            if shortcuts.CHECKED:
                shortcuts.check("dp.reuse", answer, solve_counts(tables, problem.nodes))
    if answer is None:
        answer = solve_counts(tables, problem.nodes, [top for _, top in cached])
    _last[:] = [(problem.jobs, problem.lookahead_s, problem.objective, tables, problem.nodes,
                 answer)]
    counts, value = answer
    return {j.id: k for j, k in zip(problem.jobs, counts)}, value
