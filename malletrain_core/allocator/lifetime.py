"""Lifetime-aware node counts: each node is worth the idle time it is expected to offer.

FreeTrain values k nodes for job j as T_fwd · O_j(k): every node stays for one fixed look-ahead.
Here every node n carries a life ℓ_n = E[min(R_n, H)] (its expected remaining idle time within
a horizon H) and a risk q_n = P(R_n < H) (see :mod:`malletrain_core.engine.survival`). A job holding
nodes with lives ℓ_(1) ≥ … ≥ ℓ_(k) runs at O(k) until the shortest-lived one goes, then at
O(k − 1), and so on; each reclaim costs it a restart. Its value is

    v_j(k) = Σ_{i=1..k} ℓ_(i) · (O_j(i) − O_j(i − 1))  −  T_dw,j · O_j(k) · Σ_g q_g
             − r_j · (T_up,j · [k > C_j] + T_dw,j · [k < C_j])

(r_j = O_j(C_j) as in :mod:`.objective`): throughput integrated over the nodes' lives, the
expected restarts when they are reclaimed (each at most the rate O_j(k)), and the rescale now.
Nodes with equal lives (a hole end shared by a reservation, or the same idle age) are expected
to go at once: g runs over the groups of equal lives among the k nodes, each costing one
restart with its risk q_g. So a grow onto nodes about to
be reclaimed does not pay for itself, and a job whose rescale costs most only grows onto
long-lived nodes. With every ℓ = T_fwd and every q = 0 this is exactly FreeTrain's table.

Which nodes job j would hold at k: for k ≤ C_j its k longest-lived held nodes (a shrinking
job releases its shortest-lived ones, as :func:`.placement.place` does); for k > C_j all of
them plus the k − C_j longest-lived free nodes, then — when the free nodes run out — the
shortest-lived held nodes (what shrinking jobs release first), each counted with at most the
life and at least the risk of the node taken before it.

What is exact: given those tables, the counts maximise Σ_j v_j(k_j) subject to Σ_j k_j ≤ N
(the exact count DP of :mod:`.dp`; :func:`solve` with ``rounds=0``). What is not: each table
assumes its job alone gets the longest-lived free nodes. When several jobs grow at once they
all count the same long-lived nodes, and the DP then moves nodes between jobs for gains that
no node can deliver (a job sheds nodes that are valued at their short lives in its hands and
at long ones in every grower's table). :func:`solve` therefore checks the counts by handing
the nodes out as placement does and valuing every job on what it really gets; growers that
fall short have their tables rebuilt from their place in that hand-out and the DP runs again,
a few rounds at most. The counts returned have the best handed-out value among those tried,
and never less than staying at the current counts. The expected min over the nodes of
independent random lives is replaced by the order of their expected lives.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Mapping, Sequence

import numpy as np

from ..errors import ValidationError
from ..model import Curve, Job, Objective, Problem, Solution, objective_curve
from . import dp

Life = tuple[float, float]
"""A node's (life, risk): expected idle seconds within the horizon, chance of a reclaim."""


def job_values(job: Job, capacity: int, held: np.ndarray, pool: np.ndarray,
               objective: Objective) -> np.ndarray:
    """v_j(k) for k = 0 … min(max_nodes, capacity); −inf where k is not allowed.

    ``held``: (2, C_j) lives and risks of the job's nodes, longest-lived first; ``pool``: (2, M)
    lives and risks of the nodes it would take when growing, longest-lived first.
    """
    assert job.curve is not None
    kmax = min(job.max_nodes, capacity)
    c = held.shape[1]
    grow = max(0, kmax - c)
    if pool.shape[1] < grow:
        raise ValidationError(f"job {job.id!r}", "pool", f"{pool.shape[1]} nodes to grow onto, "
                              f"{grow} needed")
    o = _curve_table(job.curve, max(kmax, c), objective)
    gain = np.diff(o)
    h, qh = held[0], held[1]
    p, qp = pool[0, :grow], pool[1, :grow]
    # At k ≤ C the job keeps its k longest-lived nodes, in rank order.
    values = np.empty(max(kmax, c) + 1)
    values[0] = 0.0
    values[1:c + 1] = np.cumsum(h * gain[:c])
    # At k = C + g its nodes are h merged with p[:g]. A pool node's rank does not depend on g
    # (the pool is taken longest-lived first); a held node moves down one rank for every pool
    # node taken that outlives it.
    if grow:
        pool_rank = np.arange(grow) + np.searchsorted(-h, -p, side="right")
        pool_part = np.concatenate(([0.0], np.cumsum(p * gain[pool_rank])))
        outlived = np.searchsorted(-p, -h, side="left")
        g = np.arange(grow + 1)[:, None]
        held_rank = np.arange(c)[None, :] + np.minimum(g, outlived[None, :])
        values[c:c + grow + 1] = pool_part + (gain[held_rank] * h[None, :]).sum(axis=1)
    # Expected restarts: one per group of equal lives, weighted by the group's risk.
    fresh_h = np.ones(c, dtype=bool)
    fresh_h[1:] = h[1:] != h[:-1]
    fresh_p = np.ones(grow, dtype=bool)
    fresh_p[1:] = p[1:] != p[:-1]
    if c and grow:
        at = np.minimum(np.searchsorted(-h, -p, side="left"), c - 1)
        fresh_p &= h[at] != p
    survive_h = np.cumprod(1.0 - qh * fresh_h)
    survive_p = np.cumprod(1.0 - qp * fresh_p) * (survive_h[-1] if c else 1.0)
    restarts = 1.0 - np.concatenate(([1.0], survive_h, survive_p))
    values -= job.scale_down_s * o[:len(values)] * restarts[:len(values)]
    values = values[:kmax + 1]
    if job.min_nodes > 1:
        values[1:min(job.min_nodes, kmax + 1)] = -np.inf
    rate = job.rate(objective)
    if rate > 0:
        values[c + 1:] -= rate * job.scale_up_s
        values[:min(c, kmax + 1)] -= rate * job.scale_down_s
    return values


