"""Robust statistics for the detectors (pure, no numpy: a few hundred points each).

Why median and MAD rather than mean and standard deviation: a single spike moves
the mean and inflates the standard deviation of its own window, which hides the
spike and the ones after it; the median and the median absolute deviation ignore up
to half the window being wrong (breakdown point 50%). ``MAD_TO_SIGMA`` scales a MAD
to the standard deviation it estimates for normal noise, so thresholds read as
"k sigmas" for ordinary noise.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

MAD_TO_SIGMA = 1.4826


def median(values: Sequence[float]) -> float:
    """The median; ValueError on an empty sequence."""
    if not values:
        raise ValueError("median of no values")
    return float(statistics.median(values))


def mad(values: Sequence[float], centre: float | None = None) -> float:
    """Median absolute deviation from ``centre`` (default: the median)."""
    mid = median(values) if centre is None else centre
    return median([abs(v - mid) for v in values])


def robust_scale(values: Sequence[float], centre: float, floor: float) -> float:
    """``MAD_TO_SIGMA * MAD``, but never below ``floor``: a flat window (MAD 0) must not
    make every small wiggle an outlier."""
    return max(MAD_TO_SIGMA * mad(values, centre), floor)


def weighted_median(pairs: Sequence[tuple[float, float]]) -> float:
    """Median of ``(value, weight)`` pairs by weight (weights > 0): the value below and above
    which half the total weight lies. ValueError when there is no weight."""
    items = sorted((v, w) for v, w in pairs if w > 0)
    total = sum(w for _, w in items)
    if total <= 0:
        raise ValueError("weighted median of no weight")
    half = total / 2
    run = 0.0
    for i, (value, weight) in enumerate(items):
        run += weight
        if run > half:
            return value
        if run == half:
            # Exactly half: between this value and the next, as the unweighted median does.
            return (value + items[i + 1][0]) / 2 if i + 1 < len(items) else value
    return items[-1][0]
