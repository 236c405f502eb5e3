"""Believed curves from measurements: interpolation, a bounded optimistic extrapolation, a
prior's shape corrected by measurements, the users' linear assumption, and merging what several
jobs measured.

Unmeasured scales are interpolated linearly between measured scales and proportionally to the
node count below the smallest. Above the largest known scale K the curve is extrapolated
optimistically but boundedly (:func:`extrapolated`): the known marginal rate s over the doubling
below K (samples/s per added node, at most the mean rate P(K)/K, which is also s when only K is
known) is halved
for the first doubling of the scale and halved again for each further one, so every doubling
adds s·K/2 samples/s, never more than linear scaling from K, for at most
:data:`EXTRAPOLATED_DOUBLINGS` doublings. A job
measured at one small scale therefore looks worth growing, gets to try a larger scale, and the
monitor measures it there; a measured plateau (s ≤ 0) stays flat. A job that comes with a
curve (its user's, or one measured for the same model) keeps that curve's shape, corrected by
the ratio measured/believed at the scales measured since (one factor while those ratios agree,
so that noise in one scale's estimate does not bend the curve). Stored curves keep measured points
only (:func:`measured_curve`), so an extrapolation is never taken for a measurement.
"""

from __future__ import annotations

from collections.abc import Mapping
from statistics import median

import numpy as np

from .. import shortcuts
from ..model import Curve

ASSUMED_RATE_PER_NODE = 1.0
"""Samples/s per node believed for a job that has not reported at all (a placeholder that its
first reports replace)."""


EXTRAPOLATED_DOUBLINGS = 8
"""How many doublings beyond the largest known scale the extrapolation reaches (flat after)."""


def measured_curve(points: Mapping[int, float]) -> Curve | None:
    """The curve through measured points only: linear between them, flat beyond the largest,
    proportional to k below the smallest (``None`` without points)."""
    pts = {k: max(0.0, p) for k, p in points.items() if k >= 1}
    if not pts:
        return None
    ks = sorted(pts)
    return Curve(tuple(ks), tuple(pts[k] for k in ks))


def extrapolated(curve: Curve) -> Curve:
    """``curve`` continued above its largest scale K: the slope over the doubling below K, at
    most P(K)/K (which it is for a single point), halved per doubling of the scale, for at most
    :data:`EXTRAPOLATED_DOUBLINGS` doublings; flat where that slope is not positive.

    >>> extrapolated(Curve((1,), (10.0,))).table(4).tolist()
    [0.0, 10.0, 15.0, 17.5, 20.0]
    >>> extrapolated(Curve((2, 4), (20.0, 20.0))) == Curve((2, 4), (20.0, 20.0))
    True
    """
    ks, ps = curve.nodes, curve.throughput
    if not ks:
        return curve
    top, p_top = ks[-1], ps[-1]
    # The marginal rate over the doubling below K (P(K/2): interpolated, or proportional below
    # the smallest scale, so a single point gives P(K)/K), not over the last segment alone:
    # two estimates a few nodes apart (40 and 41, the second learned above the first) make
    # a slope of their noise, amplified by K over their distance; a flat or negative one kept
    # a model's jobs from ever growing past 41 to where their gain would have been measured
    # (AlexNet on a Theta window of the profiler sweep: 1.25 points of UB_oracle behind).
    slope = min(p_top / top, (p_top - curve.at(top / 2)) / (top / 2))
    if not slope > 0:
        return curve
    nodes, values = list(ks), list(ps)
    k, p = top, p_top
    for _ in range(EXTRAPOLATED_DOUBLINGS):
        slope /= 2.0
        p += slope * k
        k *= 2
        nodes.append(k)
        values.append(p)
    return Curve(tuple(nodes), tuple(values))


def conservative_curve(points: Mapping[int, float]) -> Curve | None:
    """The believed curve of measured points: :func:`measured_curve` continued upwards by
    :func:`extrapolated` (``None`` without points)."""
    curve = measured_curve(points)
    return None if curve is None else extrapolated(curve)


def linear_curve(k0: int, p0: float, max_nodes: int) -> Curve:
    """The user's assumption when there is no curve and no profiling: P(k) = k · P(k0) / k0."""
    top = max(k0, max_nodes)
    if top == k0:
        return Curve((k0,), (p0,))
    return Curve((k0, top), (p0, p0 * top / k0))


AGREE = 0.1
"""Measured/prior ratios within this share of their median are taken for one factor plus
noise (:func:`corrected_curve`)."""


