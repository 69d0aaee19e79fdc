"""``memlab.limits`` on a trainer (issue 59): the most examples per device any ``transformers.Trainer`` (TRL's
DPOTrainer included) fits in a budget, and on TRL's GRPOTrainer the longest ``max_completion_length`` or the most
generations per device.

A trainer's batches are what it makes from its dataset, so ``limits`` varies the trainer's own settings instead of a
batch: on any trainer, ``vary="rows"``, ``per_device_train_batch_size`` (its ``gradient_accumulation_steps`` kept),
each size's worst batch collated from the train dataset as ``memlab.estimate(trainer)`` collates it, at most the
dataset's length (its sequences are its dataset's, so ``vary="tokens"`` is refused with what to write instead); on a
kind that generates, what its kind's sizes say (:attr:`memlab.live.trainer_kinds.TrainerKind.sizes`: a GRPOTrainer's
completions' length or generations per device, :mod:`memlab.kinds.grpo.sizes`), up to the completion tokens its
model's positions leave (:attr:`~memlab.live.trainer_kinds.TrainerKind.completion_room`).

Each size is a dry run of the trainer's whole step (:func:`memlab.estimate` on the trainer: for GRPO, generation
with its KV cache, the reference log-probs, the training step), with the setting changed on the trainer only while
that estimate runs and put back after; nothing runs for real.

Example:
    >>> from types import SimpleNamespace
    >>> trainer = SimpleNamespace(args=SimpleNamespace(per_device_train_batch_size=8))
    >>> with examples_sized(trainer, 2):
    ...     trainer.args.per_device_train_batch_size
    2
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Iterator, Sized
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from memlab.errors import MemlabError
from memlab.live.patching import patched
from memlab.live.trainer_kinds import KindSizes, generates, kind_of
from memlab.plan import Plan
from memlab.report.data import Trial

__all__ = ["TrainerSizes", "examples_sized", "kind_sizes", "sized", "trainer_sizes"]


@contextlib.contextmanager
def examples_sized(trainer: Any, size: int) -> Iterator[None]:
    """The trainer with ``size`` examples per device while an estimate runs (its ``per_device_train_batch_size``,
    and the batch size the Trainer keeps from it); every attribute put back after."""
    on_trainer = {"_train_batch_size": size} if "_train_batch_size" in vars(trainer) else {}
    with patched(trainer, **on_trainer), patched(trainer.args, per_device_train_batch_size=size):
        yield


def kind_sizes(trainer: Any, vary: str) -> KindSizes:
    """What ``limits`` varies on ``trainer``: its kind's sizes (:attr:`~memlab.live.trainer_kinds.TrainerKind.sizes`)
    where its kind declares them, else its examples per device."""
    declared = kind_of(trainer).sizes
    if declared is not None:
        return declared(trainer, vary)
    return KindSizes(int(trainer.args.per_device_train_batch_size), 1, "examples per device",
                     functools.partial(examples_sized, trainer))


def sized(trainer: Any, vary: str, size: int) -> AbstractContextManager[None]:
    """The trainer with ``size`` set as ``limits`` sets it (:func:`kind_sizes`) while an estimate runs."""
    return kind_sizes(trainer, vary).sized(size)


@dataclass
class TrainerSizes:
    """How ``limits`` tries sizes on a trainer: the trainer's own size, the step between sizes, the largest size
    the model's context allows (None: no limit), ``run(size) -> Trial`` (on the card held to the budget),
    ``whole_card(size) -> Trial`` (on the whole card: the answer's check, as a model's), and the unit the answer
    names."""

    current: int
    multiple: int
    ceiling: int | None
    run: Callable[[int], Trial]
    whole_card: Callable[[int], Trial]
    unit: str


def trainer_sizes(trainer: Any, plan: Plan | None, vary: str, budget: int, multiple: int | None, batch: Any,
                  keywords: dict[str, Any]) -> TrainerSizes:
    """What :func:`memlab.limits` needs to vary a trainer (see the module); ``keywords`` are estimate's (``device``,
    ``gpu``, ``gpus``, ``strategy``, ``loss_fn``, ``lr``, ``host_budget``): with ``gpus`` (or a trainer launched on
    several processes, or set up for DeepSpeed or FSDP), each size is the per-GPU estimate.

    Raises:
        MemlabError: a batch given to a GRPOTrainer, ``vary="tokens"`` on another trainer, a plan that names its
            micro_batch with ``vary="rows"``, a ``multiple`` that would split prompts, or what the estimate refuses.
    """
    from memlab.estimation.cuda.gpus import capped
    from memlab.estimation.estimate import estimate
    generating = generates(trainer)
    if generating and batch is not None:
        raise MemlabError(
            "a GRPOTrainer's batch is what it generates from its prompts, so limits takes none with it: write "
            "memlab.limits(trainer, budget=..., vary='tokens') for the longest max_completion_length, or "
            "vary='rows' for the most generations per device"
        )
    if not generating and vary == "tokens":
        raise MemlabError(
            "limits on a trainer varies its per_device_train_batch_size, and its sequences are its dataset's: write "
            "memlab.limits(trainer, budget=..., vary='rows'); for the longest sequences, memlab.limits(trainer.model, "
            "plan, budget=..., batch={'input_ids': (rows, tokens), 'labels': (rows, tokens)}, loss_fn=...), with "
            "plan=memlab.Plan.from_trainer(trainer)"
        )
    unknown = sorted(set(keywords) - {"device", "gpu", "gpus", "strategy", "loss_fn", "lr", "host_budget"})
    if unknown:
        raise MemlabError(f"limits on a trainer does not take {', '.join(unknown)}; drop it (the trainer's step is "
                          "estimated as memlab.estimate(trainer) estimates it: device=, gpu=, gpus=, strategy=, "
                          "loss_fn=, lr=, host_budget= are taken)")
    sizes = kind_sizes(trainer, vary)
    current, base = sizes.current, sizes.multiple
    if vary == "tokens":
        step = multiple if multiple is not None else 64
    else:
        if plan is not None and plan.micro_batch is not None:
            raise MemlabError(
                f"vary='rows' varies the trainer's per_device_train_batch_size, and the plan fixes "
                f"micro_batch={plan.micro_batch}; write the plan without it (memlab.Plan(accumulation=k) splits each "
                "size into k micro-batches), or plan=None for the trainer as set up"
            )
        if plan is not None:  # the plan's accumulation divides each size's rows per step
            steps = int(trainer.args.gradient_accumulation_steps)
            base = math.lcm(base, plan.accumulation // math.gcd(plan.accumulation, steps))
        step = multiple if multiple is not None else base
    if isinstance(step, bool) or not isinstance(step, int) or step < 1 or step % base:
        whole = sizes.why + (f" (the plan's accumulation={plan.accumulation} divides each size's rows)"
                             if plan is not None and plan.accumulation > 1 else "")
        raise MemlabError(f"multiple={multiple!r} is not allowed here; write a whole number >= 1 that is a multiple "
                          f"of {base}{whole}, e.g. multiple={base}")
    ceiling = None
    dataset = getattr(trainer, "train_dataset", None)
    if not generating and isinstance(dataset, Sized):  # the worst batch holds distinct examples
        ceiling = len(dataset)
    room = kind_of(trainer).completion_room if vary == "tokens" else None
    if room is not None:  # the completion tokens the model's positions leave past the longest prompt
        ceiling = room(trainer)
    # The card held to the budget, as a real cap holds it (as limits' own dry runs).
    on_card = {**keywords, "gpu": capped(keywords.get("gpu"), budget)}

    def run(size: int, card: dict[str, Any] = on_card) -> Trial:
        with sizes.sized(size):
            return estimate(trainer, plan, budget=budget, **card)

    return TrainerSizes(current, step, ceiling, run, lambda size: run(size, keywords), sizes.unit)
