"""The exact count MILP in HiGHS: the allocator when side constraints are on.

A multiple-choice knapsack: one binary y_jk per job j and allowed count k, exactly one chosen
per job, Σ_jk k·y_jk ≤ N, maximising Σ_jk v_j(k)·y_jk (the FreeTrain objective of
:mod:`.objective`). Side constraints stay small in this form:

* per-user caps: Σ_{j owned by u} Σ_k k·y_jk ≤ cap_u (one row per capped owner);
* fairness floor: counts below a job's floor are simply not offered (no row at all);
* at most R jobs running: Σ_j Σ_{k>0} y_jk ≤ R (one row).

Three exact reductions keep it fast at Summit scale:

* counts that use more nodes than a smaller allowed count for no more value are not offered
  (every row is monotone in k, so such a count is never needed for an optimum);
* HiGHS starts from a feasible solution: the DP's optimum under capacity, floors and per-user
  caps (owners' jobs combined by an inner DP), repaired greedily for the running limit;
* a column whose LP reduced cost exceeds the gap between the LP bound and that start cannot
  be in an optimum and is dropped (reduced-cost fixing, done once before branching).

The model is passed to HiGHS in one call from numpy arrays and solved with a relative gap of
0; anything but a proven optimum is a :class:`~malletrain_core.errors.SolverError`.
"""

from __future__ import annotations

import math
import time

import highspy
import numpy as np

from ..errors import InfeasibleError, SolverError
from ..model import Problem, Solution
from . import dp
from .objective import value_tables

_COLWISE = 1
_MAXIMIZE = -1
_INTEGER = 1


def fairness_floor(problem: Problem) -> dict[str, int]:
    """Each job's floor: ⌊min_share·N/|J|⌋ raised to min_nodes, capped at max_nodes (0: none)."""
    share = problem.constraints.min_share
    if share <= 0 or not problem.jobs:
        return {j.id: 0 for j in problem.jobs}
    base = math.floor(share * problem.nodes / len(problem.jobs) + 1e-9)
    if base <= 0:
        return {j.id: 0 for j in problem.jobs}
    return {j.id: min(max(base, j.min_nodes), j.max_nodes) for j in problem.jobs}


def _floored_tables(problem: Problem) -> list[np.ndarray]:
    """Value tables with every count below the job's fairness floor made infeasible."""
    floors = fairness_floor(problem)
    tables = value_tables(problem)
    for job, table in zip(problem.jobs, tables):
        floor = floors[job.id]
        if floor > len(table) - 1:
            raise InfeasibleError(f"job {job.id!r}: its fairness floor of {floor} nodes exceeds "
                                  f"the {problem.nodes} nodes available; lower min_share")
        table[:floor] = -np.inf
    return tables


