"""The CUDA allocator's expandable segments as fit's free lever: where nothing fits and a plan measured on CUDA
failed only on the allocator's reserve (its allocated peak and the CUDA context within the budget), the plan with
``expandable_segments=True`` estimated; where that fits, a suggestion of that plan (what ``apply`` and the exports
take) that says the line to set. They change what the card shows, not the step, and are best set in the process's
environment before CUDA starts (a live trial switches them on for new segments only), so fit estimates them rather
than measuring them."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from torch import nn

from memlab.live.batch import Batch
from memlab.live.device import ENVIRONMENT_LINE, PYTHON_LINE, expandable_segments_configured
from memlab.options import RunOptions
from memlab.report import Trial

__all__ = ["EXPANDABLE_SUGGESTION", "MOST_ESTIMATED", "expandable_suggestions", "reserve_only_over"]

MOST_ESTIMATED = 2
"""The most plans estimated again with expandable segments (each one more dry run)."""

EXPANDABLE_SUGGESTION = (
    "with the CUDA allocator's expandable segments (the same step, a smaller reserve): set them before CUDA "
    f"starts: {PYTHON_LINE} (or in the shell: {ENVIRONMENT_LINE})"
)
"""The note of a suggestion that fits with expandable segments: the line to set, in Python and in the shell."""


def reserve_only_over(trial: Trial, budget: int) -> bool:
    """Whether ``trial`` ran on CUDA and missed ``budget`` only on the allocator's reserve: its allocated peak and
    CUDA context fit, and the card figure is over the budget (or it ran out of memory under the budget's cap).

    Example:
        >>> from memlab.plan import Plan
        >>> over = Trial(Plan(), "ok", 90, {}, None, None, None, "cuda:0", reserved_bytes=115, context_bytes=5)
        >>> reserve_only_over(over, 100), reserve_only_over(over, 90), reserve_only_over(over, 120)
        (True, False, False)
        >>> reserve_only_over(dataclasses.replace(over, status="oom"), 100)
        True
    """
    if not str(trial.device).startswith("cuda") or trial.status not in ("ok", "oom"):
        return False
    if trial.peak_bytes + (trial.context_bytes or 0) > budget:
        return False
    return trial.status == "oom" or (trial.card_bytes is not None and trial.card_bytes > budget)


def expandable_suggestions(model: nn.Module, batch: Batch, measured: Sequence[Trial], options: RunOptions,
                           *, device: str = "cuda") -> list[Trial]:
    """The measured plans that :func:`reserve_only_over` says missed the budget on the reserve (the lowest peaks
    first, at most :data:`MOST_ESTIMATED`), estimated for ``device`` with ``expandable_segments=True``, those whose card
    figure fits the budget (the verdict every table gives; no margin, unlike the other suggestions': the allocated
    peak and the context were measured within the budget, only the reserve is modelled), each noted with
    :data:`EXPANDABLE_SUGGESTION`. None where this process already runs with them, or without a budget.

    Example:
        >>> from memlab.plan import Plan
        >>> small = Trial(Plan(), "ok", 2**20, {}, None, None, None, "cuda:0", reserved_bytes=2**30)
        >>> expandable_suggestions(nn.Linear(2, 2), {}, [small], RunOptions())  # no budget: nothing to judge
        []
    """
    from memlab.estimation.cuda.context import live_card_context
    from memlab.estimation.estimate import estimate_plans  # imported here: estimate builds on the search's runner

    budget = options.budget
    if budget is None or expandable_segments_configured():
        return []
    over = sorted((trial for trial in measured if reserve_only_over(trial, budget)
                   and not trial.plan.expandable_segments), key=lambda t: t.peak_bytes)
    # the suggestion is the plan with the lever on: what apply and the exports then take (the line included)
    plans = list(dict.fromkeys(trial.plan.replace(expandable_segments=True) for trial in over))[:MOST_ESTIMATED]
    if not plans:
        return []
    report = estimate_plans(model, batch, plans, loss_fn=options.loss_fn, budget=budget, lr=options.lr,
                            device=device)
    found = []
    for trial in report.trials:
        trial = live_card_context(trial, model)
        if trial.status == "ok" and trial.verdict_bytes <= budget:
            found.append(dataclasses.replace(trial, notes=(EXPANDABLE_SUGGESTION, *trial.notes)))
    return found
