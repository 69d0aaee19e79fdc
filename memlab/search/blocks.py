"""Selective checkpointing in the search: the fewest checkpointed blocks that fit.

When the best plan found checkpoints every block and the same plan without checkpointing did not fit (or was not
measured), a plan with fewer blocks checkpointed may fit too, and is faster: each block left unchecked runs its
forward once. Memory falls as blocks are checkpointed (monotone in ``k``), so a bisection over ``k`` finds the
fewest that fit in at most ``log2(L)`` trials. With dry runs on fake tensors, every ``k`` is estimated first (one
call): a ``k`` estimated over the budget by more than the estimate's known error (``FIT_MARGIN``) is taken as not
fitting, the first ``k`` measured is the fewest estimated to fit and the second its neighbour (one fewer if it fit,
one more if not), so that with estimates on the mark the search ends after two trials (a bisection over 8 blocks
takes 3, over 32 blocks 5). ``limit`` caps the trials (what is left of ``fit``'s ``max_trials``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from memlab.plan import Plan
from memlab.report import Trial
from memlab.search.memory import FIT_MARGIN
from memlab.search.space import best_of, fits

__all__ = ["fewest_blocks"]


def fewest_blocks(
    trials: Sequence[Trial],
    budget: int,
    count: Callable[[], int],
    run: Callable[[Plan], Trial],
    *,
    estimate: Callable[[Sequence[Plan]], Sequence[Trial]] | None = None,
    limit: int | None = None,
) -> list[Trial]:
    """The trials of a bisection over the number of checkpointed blocks, for the best of ``trials`` when it
    checkpoints every one of the model's ``count()`` blocks (asked only then); empty when there is nothing to look
    for (the best checkpoints less, or the same plan without checkpointing fits) or ``limit`` is 0. ``run(plan)``
    measures (or estimates) a plan; ``estimate(plans)``, when given, estimates them all at once beforehand, to narrow
    the bisection (see the module docstring); at most ``limit`` plans are run (None: no limit).

    Example:
        >>> def run(plan):  # each unchecked block keeps 10 bytes
        ...     blocks = 8 if plan.checkpointing is True else plan.checkpointing
        ...     return Trial(plan, "ok", 100 + 10 * (8 - blocks), {}, 1.0, 1.0, None, "cpu")
        >>> found = fewest_blocks([run(Plan(checkpointing=True))], 135, lambda: 8, run)
        >>> [t.plan.checkpointing for t in found]
        [4, 6, 5]
        >>> guided = fewest_blocks([run(Plan(checkpointing=True))], 135, lambda: 8, run,
        ...                        estimate=lambda plans: [run(plan) for plan in plans])
        >>> [t.plan.checkpointing for t in guided]
        [5, 4]
        >>> fewest_blocks([run(Plan(checkpointing=True))], 135, lambda: 8, run, limit=0)
        []
    """
    best = best_of(trials, budget)
    if best is None or best.plan.checkpointing is not True or limit == 0:
        return []
    plain = best.plan.replace(checkpointing=False)
    if any(trial.plan == plain and fits(trial, budget) for trial in trials):
        return []
    low, high = 0, count()  # low does not fit (or is not known to), high does
    guess: int | None = None
    if estimate is not None and high > 1:
        middles = range(1, high)
        estimated = dict(zip(middles, estimate([best.plan.replace(checkpointing=k) for k in middles]), strict=True))
        over = [k for k, trial in estimated.items() if (
            trial.status == "ok" and trial.verdict_bytes > budget * FIT_MARGIN
        )]
        low = max(over, default=0)
        guess = next((k for k, trial in estimated.items() if k > low and fits(trial, budget)), None)
    guess_made = guess is not None
    found: list[Trial] = []
    while high - low > 1 and (limit is None or len(found) < limit):
        middle = guess if guess is not None and low < guess < high else (low + high) // 2
        trial = run(best.plan.replace(checkpointing=middle))
        found.append(trial)
        if fits(trial, budget):
            high, guess = middle, middle - 1
        else:
            low, guess = middle, middle + 1
        if not guess_made or len(found) > 1:  # the estimates steer the first probe and its neighbour only
            guess = None
    return found
