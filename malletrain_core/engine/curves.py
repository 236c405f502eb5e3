"""Believed curves from measurements: conservative interpolation, a prior's shape corrected by
measurements, the users' linear assumption, and merging what several jobs measured.

Unmeasured scales are interpolated conservatively: linearly between measured scales, held
flat beyond the largest one (never extrapolated upwards) and proportional to the node count
below the smallest. A job that comes with a curve (its user's, or one measured for the same
model) keeps that curve's shape, corrected by the ratio measured/believed at the scales
measured since.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ..model import Curve

ASSUMED_RATE_PER_NODE = 1.0
"""Samples/s per node believed for a job that has not reported at all (a placeholder that its
first reports replace)."""


def conservative_curve(points: Mapping[int, float]) -> Curve | None:
    """The curve through measured points: linear between them, flat beyond the largest,
    proportional to k below the smallest (``None`` without points)."""
    pts = {k: max(0.0, p) for k, p in points.items() if k >= 1}
    if not pts:
        return None
    ks = sorted(pts)
    return Curve(tuple(ks), tuple(pts[k] for k in ks))


def linear_curve(k0: int, p0: float, max_nodes: int) -> Curve:
    """The user's assumption when there is no curve and no profiling: P(k) = k · P(k0) / k0."""
    top = max(k0, max_nodes)
    if top == k0:
        return Curve((k0,), (p0,))
    return Curve((k0, top), (p0, p0 * top / k0))


def corrected_curve(prior: Curve, measured: Mapping[int, float]) -> Curve:
    """``prior``'s shape scaled by the measured/prior ratio, interpolated linearly between the
    measured scales and held flat outside them; measured scales take their measured value."""
    if not measured:
        return prior
    rk = np.array(sorted(k for k in measured if k >= 1), dtype=float)
    xs = np.concatenate(([0.0], np.asarray(prior.nodes, dtype=float)))
    ys = np.concatenate(([0.0], np.asarray(prior.throughput, dtype=float)))
    at_rk = np.interp(rk, xs, ys)
    keep = at_rk > 0
    if not keep.any():
        return prior
    ratios = np.array([measured[int(k)] for k in rk])[keep] / at_rk[keep]
    nodes = np.union1d(np.asarray(prior.nodes, dtype=float), rk)
    values = np.interp(nodes, xs, ys) * np.interp(nodes, rk[keep], ratios)
    for idx, k in enumerate(nodes):
        if int(k) in measured:
            values[idx] = measured[int(k)]
    return Curve(tuple(int(k) for k in nodes), tuple(max(0.0, float(v)) for v in values))


def merge_curves(old: Curve | None, new: Curve) -> Curve:
    """The points of both, ``new`` winning where both know a scale (a model's stored curve
    grows as jobs of that model measure more scales)."""
    if old is None:
        return new
    points = dict(zip(old.nodes, old.throughput))
    points.update(zip(new.nodes, new.throughput))
    ks = sorted(points)
    return Curve(tuple(ks), tuple(points[k] for k in ks))


def top_scale(curve: Curve | None) -> int:
    """The largest scale a curve knows (0 for none)."""
    return curve.nodes[-1] if curve is not None and curve.nodes else 0
