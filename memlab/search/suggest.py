"""When nothing in a fit's space fits: plans outside it that change what is trained, estimated on fake tensors."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from torch import nn

from memlab.live.batch import Batch
from memlab.options import RunOptions
from memlab.plan import Plan
from memlab.report import Trial
from memlab.search.memory import FIT_MARGIN
from memlab.search.speed import SpeedPrior
from memlab.techniques.registry import REGISTRY

OUTSIDE_THE_SPACE: tuple[dict[str, Any], ...] = tuple(
    {name: value} for name, lever in REGISTRY.items() for value in lever.suggest
)
"""What fit leaves out of its default space because it changes what is trained (each lever's ``suggest`` in the
registry), each as the plan fields it sets.

Example:
    >>> OUTSIDE_THE_SPACE
    ({'weights': 'bf16'}, {'adapter': 'lora'}, {'adapter': 'qlora'}, {'optimizer': 'adafactor'})
"""


SUGGESTED = tuple(dict.fromkeys(name for changes in OUTSIDE_THE_SPACE for name in changes))
"""The levers suggestions change."""


def alternatives(
    measured: Sequence[Trial], space: Mapping[str, Sequence[Any]], lightest: Plan | None = None
) -> list[Plan]:
    """The plans to suggest from: the measured plan with the lowest peak and ``lightest`` (the plan of the space
    predicted to need least), each with each lever the space left out.

    Example:
        >>> from memlab.report import Trial
        >>> low = Trial(Plan(checkpointing=True), "oom", 90, {}, None, None, None, "cpu")
        >>> [p.label() for p in alternatives([low], {"checkpointing": [False, True]})]
        ['ckpt bf16-weights', 'ckpt lora', 'ckpt qlora', 'ckpt adafactor']
    """
    if not measured:
        return []
    bases = dict.fromkeys([min(measured, key=lambda trial: trial.peak_bytes).plan, *([lightest] if lightest else [])])
    plans = []
    for base in bases:
        for changes in OUTSIDE_THE_SPACE:
            if any(value in space.get(name, ()) for name, value in changes.items()):
                continue  # the user searched this lever already
            plans.append(base.replace(**changes))
    return list(dict.fromkeys(plans))


def suggestions(
    model: nn.Module, batch: Batch, measured: Sequence[Trial], space: Mapping[str, Sequence[Any]],
    options: RunOptions, prior: SpeedPrior, lightest: Plan | None = None,
) -> list[Trial]:
    """Estimates of :func:`alternatives` whose verdict figure (:attr:`~memlab.report.data.Trial.verdict_bytes`) fits
    the budget with ``FIT_MARGIN`` to spare, the one the speed prior expects fastest first."""
    from memlab.estimation.estimate import estimate_plans  # imported here: estimate builds on the search's runner

    plans = alternatives(measured, space, lightest)
    if not plans or options.budget is None:
        return []
    device = next(model.parameters()).device
    report = estimate_plans(
        model, batch, plans, loss_fn=options.loss_fn, budget=options.budget, lr=options.lr, device=device.type
    )
    # An estimate cannot see a library's temporaries (bitsandbytes dequantizing a 4-bit weight, allocator
    # rounding): a suggestion keeps the search's margin below the budget, so that measured, it fits. It is judged
    # on the figure every verdict judges (the card figure on CUDA, where the estimate models it).
    fitting = [
        trial for trial in report.trials
        if trial.status == "ok" and trial.verdict_bytes * FIT_MARGIN <= options.budget
    ]

    def expected_speed(trial: Trial) -> float:
        speed = 1.0
        for name in SUGGESTED:
            speed *= prior.ratio(name, getattr(trial.plan, name))
        return speed

    return sorted(fitting, key=expected_speed, reverse=True)
