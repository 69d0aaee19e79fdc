"""The sizes :func:`memlab.limits` tries: a bracket (the largest size that fits below the smallest that does not)
narrowed until its ends are one ``step`` apart, within :data:`MAX_RUNS` tries and :data:`MAX_SECONDS`.

Each next size is where the curve through the sizes tried crosses the budget (:func:`crossing`), kept strictly
inside the bracket: where the curve is right, its try fits and the next one up does not, two tries. Where it misjudged
(its try fell on the other side of the budget than it said, or its last two tries left the bracket over half as
wide: a kink where the peak moves to another phase, the card figure jumping with the allocator's segments), the next
is the bracket's middle (its double, without a high end), so a bracket of ``n`` steps takes at most about
``2 log2(n)`` tries.

The figure need not grow with the size: a GRPO step on CUDA holds a padded copy of the expanded attention mask
(B x heads x L x L) in the memory-efficient kernel's backward unless the sequence is a multiple of 16 tokens, so a
longer completion can need less. The bracket's low end is therefore the largest fitting size *below* the smallest
that does not fit, never a fitting size above one that does not, and the size one step below the answer is tried
too (one more try) where it was not: an answer that fits only as a dip below its neighbours is not kept. Dips
between the sizes tried (a size not a multiple of the step) are not seen.

Example:
    >>> from memlab.plan import Plan
    >>> from memlab.report.data import Trial
    >>> def run(size):  # a figure of 10 bytes per size, against a budget of 1,000
    ...     return Trial(Plan(), "ok", 10 * size, {}, None, None, None, "cpu", budget=1000)
    >>> searched = narrow(run, start=8, step=1, ceiling=None, budget=1000, grow=(2, 4))
    >>> bracket(searched.tried, 1000), searched.stopped
    ((100, 101), None)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from memlab.report.data import Trial

__all__ = ["MAX_RUNS", "MAX_SECONDS", "Searched", "bracket", "crossing", "fits", "narrow"]

MAX_RUNS = 16
"""The most sizes :func:`narrow` tries: enough to halve a bracket of 2**6 steps twice over after the first tries."""
MAX_SECONDS = 150.0
"""The time :func:`narrow` gives its tries: no try starts once the tries so far, and one more of their average
length, would pass it (a 0.5B-parameter GRPOTrainer's dry run takes 5 to 20 s on a shared 2-core CPU). The whole-card
checks of a dry run's answer come after it."""


def fits(trial: Trial, budget: int) -> bool:
    """Whether ``trial`` ran within ``budget`` by the figure that judges it, and within its host budget."""
    return trial.status == "ok" and trial.verdict_bytes <= budget and trial.host_fits


def bracket(tried: Mapping[int, Trial], budget: int) -> tuple[int, int | None]:
    """The largest size that fits below the smallest that does not (0 where none does), and that smallest size (None
    where every size tried fits).

    Example:
        >>> from memlab.plan import Plan
        >>> def t(peak): return Trial(Plan(), "ok", peak, {}, None, None, None, "cpu", budget=100)
        >>> bracket({1: t(50), 2: t(120), 3: t(90)}, 100)  # 3 fits, but 2 below it does not
        (1, 2)
    """
    high = min((size for size, trial in tried.items() if not fits(trial, budget)), default=None)
    low = max((size for size, trial in tried.items() if fits(trial, budget) and (high is None or size < high)),
              default=0)
    return low, high


@dataclass
class Searched:
    """What :func:`narrow` tried (``size -> Trial``, in the order tried) and why it stopped short, if it did: the
    limit it reached, in words."""

    tried: dict[int, Trial] = field(default_factory=dict)
    stopped: str | None = None


def narrow(run: Callable[[int], Trial], *, start: int, step: int, ceiling: int | None, budget: int,
           grow: Sequence[int], clock: Callable[[], float] = time.monotonic) -> Searched:
    """Sizes tried with ``run`` (multiples of ``step``, at most ``ceiling``) until the largest that fits and the next
    that does not are one ``step`` apart, or nothing fits at ``step``, or every size up to ``ceiling`` fits, or
    :data:`MAX_RUNS` tries or :data:`MAX_SECONDS` are spent (said in ``stopped``). ``start`` first; where it fits,
    ``start`` times each of ``grow``, where it does not, ``step``.

    Example:
        >>> from memlab.plan import Plan
        >>> def run(size): return Trial(Plan(), "ok", size * size, {}, None, None, None, "cpu", budget=10**6)
        >>> searched = narrow(run, start=64, step=64, ceiling=None, budget=10**6, grow=(2, 4))
        >>> sorted(searched.tried), bracket(searched.tried, 10**6)
        ([64, 128, 256, 896, 960, 1024], (960, 1024))
    """
    searched = Searched()
    tried = searched.tried
    began = clock()

    def attempt(size: int) -> bool:
        if size in tried:
            return True
        if len(tried) >= MAX_RUNS:
            searched.stopped = f"{MAX_RUNS} tries"
            return False
        spent = clock() - began
        if tried and spent + spent / len(tried) > MAX_SECONDS:
            searched.stopped = f"{MAX_SECONDS:g} s ({len(tried)} tries)"
            return False
        tried[size] = run(size)
        return True

    attempt(start)
    if fits(tried[start], budget):
        for times in grow:
            attempt(min(times * start, ceiling or times * start))
    else:  # the smallest size says whether anything fits at all
        attempt(step)
    widths: list[int | None] = []  # the bracket's width before each try (None: no high end yet)
    size, expected = start, None  # the last try and whether the curve said it would fit (None: not the curve's)
    while searched.stopped is None:
        low, high = bracket(tried, budget)
        if not low:
            break
        if (high is not None and high - low <= step) or (high is None and low == ceiling):
            # the size one step below the answer too, where it was not tried: a figure that dips at one size
            # (the attention mask's copy skipped where the sequence is a multiple of 16) is not the answer then
            below = low - step
            if below < step or below in tried or not attempt(below) or fits(tried[below], budget):
                break
            size, expected = below, None
            continue
        widths.append(None if high is None else high - low)
        # The curve misjudges here (a kink where the peak moves to another phase, the card's segments): its last try
        # fell on the other side of the budget than it said, or its last two left the bracket over half as wide.
        earlier = widths[-3] if len(widths) > 2 else None
        halve = expected is not None and (
            expected != fits(tried[size], budget) or (earlier is not None and high is not None and
                                                      high - low > earlier // 2))
        size, expected = _next_size(tried, budget, low, high, step, ceiling, halve)
        if size in tried or not attempt(size):
            break
    return searched


def crossing(points: Sequence[tuple[int, int]], budget: int) -> float | None:
    """Where the curve through ``points`` (size, bytes) reaches ``budget``: a parabola through the three nearest the
    budget (memory's shape in tokens), a line through two; None when it never does.

    Example:
        >>> round(crossing([(1, 110), (2, 130), (4, 200)], 250), 6)  # 100 + 5 s + 5 s**2
        5.0
    """
    import numpy as np

    near = sorted(points, key=lambda point: abs(point[1] - budget))[:3]
    if len({size for size, _ in near}) < 2:
        return None
    sizes = np.array([size for size, _ in near], dtype=float)
    values = np.array([value for _, value in near], dtype=float)
    degree = min(2, len(near) - 1)
    coefficients = np.polyfit(sizes, values, degree)
    coefficients[-1] -= budget
    roots = [root.real for root in np.roots(coefficients) if abs(root.imag) < 1e-9 and root.real > 0]
    growing = [root for root in roots if np.polyval(np.polyder(coefficients), root) > 0]
    return float(min(growing)) if growing else None


def _next_size(tried: Mapping[int, Trial], budget: int, low: int, high: int | None, step: int,
               ceiling: int | None, halve: bool) -> tuple[int, bool | None]:
    """The size to try next, a multiple of ``step`` strictly between ``low`` (fits) and ``high`` (does not), and
    whether the curve expects it to fit: the curve's crossing rounded down, or with ``halve`` (or where the curve
    says nothing) the middle of the bracket (its double where it has no high end), expecting nothing (None).

    The curve is the allocated peak's (smooth: a parabola in tokens), and the budget it must cross is the budget less
    what the card adds to the peak (the allocator's reserve and the CUDA context) at the try nearest the budget."""
    guess = None
    ok = [trial for trial in tried.values() if trial.status == "ok"]
    if ok and not halve:
        near = min(ok, key=lambda trial: abs(trial.verdict_bytes - budget))
        target = budget - (near.verdict_bytes - near.peak_bytes)
        guess = crossing([(size, trial.peak_bytes) for size, trial in tried.items() if trial.status == "ok"], target)
    if guess is None:
        size = 2 * low if high is None else (low + high) // 2 // step * step
    else:
        size = int(min(guess, 1e12)) // step * step
    size = max(size, low + step)
    if high is not None:
        size = min(size, high - step)
    size = min(size, ceiling) if ceiling else size
    return size, None if guess is None else size <= guess
