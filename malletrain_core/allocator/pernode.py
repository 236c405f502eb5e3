"""FreeTrain's per-node MILP in HiGHS: a reference for tests and benchmarks, never for decisions.

Built from the raw job data (curve points, bounds, costs) by its own code, so that agreement
with the DP and the count MILP is evidence for both. Data: nodes n = 0 … N−1 where job j
holds a contiguous block of C_j nodes now (the current map c_jn), look-ahead T, M = 2N + 1.

Variables: x_jn (node n serves job j), a_j (job runs), m_j (job may only gain nodes),
u_j / d_j (job grows / shrinks), λ_ji ∈ [0, 1] weights on the curve's breakpoints and
s_ji segment binaries (HiGHS has no SOS2). With n_j = Σ_n x_jn and O_j the objective curve:

    max  Σ_j T·Σ_i O_j(b_i)·λ_ji − r_j·(T_up,j·u_j + T_dw,j·d_j),    r_j = O_j(C_j)
    s.t. Σ_j x_jn ≤ 1                                  every node serves one job
         min_j·a_j ≤ n_j ≤ min(max_j, N)·a_j            0 or within the job's bounds
         Σz_j − (n_j − C_j) ≤ M·(1 − m_j)               no migration, with
         Σz_j − (C_j − n_j) ≤ M·m_j                     Σz_j = Σ_n x_jn ⊕ c_jn (linear: c is data)
         n_j − C_j ≤ M·u_j,  C_j − n_j ≤ M·d_j          grow / shrink indicators
         Σ_i λ_ji = 1, Σ_i b_i·λ_ji = n_j, Σ_i s_ji = 1  λ on one segment only
         λ_j0 ≤ s_j1, λ_ji ≤ s_ji + s_j,i+1, λ_jB ≤ s_jB

Σz_j counts the nodes the job gains plus those it loses, so the two no-migration rows allow
only one of the two. With FreeTrain's M = N + 1 a job could not shrink or grow by more than
about N/2 nodes in one event; M = 2N + 1 bounds 2·|n_j − C_j| for every change. The curve
rows are exact at every integer n_j because n_j lies on the one active segment, where the
curve is linear. Side constraints (per-user caps, fairness floor, running limit) are added as
rows on n_j and a_j.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import highspy
import numpy as np

from ..errors import InfeasibleError, SolverError
from ..model import Job, Objective, Problem, Solution
from .milp import fairness_floor

_ROWWISE = 2
_MAXIMIZE = -1


def _breakpoints(job: Job, nodes: int, objective: Objective) -> tuple[np.ndarray, np.ndarray, float]:
    """The curve's breakpoints up to min(max_j, N), their objective values, and r_j."""
    assert job.curve is not None
    xs = np.array((0,) + job.curve.nodes, dtype=float)
    ys = np.array((0.0,) + job.curve.throughput)
    if objective is Objective.SPEEDUP:
        p1 = float(np.interp(1.0, xs, ys))
        ys = ys / p1 if p1 > 0 else np.zeros_like(ys)
    kmax = min(job.max_nodes, nodes)
    inner = [x for x in xs if 0 < x < kmax]
    points = np.array([0.0] + inner + ([float(kmax)] if kmax > 0 else []))
    values = np.interp(points, xs, ys)
    c = job.current_nodes
    rate = float(np.interp(c, xs, ys)) if c >= job.min_nodes and c > 0 else 0.0
    return points, values, rate


@dataclass
class PerNodeModel:
    """The per-node model loaded in HiGHS, with its size and what reading a solution needs."""

    highs: highspy.Highs
    num_binaries: int
    num_rows: int
    num_nodes: int

    def counts(self, problem: Problem) -> list[int]:
        """n_j of the solution HiGHS holds."""
        values = np.asarray(self.highs.getSolution().col_value)
        x = values[:len(problem.jobs) * self.num_nodes].reshape(len(problem.jobs), self.num_nodes)
        return [int(round(v)) for v in x.sum(axis=1)]

    def assignment(self, problem: Problem) -> list[frozenset[int]]:
        """The node indices each job serves in HiGHS's solution (job j held a block now)."""
        values = np.asarray(self.highs.getSolution().col_value)
        x = values[:len(problem.jobs) * self.num_nodes].reshape(len(problem.jobs), self.num_nodes)
        return [frozenset(np.flatnonzero(row > 0.5).tolist()) for row in x]


