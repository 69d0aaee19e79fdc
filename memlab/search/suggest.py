"""When nothing in a fit's space fits: plans outside it that change what is trained, estimated on fake tensors; and
when no single lever fits, the combinations of levers the memory model does not rule out, the most promising
estimated first (:func:`combined_suggestions`)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from torch import nn

from memlab.errors import MemlabError
from memlab.live.batch import Batch
from memlab.options import RunOptions
from memlab.plan import PLAN_FIELDS, Plan
from memlab.report import Trial
from memlab.search.memory import FIT_MARGIN
from memlab.search.space import micro_batch_of
from memlab.search.speed import SpeedPrior
from memlab.techniques.adapters import ADAPTER_KINDS
from memlab.techniques.core.registry import REGISTRY, least_share
from memlab.techniques.loss import CHUNKED_LOSS, LOSSES
from memlab.techniques.offload import COMBINED_OFFLOADS
from memlab.techniques.optimizer import SEARCHED_OPTIMIZERS, SUGGESTED_OPTIMIZERS
from memlab.techniques.precision import BF16, FULL_PRECISION
from memlab.techniques.weights import WEIGHT_DTYPES

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
    the budget with ``FIT_MARGIN`` to spare, the one the speed prior expects fastest first. An alternative whose
    parameters alone could not fit so (its levers' least share of those ``measured``) is not estimated.

    Example:
        >>> from memlab.search.speed import speed_prior
        >>> weights = Trial(Plan(), "oom", 2**20, {"params": 2**20}, None, None, None, "cpu")
        >>> suggestions(nn.Linear(2, 2), {}, [weights], {}, RunOptions(budget=2**16), speed_prior("cpu"))
        []
    """
    from memlab.estimation.estimate import estimate_plans  # imported here: estimate builds on the search's runner

    if options.budget is None:
        return []
    # A plan holds at least its lever's least share of the parameters measured (QLoRA's 4-bit base an eighth):
    # where that alone leaves no margin under the budget, its estimate could only say it does not fit.
    measured_params = min((trial.breakdown.get("params", 0) for trial in measured if trial.breakdown), default=0)
    plans = [
        plan for plan in alternatives(measured, space, lightest)
        if least_share(plan, "least_params") * measured_params * FIT_MARGIN <= options.budget
    ]
    if not plans:
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


# --- combinations of levers, when no single one fits -----------------------------------------------------------------

COMBINED: tuple[tuple[str, tuple[Any, ...]], ...] = (
    ("adapter", ADAPTER_KINDS),
    ("weights", WEIGHT_DTYPES),
    ("precision", (FULL_PRECISION, BF16)),
    ("optimizer", (*SEARCHED_OPTIMIZERS, *SUGGESTED_OPTIMIZERS)),
    ("checkpointing", (False, True)),
    ("loss", LOSSES),
    ("offload", COMBINED_OFFLOADS),
)
"""The levers (and values) whose combinations :func:`combinations` predicts, beside the micro-batch split."""

# Rough shares of the activations a lever keeps, used only to order the combinations the memory model lets through
# (each is then estimated, and only its own estimate decides): checkpointing keeps each block's input, bf16
# autocast halves most saved tensors, the chunked loss never holds the whole logits.
_LIKELY_ACTIVATIONS = {("checkpointing", True): 0.2, ("precision", BF16): 0.6, ("loss", CHUNKED_LOSS): 0.8}


