"""Step times as statistics: the interval that bounds a trial's median step time, and whether two speeds differ.

The interval is the distribution-free confidence interval of the median from order statistics (the sign test's
interval): no assumption that step times are normal, and one slow outlier (a garbage collection, another tenant's
burst) moves it by one rank rather than dragging a mean. scipy would give the same binomial quantile, but is not a
dependency for one sum; ``math.comb`` is enough.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

__all__ = [
    "CONFIDENCE",
    "FEWEST_RUNS_TO_TRIM",
    "fewest_values",
    "median_interval",
    "relative_half_width",
    "runs_speed_interval",
    "speed_interval",
]

CONFIDENCE = 0.95
FEWEST_RUNS_TO_TRIM = 4
"""From this many runs of one plan on, :func:`runs_speed_interval` leaves out the slowest and fastest run."""


def fewest_values(confidence: float = CONFIDENCE) -> int:
    """The fewest values whose whole range holds the median with at least ``confidence``: before that many, no
    interval of order statistics is a ``confidence`` interval, however close the values happen to be.

    The range of n values misses the median only when all n fall on one side of it: probability 2 / 2**n.

    Example:
        >>> fewest_values(), fewest_values(0.99)
        (6, 8)
    """
    count = 1
    while 2 / 2**count > 1 - confidence:
        count += 1
    return count


def median_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> tuple[float, float]:
    """The interval that holds the median of the values' distribution with at least ``confidence``.

    It runs from the k-th smallest to the k-th largest value, k as large as the binomial tails allow; with
    fewer than six values no k reaches 95%, and the interval is the whole range (one value: that value twice).

    Example:
        >>> median_interval([1.0, 1.1, 0.9])
        (0.9, 1.1)
        >>> low, high = median_interval([1.0 + i / 100 for i in range(30)] + [9.0])
        >>> round(low, 2), round(high, 2)
        (1.09, 1.21)
    """
    if not values:
        raise ValueError("median_interval needs at least one value")
    ordered = sorted(values)
    n = len(ordered)
    rank = _order_statistic_rank(n, confidence)
    return ordered[rank - 1], ordered[n - rank]


def relative_half_width(values: Sequence[float], confidence: float = CONFIDENCE) -> float:
    """Half the width of :func:`median_interval`, as a fraction of the median (inf for fewer than two values).

    Example:
        >>> relative_half_width([0.9, 1.0, 1.1])
        0.1
    """
    if len(values) < 2:
        return math.inf
    low, high = median_interval(values, confidence)
    middle = statistics.median(values)
    return round((high - low) / 2 / middle, 12) if middle > 0 else math.inf


def speed_interval(step_times: Sequence[float], rows_per_step: int | None) -> tuple[float, float] | None:
    """The interval of rows per second that :func:`median_interval` of the step times gives; None without one.

    Example:
        >>> speed_interval([0.4, 0.5, 0.8], rows_per_step=8)
        (10.0, 20.0)
        >>> speed_interval([0.5], rows_per_step=8) is None
        True
    """
    if len(step_times) < 2 or not rows_per_step or min(step_times) <= 0:
        return None
    low, high = median_interval(step_times)
    return rows_per_step / high, rows_per_step / low


def runs_speed_interval(
    step_times: Sequence[float], step_runs: Sequence[int], rows_per_step: int | None
) -> tuple[float, float] | None:
    """The speed interval of step times that come from several runs of one plan (``step_runs``: how many steps
    each run gave, in order; empty: one run): the span of the runs' medians, widened on each side by the typical
    run's noise (the median of the runs' :func:`relative_half_width`). From four runs on, the slowest and the
    fastest run's medians are left out of the span.

    Each run's median is robust within that run; a shared machine also drifts *between* runs, and the span of the
    medians is where the plan's speed was seen across the conditions its runs met. Two plans timed in turn (A B A
    B) meet the same conditions, so a plan compared with itself overlaps itself, while a real difference larger
    than the drift stays apart. One run that a burst of another tenant slowed as a whole (half speed for a few
    seconds, when it shared a core) is one extreme of the medians, and from four runs on it is left out; the
    widening is the typical run's, not the noisiest's, for the same reason: a burst must not make a 30% difference
    look like a tie.

    Example:
        >>> runs_speed_interval([0.5, 0.5, 0.5, 1.0, 1.0, 1.0], [3, 3], rows_per_step=8)
        (8.0, 16.0)
        >>> runs_speed_interval([0.4, 0.5, 0.8], [], rows_per_step=8)
        (10.0, 20.0)
        >>> runs_speed_interval([1.0, 1.0, 2.0, 2.0, 1.0, 1.0, 1.0, 1.0], [2, 2, 2, 2], rows_per_step=8)
        (8.0, 8.0)
    """
    if not step_runs:
        return speed_interval(step_times, rows_per_step)
    if not rows_per_step:
        return None
    medians: list[float] = []
    half_widths: list[float] = []
    start = 0
    for length in step_runs:
        part = step_times[start : start + length]
        start += length
        if not part or min(part) <= 0:
            continue
        medians.append(statistics.median(part))
        if len(part) >= 2:
            half_widths.append(relative_half_width(part))
    if not medians:
        return None
    if len(medians) >= FEWEST_RUNS_TO_TRIM:
        medians = sorted(medians)[1:-1]
    widening = statistics.median(half_widths) if half_widths else 0.0
    slowest, fastest = max(medians) * (1 + widening), min(medians) * (1 - widening)
    if fastest <= 0:
        return 0.0, math.inf
    return rows_per_step / slowest, rows_per_step / fastest


def _order_statistic_rank(n: int, confidence: float) -> int:
    """The largest k >= 1 with P(Binomial(n, 1/2) < k) <= (1 - confidence) / 2 (k = 1 is the whole range)."""
    tail = (1 - confidence) / 2
    rank, below = 1, 0.0
    while rank < (n + 1) // 2:
        below += math.comb(n, rank - 1) / 2**n
        if below + math.comb(n, rank) / 2**n > tail:
            break
        rank += 1
    return rank
