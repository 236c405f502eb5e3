"""The Job Profiling Advisor's pure choices: which scales a profile measures, in which
order, and which running job lends it nodes. The advisor that acts on them, with its runs in
progress, is :mod:`.profiler`."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


def plan_scales(top: int, min_nodes: int, upward: bool = False) -> list[int]:
    """The scales to measure: ``top``, then the powers of two below it down to ``min_nodes``
    (ascending if ``upward``).

    Not halvings of ``top``: the believed curve is linear between measured scales, and
    data-parallel training's throughput bends at powers of two (the collectives' recursive
    halving and doubling, the per-node split of the batch; the curves the simulator replays
    were measured there and are linear between them). Halving an odd top put every point
    between the bends (53: 26, 13, 6, 3, 1, with a tripling from 1 to 3), so the curve
    was wrong between them: on two Theta windows of the profiler sweep, three seeds each, the
    store's AlexNet curve ended 2.6–5.1 % low at 32 nodes in the five replays whose profile
    had not started at 64.

    >>> plan_scales(64, 1)
    [64, 32, 16, 8, 4, 2, 1]
    >>> plan_scales(53, 1)
    [53, 32, 16, 8, 4, 2, 1]
    >>> plan_scales(48, 3)
    [48, 32, 16, 8, 4, 3]
    """
    scales = [top]
    k = 1 << (top.bit_length() - 1) if top >= 1 else 0
    if k == top:
        k //= 2
    while k >= min_nodes and k >= 1:
        scales.append(k)
        k //= 2
    if scales[-1] > min_nodes >= 1:
        scales.append(min_nodes)
    return scales[::-1] if upward else scales


def choose_upward(measured_up_s: float | None, measured_down_s: float | None,
                  default_up_s: float, default_down_s: float) -> bool:
    """Profile upwards only where scale-ups are cheaper than scale-downs (as measured, else by
    the configured defaults)."""
    up = measured_up_s if measured_up_s is not None else default_up_s
    down = measured_down_s if measured_down_s is not None else default_down_s
    return up < down


@dataclass
class Lender:
    """A running job that could lend nodes to a profiling job."""

    job_id: str
    spare: int
    last_interrupted: float | None
    order: int


def choose_lender(candidates: Iterable[Lender]) -> Lender | None:
    """The least recently interrupted job with nodes to spare (never-interrupted first, then
    the one with most to spare, then the earliest submitted)."""
    best: Lender | None = None
    best_key: tuple[float, int, int] | None = None
    for c in candidates:
        if c.spare <= 0:
            continue
        key = (float("-inf") if c.last_interrupted is None else c.last_interrupted,
               -c.spare, c.order)
        if best_key is None or key < best_key:
            best, best_key = c, key
    return best
