"""FreeTrain's objective on node counts: the value of giving job j exactly k nodes.

    v_j(k) = T_fwd · O_j(k) − r_j · (T_up,j · [k > C_j] + T_dw,j · [k < C_j])

with r_j = O_j(C_j) the rate before the change (0 when the job is not running, so a job at 0
nodes starts for free), O_j the objective curve (throughput, or speed-up P/P(1)) and k ranging
over {0} ∪ {min_j … min(max_j, N)}. Infeasible counts are −inf.
"""

from __future__ import annotations

import numpy as np

from ..model import Job, Objective, Problem, objective_curve


def job_values(job: Job, capacity: int, lookahead_s: float, objective: Objective) -> np.ndarray:
    """v_j(k) for k = 0 … min(max_nodes, capacity); −inf where k is not allowed."""
    assert job.curve is not None
    kmax = min(job.max_nodes, capacity)
    curve = objective_curve(job.curve, objective)
    values = lookahead_s * curve.table(kmax)
    if job.min_nodes > 1:
        values[1:min(job.min_nodes, kmax + 1)] = -np.inf
    rate = job.rate(objective)
    if rate > 0:
        c = job.current_nodes
        values[c + 1:] -= rate * job.scale_up_s
        values[:min(c, kmax + 1)] -= rate * job.scale_down_s
    return values


def value_tables(problem: Problem) -> list[np.ndarray]:
    """One value table per job, in problem order."""
    return [job_values(j, problem.nodes, problem.lookahead_s, problem.objective)
            for j in problem.jobs]


def evaluate(problem: Problem, counts: dict[str, int] | list[int]) -> float:
    """The objective of a given count vector (checks bounds and capacity)."""
    if isinstance(counts, dict):
        ks = [int(counts.get(j.id, 0)) for j in problem.jobs]
    else:
        ks = [int(k) for k in counts]
    if sum(ks) > problem.nodes:
        raise ValueError(f"counts use {sum(ks)} nodes, only {problem.nodes} available")
    total = 0.0
    for table, k, job in zip(value_tables(problem), ks, problem.jobs):
        if k < 0 or k >= len(table) or table[k] == -np.inf:
            raise ValueError(f"job {job.id!r}: {k} nodes is outside its bounds")
        total += float(table[k])
    return total