def current_blocks(problem: Problem) -> list[frozenset[int]]:
    """The current map c_jn the model assumes: job j holds the next C_j node indices."""
    blocks, first = [], 0
    for job in problem.jobs:
        blocks.append(frozenset(range(first, first + job.current_nodes)))
        first += job.current_nodes
    return blocks


class _Builder:
    """Collects columns and rows as arrays; rows reference columns by index."""

    def __init__(self) -> None:
        self.cost: list[np.ndarray] = []
        self.upper: list[np.ndarray] = []
        self.integer: list[np.ndarray] = []
        self.num_col = 0
        self.rows: list[np.ndarray] = []
        self.cols: list[np.ndarray] = []
        self.vals: list[np.ndarray] = []
        self.lower_b: list[float] = []
        self.upper_b: list[float] = []

    def add_cols(self, count: int, cost: np.ndarray | float = 0.0, upper: float = 1.0,
                 integer: bool = True) -> np.ndarray:
        idx = np.arange(self.num_col, self.num_col + count)
        self.cost.append(np.broadcast_to(np.asarray(cost, dtype=float), (count,)).copy())
        self.upper.append(np.full(count, upper))
        self.integer.append(np.full(count, int(integer), dtype=np.int32))
        self.num_col += count
        return idx

    def add_row(self, cols: np.ndarray, vals: np.ndarray | float, lo: float, hi: float) -> None:
        cols = np.asarray(cols)
        self.rows.append(np.full(len(cols), len(self.lower_b)))
        self.cols.append(cols)
        self.vals.append(np.broadcast_to(np.asarray(vals, dtype=float), (len(cols),)))
        self.lower_b.append(lo)
        self.upper_b.append(hi)

    def add_rows(self, rows: np.ndarray, cols: np.ndarray, vals: np.ndarray, count: int,
                 lo: float, hi: float) -> None:
        """Several rows at once; ``rows`` numbers them 0 … count−1 locally."""
        self.rows.append(np.asarray(rows) + len(self.lower_b))
        self.cols.append(np.asarray(cols))
        self.vals.append(np.asarray(vals, dtype=float))
        self.lower_b.extend([lo] * count)
        self.upper_b.extend([hi] * count)

    def highs(self) -> highspy.Highs:
        rows = np.concatenate(self.rows)
        order = np.argsort(rows, kind="stable")
        num_row = len(self.lower_b)
        start = np.concatenate(([0], np.cumsum(np.bincount(rows, minlength=num_row))[:-1]))
        index = np.concatenate(self.cols)[order].astype(np.int32)
        value = np.concatenate(self.vals)[order]
        h = highspy.Highs()
        h.setOptionValue("output_flag", False)
        status = h.passModel(
            self.num_col, num_row, len(value), _ROWWISE, _MAXIMIZE, 0.0,
            np.concatenate(self.cost), np.zeros(self.num_col), np.concatenate(self.upper),
            np.array(self.lower_b), np.array(self.upper_b), start.astype(np.int32), index,
            value, np.concatenate(self.integer))
        if status != highspy.HighsStatus.kOk:
            raise SolverError(f"HiGHS refused the per-node model ({status})")
        return h