def _sorted(lives: Sequence[Life], descending: bool) -> np.ndarray:
    arr = np.asarray(lives, dtype=float).reshape(-1, 2).T
    order = np.argsort(-arr[0] if descending else arr[0], kind="stable")
    return arr[:, order]


def value_tables(problem: Problem, held: Mapping[str, Sequence[Life]],
                 free: Sequence[Life]) -> list[np.ndarray]:
    """One lifetime value table per job of ``problem`` (see the module docstring).

    ``held``: job id → (life, risk) of each node it holds (as many as its ``current_nodes``);
    ``free``: (life, risk) of each free node.
    """
    mine = {}
    for job in problem.jobs:
        nodes = held.get(job.id, ())
        if len(nodes) != job.current_nodes:
            raise ValidationError(f"job {job.id!r}", "held", f"{len(nodes)} node lives for "
                                  f"{job.current_nodes} held nodes; give one per node")
        mine[job.id] = _sorted(nodes, descending=True)
    pool = _sorted(free, descending=True)
    need = max([min(j.max_nodes, problem.nodes) - j.current_nodes for j in problem.jobs] + [0])
    if pool.shape[1] < need:
        extra = _sorted([x for j in problem.jobs for x in held.get(j.id, ())],
                        descending=False)[:, :need - pool.shape[1]]
        # Taken after the free nodes, a node never counts longer or safer than the one taken
        # before it (the merge in job_values needs the lives non-increasing).
        if pool.shape[1]:
            extra = np.concatenate((pool[:, -1:], extra), axis=1)
        extra = np.stack((np.minimum.accumulate(extra[0]), np.maximum.accumulate(extra[1])))
        pool = np.concatenate((pool, extra[:, 1:] if pool.shape[1] else extra), axis=1)
    return [job_values(job, problem.nodes, mine[job.id], pool, problem.objective)
            for job in problem.jobs]


@functools.lru_cache(maxsize=4096)
def _curve_table(curve: Curve, n: int, objective: Objective) -> np.ndarray:
    table = objective_curve(curve, objective).table(n)
    table.flags.writeable = False
    return table


def solve(problem: Problem, held: Mapping[str, Sequence[Life]],
          free: Sequence[Life], rounds: int = 6) -> Solution:
    """Best node counts under the lifetime objective, with every grow valued on the nodes
    placement would really give it. ``problem.nodes`` must equal the free nodes plus the held
    ones.

    Each table first assumes its job alone takes the longest-lived free nodes, so when several
    jobs grow at once they all count the same long-lived nodes and the counts move nodes
    between jobs for gains no node can deliver. So the counts are checked: nodes are handed
    out as placement does (free and released nodes, longest-lived first, to the largest grow
    first) and every job is valued on what it holds and gets (:func:`handed_out`). A grower
    whose nodes fall short of its table gets its table rebuilt from its place in that hand-out
    and the counts are solved again, at most ``rounds`` times; the counts kept are those of
    the best handed-out value, never below staying at the current counts.
    """
    if problem.constraints.active:
        raise ValidationError("allocate", "solver", "the lifetime solver cannot honour side "
                              "constraints (user_max_nodes, min_share, max_running_jobs)")
    if problem.nodes != len(free) + sum(j.current_nodes for j in problem.jobs):
        raise ValidationError("allocate", "nodes", f"{problem.nodes} nodes but {len(free)} free "
                              "lives plus the held ones; give one life per node")
    start = time.perf_counter()
    tables = value_tables(problem, held, free)
    counts, value = dp.solve_counts(tables, problem.nodes)
    if rounds:
        counts, value = _checked(problem, held, free, tables, counts, rounds)
    return Solution({j.id: k for j, k in zip(problem.jobs, counts)}, value, "lifetime-dp",
                    (time.perf_counter() - start) * 1e3)


