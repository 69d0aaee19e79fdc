"""Where no plan fits a GRPOTrainer's budget: the config changes that change the training, each estimated (issue 59).

``fit`` searches only the levers that keep the training the same. When none of its plans fits, these are said as
suggestions, each a GRPO estimate (:func:`memlab.kinds.grpo.estimate.estimate_grpo`) of the lightest plan with one
GRPOConfig change, and each saying what it changes:

- ``beta=0.0``: no reference model (its weights, where it is held apart) and no reference log-probs; the loss loses
  its KL term;
- a shorter ``max_completion_length``: the longest estimated to fit, found by bisection; completions are cut there,
  so what the policy learns from changes;
- fewer ``num_generations`` with the same prompts per step: fewer completions per prompt (and per optimizer step),
  so the group advantages are over fewer samples.

The trainer is changed only while each estimate runs (its attributes set and put back); nothing runs for real.

Example:
    >>> [name for name, _ in CHANGES]
    ['beta', 'max_completion_length', 'num_generations']
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from memlab.kinds.grpo.vllm import engine_device
from memlab.live.patching import patched
from memlab.plan import Plan
from memlab.report.data import Trial

if TYPE_CHECKING:
    from memlab.estimation.cuda.gpus import GpuKind

__all__ = ["CHANGES", "grpo_suggestions", "with_grpo_dry_runs"]

CHANGES = (
    ("beta", "no reference model and no reference log-probs: the loss loses its KL term to the reference policy"),
    ("max_completion_length", "completions cut at {value} tokens (from {before}): the policy learns from shorter "
                              "answers"),
    ("num_generations", "{value} completions per prompt (from {before}), the same prompts per step: "
                        "per_device_train_batch_size={rows} x gradient_accumulation_steps={steps}; the group "
                        "advantages are over fewer samples"),
)
"""Each GRPOConfig change suggested, with what it changes in the training."""


@contextlib.contextmanager
def _changed(trainer: Any, name: str, value: Any) -> Iterator[None]:
    """The trainer (and its arguments) with one GRPOConfig setting changed while an estimate runs; put back after.
    ``num_generations`` keeps the prompts per step: the generations per device and per generation batch follow."""
    args = trainer.args
    on_args = {name: value}
    if name == "num_generations":
        before = int(trainer.num_generations)
        for field in ("per_device_train_batch_size", "generation_batch_size"):
            on_args[field] = int(getattr(args, field)) * value // before
    with patched(trainer, **{name: value}), patched(args, **on_args):
        yield


def _estimate(trainer: Any, plan: Plan, name: str, value: Any, options: dict[str, Any]) -> Trial:
    from memlab.estimation.estimate import estimate

    with _changed(trainer, name, value):
        if name == "num_generations":  # the plan's split follows the generations per device
            rows = int(trainer.args.per_device_train_batch_size) * int(trainer.args.gradient_accumulation_steps)
            plan = plan.replace(micro_batch=max(rows // plan.accumulation, 1)) if rows % plan.accumulation == 0 \
                else plan.replace(micro_batch=rows, accumulation=1)
        return estimate(trainer, plan, **options)


def _said(trial: Trial, name: str, value: Any, before: Any, trainer: Any) -> Trial:
    what = dict(CHANGES)[name]
    args = trainer.args
    rows = int(args.per_device_train_batch_size) * value // max(int(trainer.num_generations), 1)
    text = what.format(value=value, before=before, rows=rows, steps=args.gradient_accumulation_steps)
    note = f"GRPOConfig({name}={value!r}) changes the training: {text}"
    return dataclasses.replace(trial, notes=(note, *trial.notes))


def grpo_suggestions(
    trainer: Any, plan: Plan, *, budget: int, device: Any, lr: float, loss_fn: Any = None, gpu: GpuKind | None = None,
    multiple: int = 1,
) -> tuple[list[Trial], str | None]:
    """The GRPOConfig changes estimated to fit ``budget`` with ``plan`` (the lightest plan fit found), each trial's
    first note saying what it changes; and a sentence naming the longest ``max_completion_length`` estimated to
    fit (None where even one token does not fit). ``gpu``: the GPU kind a CUDA estimate is for (``memlab.estimate``'s
    ``gpu=``: its card figure and CUDA context); ``multiple``: the completion lengths tried are multiples of it (64:
    fewer dry runs on a large model; ``memlab estimate --trainer grpo`` asks so), token by token where
    ``max_completion_length`` is not above it.

    Example (a trainer nothing fits: ``tests/kinds/grpo/test_grpo_fit.py`` builds one)::

        suggestions, longest = grpo_suggestions(trainer, memlab.Plan(micro_batch=1, accumulation=4),
                                                budget=2_000_000, device="cpu", lr=1e-5)
    """
    options = {"budget": budget, "device": engine_device(trainer, device), "lr": lr, "loss_fn": loss_fn, "gpu": gpu}
    found: list[Trial] = []
    if float(getattr(trainer, "beta", 0.0)) != 0.0:
        trial = _estimate(trainer, plan, "beta", 0.0, options)
        if trial.fits:
            found.append(_said(trial, "beta", 0.0, trainer.beta, trainer))
    completion = int(trainer.max_completion_length)
    longest, at_longest = _longest_completion(trainer, plan, completion, options, multiple)
    sentence = None
    if at_longest is not None:
        found.append(_said(at_longest, "max_completion_length", longest, completion, trainer))
        sentence = (f"the longest max_completion_length estimated to fit {plan.label()} in the budget: {longest} "
                    f"tokens (of {completion}): GRPOConfig(max_completion_length={longest}) cuts the completions")
    generations = int(trainer.num_generations)
    for fewer in range(generations - 1, 1, -1):
        if (int(trainer.args.per_device_train_batch_size) * fewer) % generations:
            continue  # the prompts per device would not stay whole
        trial = _estimate(trainer, plan, "num_generations", fewer, options)
        if trial.fits:
            found.append(_said(trial, "num_generations", fewer, generations, trainer))
            break
    return found, sentence


def _longest_completion(trainer: Any, plan: Plan, completion: int, options: dict[str, Any],
                        multiple: int = 1) -> tuple[int, Trial | None]:
    """The longest ``max_completion_length`` below ``completion`` estimated to fit, by bisection (memory grows with
    it) over the multiples of ``multiple`` (over every length where ``completion`` is not above ``multiple``), then
    over the lengths below the smallest multiple where none fits, with its estimate; ``(0, None)`` where one token
    does not fit."""
    step = multiple if completion > multiple >= 1 else 1
    low, high, best = 1, (completion - 1) // step, None
    while low <= high:
        middle = (low + high) // 2
        trial = _estimate(trainer, plan, "max_completion_length", middle * step, options)
        if trial.status == "ok" and trial.fits:
            low, best = middle + 1, (middle * step, trial)
        else:
            high = middle - 1
    if best is None and step > 1:  # none of the multiples fits: the lengths below the smallest, one by one
        return _longest_completion(trainer, plan, step, options)
    return best if best is not None else (0, None)


def with_grpo_dry_runs(target: Any, trainer: Any, loss_fn: Any = None) -> Any:
    """``target`` (a GRPOTrainer's :class:`~memlab.trainer.entry.LiveTarget`) with the dry runs ``fit`` needs: each
    plan's GRPO estimate for pruning, and these suggestions where nothing fits. ``fit`` adds them (the runner's
    target stays below the estimation layer).

    Example:
        >>> from types import SimpleNamespace
        >>> from memlab.trainer.entry import LiveTarget
        >>> with_grpo_dry_runs(LiveTarget(None, None, None), SimpleNamespace()).suggest.func is grpo_suggestions
        True
    """
    from memlab.kinds.grpo.estimate import grpo_plans_estimator

    return dataclasses.replace(target, estimate=grpo_plans_estimator(trainer, loss_fn),
                               suggest=functools.partial(grpo_suggestions, trainer, loss_fn=loss_fn))