def combinations(base: Trial, *, budget: int, rows: int, prior: SpeedPrior, half: str = BF16) -> list[Plan]:
    """Combinations of levers (:data:`COMBINED`, and micro-batches of ``rows`` with accumulation keeping ``rows``
    per step) on ``base``'s plan that the search's memory model (:class:`~memlab.search.memory.MemoryModel`, fed
    with ``base`` as an estimate) does not rule out for ``budget``, the most promising first: those likely to fit
    (activations scaled by rough shares), the fastest the speed prior expects first; then the rest by likely peak.
    A plan is ruled out only when what it needs at least (weights, gradients, optimizer state, the CUDA context)
    is over the budget, so nothing that could fit is dropped on a guess. ``half``: the autocast precision tried,
    ``"fp16"`` on a GPU without bf16 (:attr:`memlab.estimation.cuda.gpus.GpuKind.bf16`), where pure bf16 weights,
    which such a GPU emulates, are not combined either.

    Example:
        >>> from memlab.search.speed import speed_prior
        >>> gib = 2**30
        >>> parts = {"params": 4 * gib, "grads": 4 * gib, "optimizer": 8 * gib, "activations": gib, "other": 0}
        >>> base = Trial(Plan(), "ok", 17 * gib, parts, None, None, None, "cuda", estimated=True)
        >>> plans = combinations(base, budget=6 * gib, rows=4, prior=speed_prior("cuda"))
        >>> plans[0].label(), all(plan.adapter != "none" or plan.weights == "bf16" for plan in plans)
        ('bf16 bf16-weights lora', True)
    """
    from memlab.plan import Plan as PlanClass
    from memlab.search.memory import MemoryModel
    from memlab.techniques.core.registry import conflicts

    model = MemoryModel([], trainable_bytes=base.breakdown.get("params", 0), batch_size=rows, estimates=[base])
    context = base.context_bytes or 0
    reserve = (base.card_bytes - context) / base.peak_bytes if base.card_bytes and base.peak_bytes else 1.0
    activations = float(base.breakdown.get("activations", 0))
    base_rows = micro_batch_of(base.plan, rows)
    splits = sorted({size for size in (rows, rows // 2, rows // 4, 1) if size >= 1 and rows % size == 0}, reverse=True)
    likely: list[tuple[bool, float, float, Plan]] = []
    # Where the GPU has no native bf16 (half is fp16), pure bf16 weights would run emulated: not suggested there.
    levers = [(name, tuple(half if (name, value) == ("precision", BF16) else value for value in choices
                           if half == BF16 or (name, value) != ("weights", BF16)))
              for name, choices in COMBINED]
    for values in itertools.product(*(choices for _, choices in levers)):
        changes = dict(zip((name for name, _ in levers), values, strict=True))
        for size in splits:
            fields = {**changes, "micro_batch": None if size == rows else size, "accumulation": rows // size}
            if conflicts(_Fields(base.plan, fields)):
                continue
            try:
                plan = base.plan.replace(**fields)
            except (ValueError, TypeError, MemlabError):
                continue
            if plan == base.plan or not isinstance(plan, PlanClass):
                continue
            if model.predict(plan) + context > budget:
                continue  # needs more than the budget at least
            share = size / base_rows
            for (name, value), kept in _LIKELY_ACTIVATIONS.items():
                share *= kept if changes[name] == (half if (name, value) == ("precision", BF16) else value) else 1.0
            peak = (max(model.predict(plan), model.fixed_bytes(plan) + model.grads_bytes(plan) + activations * share)
                    * reserve + context)
            speed = (size / rows) ** prior.micro_batch_exponent
            for name, value in changes.items():
                speed *= prior.ratio(name, value)
            likely.append((peak * FIT_MARGIN <= budget, speed, peak, plan))
    likely.sort(key=lambda entry: (not entry[0], -entry[1] if entry[0] else entry[2], entry[2]))
    return [plan for *_, plan in likely]


class _Fields:
    """A plan's fields with some changed, for :func:`memlab.techniques.core.registry.conflicts` before a Plan is
    made."""

    def __init__(self, plan: Plan, changes: Mapping[str, Any]) -> None:
        self._plan, self._changes = plan, changes

    def __getattr__(self, name: str) -> Any:
        return self._changes[name] if name in self._changes else getattr(self._plan, name)


def levers_of(plan: Plan) -> set[tuple[str, Any]]:
    """The (lever, value) pairs where ``plan`` differs from the plain plan.

    Example:
        >>> sorted(levers_of(Plan(checkpointing=True, optimizer="adamw8bit")))
        [('checkpointing', True), ('optimizer', 'adamw8bit')]
    """
    plain = Plan()
    return {(name, getattr(plan, name)) for name in PLAN_FIELDS if getattr(plan, name) != getattr(plain, name)}


def combined_suggestions(
    base: Trial, estimate: Callable[[list[Plan]], Sequence[Trial]], *, budget: int, rows: int, prior: SpeedPrior,
    want: int = 3, tries: int = 6, say: Callable[[str], None] | None = None, half: str = BF16,
) -> list[Trial]:
    """Estimates (``estimate(plans) -> trials``) of the most promising :func:`combinations`, one at a time until
    ``want`` fit the budget with ``FIT_MARGIN`` to spare or ``tries`` were estimated; a combination that only adds
    levers to one found to fit is skipped (it can only be slower). The fitting ones, the fastest expected first.
    ``half``: :func:`combinations`'s (``"fp16"`` where the GPU has no bf16).

    Example:
        >>> from memlab.search.speed import speed_prior
        >>> gib = 2**30
        >>> parts = {"params": 4 * gib, "grads": 4 * gib, "optimizer": 8 * gib, "activations": gib, "other": 0}
        >>> base = Trial(Plan(), "ok", 17 * gib, parts, None, None, None, "cuda", estimated=True)
        >>> def estimate(plans):  # a stand-in for the dry run: half the base's bytes for pure bf16
        ...     return [Trial(p, "ok", 5 * gib if p.weights == "bf16" else 9 * gib, {}, None, None, None, "cuda")
        ...             for p in plans]
        >>> [t.label for t in combined_suggestions(base, estimate, budget=6 * gib, rows=1, prior=speed_prior("cuda"),
        ...                                        want=1)]
        ['bf16 bf16-weights lora']
    """
    found: list[Trial] = []
    tried = 0
    for plan in combinations(base, budget=budget, rows=rows, prior=prior, half=half):
        if len(found) >= want or tried >= tries:
            break
        if any(levers_of(trial.plan) <= levers_of(plan) for trial in found):
            continue
        tried += 1
        if say is not None:
            say(f"estimating what could fit instead, {tried} of at most {tries}: {plan.label()}")
        for trial in estimate([plan]):
            if trial.status == "ok" and trial.verdict_bytes * FIT_MARGIN <= budget:
                found.append(trial)
    return found