def build(problem: Problem, big_m: int | None = None) -> PerNodeModel:
    """The per-node MILP of ``problem`` loaded into a HiGHS instance (not solved).

    ``big_m`` defaults to 2N + 1; a smaller value (FreeTrain's N + 1) reproduces its flaw.
    """
    n_nodes = problem.nodes
    jobs = problem.jobs
    big_m = 2 * n_nodes + 1 if big_m is None else big_m
    b = _Builder()
    x = b.add_cols(len(jobs) * n_nodes).reshape(len(jobs), n_nodes)
    node_ids = np.arange(n_nodes)
    b.add_rows(np.tile(node_ids, len(jobs)), x.ravel(), np.ones(x.size), n_nodes, -np.inf, 1.0)
    floors = fairness_floor(problem)
    running = []
    held_from = 0
    for j, job in enumerate(jobs):
        points, values, rate = _breakpoints(job, n_nodes, problem.objective)
        c = job.current_nodes
        mine = np.zeros(n_nodes, dtype=bool)
        mine[held_from:held_from + c] = True
        held_from += c
        xj = x[j]
        kmax = int(points[-1])
        a, m, u, d = b.add_cols(4, cost=np.array(
            [0.0, 0.0, -rate * job.scale_up_s, -rate * job.scale_down_s]))
        running.append(a)
        ones = np.ones(n_nodes)
        b.add_row(np.append(xj, a), np.append(ones, -kmax), -np.inf, 0.0)
        b.add_row(np.append(xj, a), np.append(ones, -job.min_nodes), 0.0, np.inf)
        # Σz − (n − C) = 2·(nodes lost) and Σz − (C − n) = 2·(nodes gained).
        b.add_row(np.append(xj[mine], m), np.append(np.full(c, -2.0), big_m), -np.inf,
                  big_m - 2.0 * c)
        b.add_row(np.append(xj[~mine], m), np.append(np.full(n_nodes - c, 2.0), -big_m),
                  -np.inf, 0.0)
        b.add_row(np.append(xj, u), np.append(ones, -big_m), -np.inf, float(c))
        b.add_row(np.append(xj, d), np.append(-ones, -big_m), -np.inf, float(-c))
        if floors[job.id] > 0:
            b.add_row(xj, 1.0, float(floors[job.id]), np.inf)
        if kmax == 0:
            b.add_row(xj, 1.0, 0.0, 0.0)
            continue
        lam = b.add_cols(len(points), cost=problem.lookahead_s * values, integer=False)
        seg = b.add_cols(len(points) - 1)
        b.add_row(lam, 1.0, 1.0, 1.0)
        b.add_row(seg, 1.0, 1.0, 1.0)
        b.add_row(np.append(lam, xj), np.append(points, -ones), 0.0, 0.0)
        for i, li in enumerate(lam):
            near = seg[max(i - 1, 0):i + 1]
            b.add_row(np.append(li, near), np.append(1.0, -np.ones(len(near))), -np.inf, 0.0)
    cons = problem.constraints
    for user, cap in cons.user_max_nodes.items():
        owned = [j for j, job in enumerate(jobs) if job.owner == user]
        if owned:
            b.add_row(x[owned].ravel(), 1.0, -np.inf, float(cap))
    if cons.max_running_jobs is not None and running:
        b.add_row(np.array(running), 1.0, -np.inf, float(cons.max_running_jobs))
    num_bin = int(sum(int(i.sum()) for i in b.integer))
    return PerNodeModel(b.highs(), num_bin, len(b.lower_b), n_nodes)


def objective_of(problem: Problem, counts: list[int]) -> float:
    """FreeTrain's objective for given counts, computed from the curve points directly."""
    total = 0.0
    for job, k in zip(problem.jobs, counts):
        points, values, rate = _breakpoints(job, problem.nodes, problem.objective)
        total += problem.lookahead_s * float(np.interp(k, points, values))
        if k > job.current_nodes:
            total -= rate * job.scale_up_s
        elif k < job.current_nodes:
            total -= rate * job.scale_down_s
    return total


def solve(problem: Problem, time_limit_s: float | None = None) -> Solution:
    """Solve the per-node model; status "optimal" or "time_limit" (then ``gap`` is HiGHS's)."""
    start = time.perf_counter()
    if not problem.jobs:
        return Solution({}, 0.0, "pernode", 0.0)
    model = build(problem)
    h = model.highs
    h.setOptionValue("mip_rel_gap", 0.0)
    h.setOptionValue("threads", 1)
    if time_limit_s is not None:
        h.setOptionValue("time_limit", float(time_limit_s))
    h.run()
    status = h.getModelStatus()
    has_solution = h.getInfo().primal_solution_status == 2
    if status == highspy.HighsModelStatus.kInfeasible:
        raise InfeasibleError("the per-node model admits no allocation under these constraints")
    if status == highspy.HighsModelStatus.kOptimal:
        label, gap = "optimal", 0.0
    elif status == highspy.HighsModelStatus.kTimeLimit and has_solution:
        label, gap = "time_limit", float(h.getInfo().mip_gap)
    else:
        raise SolverError(f"per-node MILP stopped without a solution "
                          f"({h.modelStatusToString(status)}); raise the time limit")
    counts = model.counts(problem)
    elapsed = (time.perf_counter() - start) * 1e3
    return Solution({j.id: k for j, k in zip(problem.jobs, counts)},
                    objective_of(problem, counts), "pernode", elapsed, label, gap)