def _checked(problem: Problem, held: Mapping[str, Sequence[Life]], free: Sequence[Life],
             tables: list[np.ndarray], counts: list[int], rounds: int
             ) -> tuple[list[int], float]:
    """The counts of the best handed-out value among the tables' solutions and staying put
    (see :func:`solve`), with that value."""
    mine = [_sorted(held.get(j.id, ()), descending=True) for j in problem.jobs]
    pool = _sorted(free, descending=True)
    # Staying put, except that a job left below its minimum (a reclaim took nodes) stops.
    best = [j.current_nodes if j.min_nodes <= j.current_nodes else 0 for j in problem.jobs]
    best_value = sum(float(t[c]) if c < len(t) else -np.inf for t, c in zip(tables, best))
    for _ in range(rounds):
        values, starts, nodes = _hand_out(problem, tables, mine, pool, counts)
        if not math.isfinite(best_value) or \
                sum(values) > best_value + 1e-9 * max(1.0, abs(best_value)):
            best, best_value = list(counts), sum(values)
        short = [i for i, (job, k) in enumerate(zip(problem.jobs, counts))
                 if k > job.current_nodes and values[i] < tables[i][k] - 1e-9 * abs(tables[i][k])]
        if not short:
            break
        tables = list(tables)
        for i in short:  # value the grow from where this job stands in the hand-out
            tables[i] = _table_from(problem, i, mine[i], nodes[:, starts[i]:], tables[i])
        counts, _ = dp.solve_counts(tables, problem.nodes)
    return best, best_value


def _hand_out(problem: Problem, tables: list[np.ndarray], mine: list[np.ndarray],
              pool: np.ndarray, counts: Sequence[int]
              ) -> tuple[list[float], dict[int, int], np.ndarray]:
    """Each job's value on the nodes placement would give it for ``counts``, where each
    grower's nodes start in the handed-out order, and that order (lives and risks)."""
    released = [m[:, k:] for m, k in zip(mine, counts) if k < m.shape[1]]
    nodes = np.concatenate([pool, *released], axis=1) if released else pool
    nodes = nodes[:, np.argsort(-nodes[0], kind="stable")]
    values = [float(t[k]) for t, k in zip(tables, counts)]
    growers = sorted((i for i, (job, k) in enumerate(zip(problem.jobs, counts))
                      if k > job.current_nodes),
                     key=lambda i: (-(counts[i] - problem.jobs[i].current_nodes),
                                    problem.jobs[i].id))
    starts: dict[int, int] = {}
    at = 0
    for i in growers:
        job, k = problem.jobs[i], counts[i]
        given = nodes[:, at:at + k - job.current_nodes]
        starts[i] = at
        at += given.shape[1]
        values[i] = float(job_values(dataclasses.replace(job, max_nodes=k), problem.nodes,
                                     mine[i], given, problem.objective)[k])
    return values, starts, nodes


def _table_from(problem: Problem, i: int, held: np.ndarray, rest: np.ndarray,
                old: np.ndarray) -> np.ndarray:
    """Job i's table with its grow taken from ``rest`` (the hand-out from its place on);
    counts beyond what ``rest`` holds are not offered."""
    job = problem.jobs[i]
    c = job.current_nodes
    top = min(len(old) - 1, c + rest.shape[1])
    table = old.copy()
    table[c + 1:] = -np.inf
    if top > c and top >= job.min_nodes:
        grown = job_values(dataclasses.replace(job, max_nodes=top), problem.nodes, held,
                           rest[:, :top - c], problem.objective)
        table[c + 1:top + 1] = grown[c + 1:top + 1]
    return table


def handed_out(problem: Problem, held: Mapping[str, Sequence[Life]], free: Sequence[Life],
               counts: Mapping[str, int]) -> float:
    """The lifetime objective of given counts with the nodes handed out as placement does
    (what :func:`solve` maximises over the candidates it tries)."""
    ks = [int(counts.get(j.id, 0)) for j in problem.jobs]
    tables = value_tables(problem, held, free)
    if sum(ks) > problem.nodes or any(k < 0 or k >= len(t) for t, k in zip(tables, ks)):
        raise ValueError(f"counts {ks} do not fit {problem.nodes} nodes and the jobs' bounds")
    mine = [_sorted(held.get(j.id, ()), descending=True) for j in problem.jobs]
    values, _, _ = _hand_out(problem, tables, mine, _sorted(free, descending=True), ks)
    return sum(values)


def evaluate(problem: Problem, held: Mapping[str, Sequence[Life]], free: Sequence[Life],
             counts: Mapping[str, int]) -> float:
    """The tables' objective of given counts (bounds and capacity checked): each job valued
    as if it alone took the longest-lived free nodes."""
    ks = [int(counts.get(j.id, 0)) for j in problem.jobs]
    if sum(ks) > problem.nodes:
        raise ValueError(f"counts use {sum(ks)} nodes, only {problem.nodes} available")
    total = 0.0
    for table, k, job in zip(value_tables(problem, held, free), ks, problem.jobs):
        if k < 0 or k >= len(table) or table[k] == -np.inf:
            raise ValueError(f"job {job.id!r}: {k} nodes is outside its bounds")
        total += float(table[k])
    return total