def corrected_curve(prior: Curve, measured: Mapping[int, float],
                    extrapolate: bool = True) -> Curve:
    """``prior``'s shape corrected by the measured/prior ratios.

    Where the ratios at the measured scales inside the prior's range agree (each within
    :data:`AGREE` of their median), the prior is scaled by that median, one factor for the
    whole curve: a throughput estimate carries noise (3 % per report period in the
    simulator), and setting each measured scale to its own estimate put that noise into the
    curve's slopes, where it is amplified by the short distance between scales (1.03 at 32
    nodes and 0.98 at 16 make the marginal rate between them 8 % too high). Same-model jobs
    then looked better or worse than each other by chance and the allocator moved nodes
    between them: on a 2-day Summit replay under the in-place cost model this alone cost
    0.35 point of UB_oracle and 1,500 more rescales than FreeTrain given the true curves.
    Ratios that disagree (the job scales unlike the prior) are interpolated linearly between
    the measured scales and held flat outside them, measured scales taking their measured
    value. Measured scales outside the prior's range are added at their measured value. With
    ``extrapolate`` the result continues above the largest known scale (:func:`extrapolated`);
    without measurements the prior is returned as it is.
    """
    ks = sorted([k for k in measured if k >= 1])
    if not ks:
        return prior
    inside = [k for k in ks if prior.nodes and prior.nodes[0] <= k <= prior.nodes[-1]]
    at = _prior_values(prior)
    ratios = []
    for k in inside:
        p = at.get(k)
        if p is None:
            p = at[k] = prior.at(k)
        elif shortcuts.CHECKED:
            shortcuts.check("curves.prior_value", p, prior.at(k))
        if p > 0:
            ratios.append(measured[k] / p)
    # statistics.median's own arithmetic, without its call
    ordered = sorted(ratios)
    n = len(ordered)
    factor = float(ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2) \
        if n else 0.0
    if shortcuts.CHECKED and n:
        shortcuts.check("curves.median", factor, float(median(ratios)))
    # |r / factor − 1| is monotone in r (rounding included), so every ratio is within AGREE
    # exactly when the smallest and the largest are.
    agree = factor > 0 and abs(min(ratios) / factor - 1.0) <= AGREE \
        and abs(max(ratios) / factor - 1.0) <= AGREE
    if shortcuts.CHECKED and factor > 0:
        shortcuts.check("curves.agree", agree,
                        all(abs(r / factor - 1.0) <= AGREE for r in ratios))
    if agree or not ratios:
        # Without a measured scale inside the prior's range there is nothing to compare the
        # prior with: it stays as it is (a factor against its flat continuation would scale
        # the whole curve by how much the job gains above the prior's top scale).
        factor = factor if agree else 1.0
        if len(inside) == len(ks) and _increasing(prior):
            # Every measured scale inside the prior's range, whose scales are sorted: the
            # points are the prior's own, in its order (a report's usual case).
            curve = Curve(prior.nodes, tuple([max(0.0, float(p * factor))
                                              for p in prior.throughput]))
            if shortcuts.CHECKED:
                shortcuts.check("curves.in_range", curve,
                                _scaled(prior, factor, measured, ks, inside))
        else:
            curve = _scaled(prior, factor, measured, ks, inside)
    else:
        curve = _per_scale(prior, measured, ks, inside)
    return extrapolated(curve) if extrapolate else curve


_PRIOR_VALUES: dict[int, tuple[Curve, dict[int, float]]] = {}
"""id(prior) -> (prior, scale -> prior.at(scale)): a job's prior is read at its measured
scales at every report (corrected_curve), a few priors at a few dozen scales."""


def _prior_values(prior: Curve) -> dict[int, float]:
    """The memo of ``prior.at`` (the entry holds the curve, so its id is not reused)."""
    hit = _PRIOR_VALUES.get(id(prior))
    if hit is not None and hit[0] is prior:
        return hit[1]
    if len(_PRIOR_VALUES) >= 256:
        _PRIOR_VALUES.clear()  # priors the store replaced: bounded for a daemon
    values: dict[int, float] = {}
    _PRIOR_VALUES[id(prior)] = (prior, values)
    return values


def _scaled(prior: Curve, factor: float, measured: Mapping[int, float], ks: list[int],
            inside: list[int]) -> Curve:
    """``prior`` times ``factor``, with the measured scales ``ks`` outside its range
    (those not ``inside``) at their measured values."""
    points = {k: p * factor for k, p in zip(prior.nodes, prior.throughput)}
    points.update((k, measured[k]) for k in ks if k not in inside)
    nodes = sorted(points)
    return Curve(tuple(nodes), tuple(max(0.0, float(points[k])) for k in nodes))


_INCREASING: dict[int, tuple[Curve, bool]] = {}
"""id(prior) -> (prior, whether its scales are strictly increasing), for
:func:`corrected_curve`'s usual case."""


def _increasing(prior: Curve) -> bool:
    """Whether ``prior.nodes`` is strictly increasing (so ``sorted`` of a dict keyed by them
    is the tuple itself), remembered per prior as :func:`_prior_values` is."""
    hit = _INCREASING.get(id(prior))
    if hit is not None and hit[0] is prior:
        return hit[1]
    if len(_INCREASING) >= 256:
        _INCREASING.clear()
    nodes = prior.nodes
    increasing = all(a < b for a, b in zip(nodes, nodes[1:]))
    _INCREASING[id(prior)] = (prior, increasing)
    return increasing


def _per_scale(prior: Curve, measured: Mapping[int, float], ks: list[int],
               inside: list[int]) -> Curve:
    """``prior`` times the measured/prior ratio interpolated between the measured scales
    ``inside`` its range (flat outside them), measured scales ``ks`` at their measured value.
    A ratio is taken only inside the prior's range: outside it the prior is a flat or
    proportional continuation, and a ratio against it (a job measured at 3 nodes against a
    prior of 1 and 2 nodes: 1.47) would scale the prior's measured points by it."""
    rk = np.array(inside, dtype=float)
    xs = np.array((0.0,) + prior.nodes, dtype=float)
    ys = np.array((0.0,) + prior.throughput, dtype=float)
    at_rk = np.interp(rk, xs, ys)
    keep = at_rk > 0
    if not keep.any():
        return prior
    ratios = np.array([measured[k] for k in inside])[keep] / at_rk[keep]
    nodes = sorted(set(prior.nodes).union(ks))
    at = np.array(nodes, dtype=float)
    values = (np.interp(at, xs, ys) * np.interp(at, rk[keep], ratios)).tolist()
    return Curve(tuple(nodes), tuple(max(0.0, float(measured[k] if k in measured else v))
                                     for k, v in zip(nodes, values)))


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
