"""Selective checkpointing in the search: the fewest checkpointed blocks that fit.

When the best plan found checkpoints every block and the same plan without checkpointing did not fit (or was not
measured), a plan with fewer blocks checkpointed may fit too, and is faster: each block left unchecked runs its
forward once. Memory falls as blocks are checkpointed (monotone in ``k``), so a bisection over ``k`` finds the
fewest that fit in ``log2(L)`` trials.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from memlab.plan import Plan
from memlab.report import Trial
from memlab.search.space import best_of, fits

__all__ = ["fewest_blocks"]


def fewest_blocks(
    trials: Sequence[Trial], budget: int, count: Callable[[], int], run: Callable[[Plan], Trial]
) -> list[Trial]:
    """The trials of a bisection over the number of checkpointed blocks, for the best of ``trials`` when it
    checkpoints every one of the model's ``count()`` blocks (asked only then); empty when there is nothing to look
    for (the best checkpoints less, or the same plan without checkpointing fits). ``run(plan)`` measures (or
    estimates) a plan.

    Example:
        >>> def run(plan):  # each unchecked block keeps 10 bytes
        ...     blocks = 8 if plan.checkpointing is True else plan.checkpointing
        ...     return Trial(plan, "ok", 100 + 10 * (8 - blocks), {}, 1.0, 1.0, None, "cpu")
        >>> found = fewest_blocks([run(Plan(checkpointing=True))], 135, lambda: 8, run)
        >>> [t.plan.checkpointing for t in found]
        [4, 6, 5]
    """
    best = best_of(trials, budget)
    if best is None or best.plan.checkpointing is not True:
        return []
    plain = best.plan.replace(checkpointing=False)
    if any(trial.plan == plain and fits(trial, budget) for trial in trials):
        return []
    low, high = 0, count()  # low does not fit (or is not known to), high does
    found: list[Trial] = []
    while high - low > 1:
        middle = (low + high) // 2
        trial = run(best.plan.replace(checkpointing=middle))
        found.append(trial)
        if fits(trial, budget):
            high = middle
        else:
            low = middle
    return found