def _candidates(tables: list[np.ndarray]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per job: the counts worth offering and their values (dominated counts dropped)."""
    counts: list[np.ndarray] = []
    values: list[np.ndarray] = []
    for v in tables:
        # Keep k only if it beats every allowed smaller count.
        best_before = np.concatenate(([-np.inf], np.maximum.accumulate(v)[:-1]))
        keep = np.flatnonzero((v > best_before) & np.isfinite(v))
        counts.append(keep)
        values.append(v[keep])
    return counts, values


def _relaxed_optimum(problem: Problem, tables: list[np.ndarray]) -> list[int]:
    """Exact optimum under capacity, floors and per-user caps, ignoring the running limit.

    Each capped owner's jobs are first combined by an inner DP into one table (best value on
    ≤ m of the owner's nodes, m ≤ cap); the outer DP then treats owners as single jobs.
    """
    caps = problem.constraints.user_max_nodes
    items: list[list[int]] = []
    outer: list[np.ndarray] = []
    inner: dict[int, list[np.ndarray]] = {}
    by_owner: dict[str, list[int]] = {}
    for j, job in enumerate(problem.jobs):
        if job.owner in caps:
            by_owner.setdefault(job.owner, []).append(j)
        else:
            items.append([j])
            outer.append(tables[j])
    for user, members in by_owner.items():
        stages = dp.forward([tables[j] for j in members], min(caps[user], problem.nodes))
        inner[len(items)] = stages
        items.append(members)
        outer.append(stages[-1])
    picks, _ = dp.solve_counts(outer, problem.nodes)
    ks = [0] * len(problem.jobs)
    for i, (members, m) in enumerate(zip(items, picks)):
        if i in inner:
            sub = dp.backtrack([tables[j] for j in members], inner[i], m)
        else:
            sub = [m]
        for j, k in zip(members, sub):
            ks[j] = k
    return ks


def _incumbent(problem: Problem, tables: list[np.ndarray], counts: list[np.ndarray],
               values: list[np.ndarray]) -> list[int]:
    """A feasible start: the relaxed optimum, greedily repaired for the running limit.

    Returns the chosen position in ``counts[j]`` per job. When the running limit does not
    bind, this start is optimal and HiGHS only has to prove it.
    """
    ks = _relaxed_optimum(problem, tables)
    # The largest kept count ≤ k is worth at least v(k) and uses no more nodes.
    pos = [int(np.searchsorted(c, k, side="right")) - 1 for c, k in zip(counts, ks)]
    limit = problem.constraints.max_running_jobs
    if limit is not None:
        floors = fairness_floor(problem)
        running = [j for j, p in enumerate(pos) if counts[j][p] > 0]
        while len(running) > limit:
            droppable = [j for j in running if floors[problem.jobs[j].id] == 0]
            j = min(droppable, key=lambda j: values[j][pos[j]] - values[j][0])
            pos[j] = 0
            running.remove(j)
    return pos


def _check_obviously_infeasible(problem: Problem) -> None:
    """Name the conflict when the floors alone break capacity, the running limit or a cap."""
    floors = fairness_floor(problem)
    need = sum(floors.values())
    if need > problem.nodes:
        raise InfeasibleError(f"the fairness floors need {need} nodes but only {problem.nodes} "
                              "are available; lower min_share")
    limit = problem.constraints.max_running_jobs
    forced = sum(1 for f in floors.values() if f > 0)
    if limit is not None and forced > limit:
        raise InfeasibleError(f"the fairness floor makes {forced} jobs run but max_running_jobs "
                              f"is {limit}; lower min_share or raise max_running_jobs")
    caps = problem.constraints.user_max_nodes
    for user, cap in caps.items():
        owned = sum(floors[j.id] for j in problem.jobs if j.owner == user)
        if owned > cap:
            raise InfeasibleError(f"user {user!r}: the fairness floors of their jobs need {owned} "
                                  f"nodes but user_max_nodes is {cap}; lower min_share or the cap")


def _highs(problem: Problem, job_of: np.ndarray, k: np.ndarray, cost: np.ndarray,
           integer: bool, time_limit_s: float | None = None) -> highspy.Highs:
    """The count model over the given columns, loaded into a silent HiGHS instance.

    Rows: one choice per job; the capacity; one per capped owner; the running limit.
    """
    jobs = problem.jobs
    num_jobs, num_col = len(jobs), len(k)
    cons = problem.constraints
    col = np.arange(num_col)
    used = k > 0
    kf = k.astype(float)
    entries_col = [col, col[used]]
    entries_row = [job_of, np.full(int(used.sum()), num_jobs)]
    entries_val = [np.ones(num_col), kf[used]]
    row_lower: list[np.ndarray] = [np.ones(num_jobs), np.array([-np.inf])]
    row_upper: list[np.ndarray] = [np.ones(num_jobs), np.array([float(problem.nodes)])]
    next_row = num_jobs + 1
    for user, cap in sorted(cons.user_max_nodes.items()):
        owned = np.array([j.owner == user for j in jobs])
        mask = used & owned[job_of]
        if not mask.any():
            continue
        entries_col.append(col[mask])
        entries_row.append(np.full(int(mask.sum()), next_row))
        entries_val.append(kf[mask])
        row_lower.append(np.array([-np.inf]))
        row_upper.append(np.array([float(cap)]))
        next_row += 1
    if cons.max_running_jobs is not None:
        entries_col.append(col[used])
        entries_row.append(np.full(int(used.sum()), next_row))
        entries_val.append(np.ones(int(used.sum())))
        row_lower.append(np.array([-np.inf]))
        row_upper.append(np.array([float(cons.max_running_jobs)]))
        next_row += 1

    cols = np.concatenate(entries_col)
    order = np.argsort(cols, kind="stable")
    a_index = np.concatenate(entries_row)[order].astype(np.int32)
    a_value = np.concatenate(entries_val)[order]
    a_start = np.concatenate(([0], np.cumsum(np.bincount(cols, minlength=num_col))[:-1]))

    highs = highspy.Highs()
    highs.setOptionValue("output_flag", False)
    highs.setOptionValue("mip_rel_gap", 0.0)
    highs.setOptionValue("threads", 1)
    # Presolve finds nothing to remove in this model and costs more than it saves.
    highs.setOptionValue("presolve", "off")
    if time_limit_s is not None:
        highs.setOptionValue("time_limit", float(time_limit_s))
    status = highs.passModel(
        num_col, next_row, len(a_value), _COLWISE, _MAXIMIZE, 0.0,
        cost, np.zeros(num_col), np.ones(num_col),
        np.concatenate(row_lower), np.concatenate(row_upper),
        a_start.astype(np.int32), a_index, a_value,
        np.full(num_col, _INTEGER if integer else 0, dtype=np.int32))
    if status != highspy.HighsStatus.kOk:
        raise SolverError(f"HiGHS refused the count model ({status}); run with --debug and "
                          "report the problem file")
    return highs


def _reduced_cost_filter(problem: Problem, job_of: np.ndarray, k: np.ndarray,
                         cost: np.ndarray, warm: np.ndarray) -> np.ndarray:
    """Columns that can still be part of a solution at least as good as the warm start.

    With the LP relaxation's optimum UB and a column's reduced cost d ≤ 0, every solution
    using that column is worth at most UB + d; below the start's value it cannot be optimal.
    """
    keep = np.ones(len(k), dtype=bool)
    lp = _highs(problem, job_of, k, cost, integer=False)
    lp.run()
    if lp.getModelStatus() != highspy.HighsModelStatus.kOptimal:
        return keep
    bound = lp.getInfo().objective_function_value
    start_value = float(cost[warm].sum())
    slack = bound - start_value
    if slack < 0:
        return keep
    reduced = np.asarray(lp.getSolution().col_dual)
    tol = 1e-7 * max(1.0, abs(bound)) + 1e-6
    keep = (reduced >= -(slack + tol)) | warm
    return keep


def solve(problem: Problem, time_limit_s: float | None = None) -> Solution:
    """Exact optimum of the FreeTrain objective under the problem's side constraints."""
    start = time.perf_counter()
    jobs = problem.jobs
    if not jobs:
        return Solution({}, 0.0, "milp", (time.perf_counter() - start) * 1e3)
    _check_obviously_infeasible(problem)
    tables = _floored_tables(problem)
    counts, values = _candidates(tables)
    start_pos = _incumbent(problem, tables, counts, values)

    sizes = np.array([len(c) for c in counts])
    job_of = np.repeat(np.arange(len(jobs)), sizes)
    k = np.concatenate(counts)
    cost = np.concatenate(values)
    warm = np.zeros(len(k), dtype=bool)
    warm[np.concatenate(([0], np.cumsum(sizes)[:-1])) + np.asarray(start_pos)] = True

    keep = _reduced_cost_filter(problem, job_of, k, cost, warm)
    job_of, k, cost, warm = job_of[keep], k[keep], cost[keep], warm[keep]
    highs = _highs(problem, job_of, k, cost, integer=True, time_limit_s=time_limit_s)
    highs.setSolution(len(k), np.arange(len(k), dtype=np.int32), warm.astype(float))
    highs.run()
    model_status = highs.getModelStatus()
    if model_status == highspy.HighsModelStatus.kInfeasible:
        raise InfeasibleError("the side constraints admit no allocation; relax user_max_nodes, "
                              "min_share or max_running_jobs")
    if model_status != highspy.HighsModelStatus.kOptimal:
        raise SolverError(f"HiGHS stopped without a proven optimum "
                          f"({highs.modelStatusToString(model_status)}); raise the time limit")

    chosen = np.asarray(highs.getSolution().col_value) > 0.5
    picked = np.flatnonzero(chosen)
    num_jobs = len(jobs)
    if len(picked) != num_jobs or len(set(job_of[picked].tolist())) != num_jobs:
        raise SolverError(f"HiGHS returned {len(picked)} choices for {num_jobs} jobs; "
                          "report the problem file")
    alloc = {jobs[int(job_of[c])].id: int(k[c]) for c in picked}
    alloc = {job.id: alloc[job.id] for job in jobs}
    objective = float(np.sum(cost[picked]))
    elapsed = (time.perf_counter() - start) * 1e3
    return Solution(alloc, objective, "milp", elapsed, "optimal", 0.0)
