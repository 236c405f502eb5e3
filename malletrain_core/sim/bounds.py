"""Upper bounds on what any policy can harvest from a trace with a fixed job set.

F(n) = max Σ_j P_j(k_j) over k_j ∈ {0} ∪ [min_j, max_j], Σ_j k_j ≤ n: the cost-free optimum
on the TRUE curves. UB_oracle = Σ_e Δt_e · F(N_e) over the trace's intervals (perfect curves,
free and instant rescaling); no policy, online or clairvoyant, can exceed it. UB_lin replaces
each curve by perfectly linear scaling at the job's best per-node rate, so it bounds F too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ..model import Curve
from .traces import Trace


@dataclass(frozen=True)
class BoundJob:
    """What the bounds need of a job: its true curve and bounds."""

    curve: Curve
    min_nodes: int
    max_nodes: int


def best_values(jobs: Sequence[BoundJob], capacity: int) -> np.ndarray:
    """F(0 … capacity): the best total throughput with at most n nodes, by max-plus DP."""
    best = np.zeros(capacity + 1)
    for job in jobs:
        kmax = min(job.max_nodes, capacity)
        table = job.curve.table(kmax)
        if job.min_nodes > 1:
            table[1:min(job.min_nodes, kmax + 1)] = -np.inf
        padded = np.concatenate((np.full(kmax, -np.inf), best))
        windows = sliding_window_view(padded, kmax + 1)
        best = np.max(windows + table[::-1], axis=1)
    return np.maximum.accumulate(best)


def linear_values(jobs: Sequence[BoundJob], capacity: int) -> np.ndarray:
    """F_lin(0 … capacity): every job at its best per-node rate, filled best rate first."""
    rates = []
    for job in jobs:
        ks = np.arange(1, job.max_nodes + 1)
        rates.append((float(np.max(job.curve.table(job.max_nodes)[1:] / ks)), job.max_nodes))
    rates.sort(reverse=True)
    out = np.zeros(capacity + 1)
    n = 0
    total = 0.0
    for rate, size in rates:
        for _ in range(size):
            if n >= capacity:
                return out
            n += 1
            total += rate
            out[n] = total
    out[n + 1:] = total
    return out


@dataclass(frozen=True)
class Bounds:
    """UB_oracle and UB_lin (samples), idle node-seconds, and F(N_e) over time for plots."""

    ub_oracle: float
    ub_lin: float
    idle_node_seconds: float
    times: np.ndarray
    idle: np.ndarray
    oracle_rate: np.ndarray


def compute_bounds(trace: Trace, jobs: Sequence[BoundJob]) -> Bounds:
    """The bounds of ``jobs`` (all present for the whole trace) on ``trace``."""
    starts, counts = trace.idle_counts()
    durations = np.diff(np.concatenate((starts, [trace.end])))
    cap = int(counts.max()) if len(counts) else 0
    cap = min(cap, sum(j.max_nodes for j in jobs))
    f = best_values(jobs, cap)
    f_lin = linear_values(jobs, cap)
    idx = np.minimum(counts, cap)
    rate = f[idx]
    return Bounds(ub_oracle=float(np.dot(durations, rate)),
                  ub_lin=float(np.dot(durations, f_lin[idx])),
                  idle_node_seconds=float(np.dot(durations, counts)),
                  times=starts, idle=counts, oracle_rate=rate)
