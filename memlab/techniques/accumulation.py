"""Gradient accumulation: several micro-batches per optimizer step, each loss scaled to keep the gradient; the
declarations of the levers that cut the batch (``micro_batch``, ``accumulation``) and what each export writes for
them."""

from __future__ import annotations

from collections.abc import Callable

import torch

from memlab.live.batch import Batch, StepBatches, atomic_refusal, count_rows, is_atomic, take_rows
from memlab.techniques.core.fragments import Accelerate, Code, Elsewhere, Fragment, Keys, per_target, zero
from memlab.techniques.core.lever import Lever, PlanLike
from memlab.techniques.core.technique import PlanFields, StepParts, Technique, Undo


def micro_batches(batch: Batch, plan: PlanFields) -> list[Batch]:
    """The micro-batches of one optimizer step: ``plan.accumulation`` slices of ``plan.micro_batch`` rows.

    Rows are taken in order and wrap around (rows repeat) when the plan asks for more rows than the batch has. An
    atomic batch (:func:`~memlab.live.batch.is_atomic`, a vision-language processor's) is never cut: each
    micro-batch is the whole batch, and a plan of another ``micro_batch`` is refused (:func:`check_split`).

    Example:
        >>> from memlab.plan import Plan
        >>> parts = micro_batches(torch.arange(6).reshape(6, 1), Plan(micro_batch=2, accumulation=3))
        >>> [p.flatten().tolist() for p in parts]
        [[0, 1], [2, 3], [4, 5]]
    """
    if isinstance(batch, StepBatches):  # a trainer's batch: its micro-batches are collated, not cut
        return batch.micro_batches(plan.micro_batch, plan.accumulation)
    rows = count_rows(batch)
    size = plan.micro_batch or rows
    if is_atomic(batch):
        check_split(batch, plan)
        return [batch] * plan.accumulation
    if size == rows and plan.accumulation == 1:
        return [batch]
    order = torch.arange(size * plan.accumulation) % rows
    return [take_rows(batch, order[i * size : (i + 1) * size]) for i in range(plan.accumulation)]


def check_split(batch: Batch, plan: PlanFields) -> None:
    """A clear error, before anything runs, for a plan whose micro-batches would cut or repeat the rows of an
    atomic batch (its micro_batch is not the batch's rows).

    Example:
        >>> from memlab.plan import Plan
        >>> vlm = {"input_ids": torch.zeros(2, 8), "pixel_values": torch.zeros(64, 12)}
        >>> check_split(vlm, Plan(accumulation=2))  # the whole batch, twice per step
        >>> check_split(vlm, Plan(micro_batch=1, accumulation=2))
        Traceback (most recent call last):
        ...
        memlab.errors.MemlabError: micro_batch=1 would cut or repeat the rows of an atomic batch ...
    """
    if not is_atomic(batch):
        return
    rows = count_rows(batch)
    if plan.micro_batch not in (None, rows):
        raise atomic_refusal(rows, f"micro_batch={plan.micro_batch}")


def scale_loss(loss: torch.Tensor, plan: PlanFields) -> torch.Tensor:
    """The micro-batch loss weighted so that summed gradients equal the mean over the effective batch.

    Exact when the loss is a mean over rows (or over tokens with equal token counts per micro-batch).

    Example:
        >>> from memlab.plan import Plan
        >>> scale_loss(torch.tensor(8.0), Plan(micro_batch=2, accumulation=4)).item()
        2.0
    """
    return loss / plan.accumulation if plan.accumulation > 1 else loss


class Accumulation(Technique):
    """``micro_batch`` and ``accumulation``: each step's batch cut into micro-batches, each loss scaled so that the
    summed gradients are the effective batch's.

    Example:
        >>> from torch import nn
        >>> from memlab.plan import Plan
        >>> from memlab.techniques.core.technique import StepParts
        >>> parts = StepParts(nn.Linear(1, 1), Plan(micro_batch=2, accumulation=3), torch.device("cpu"))
        >>> ACCUMULATION.put_on(parts); len(parts.split(torch.zeros(6, 1))), parts.scale(torch.tensor(3.0)).item()
        (3, 1.0)
    """

    def put_on(self, parts: StepParts) -> Undo | None:
        plan = parts.plan
        parts.split = lambda batch: micro_batches(batch, plan)
        if plan.accumulation > 1:
            parts.loss_scales.append(lambda loss: scale_loss(loss, plan))
        return None



ACCUMULATION = Accumulation()


def _loop(plan: PlanLike) -> Code:
    """The plain loop over ``batches``: each batch cut into micro-batches of ``micro_batch`` rows (one optimizer
    step per batch), or each batch one micro-batch (``accumulation`` batches per step)."""
    if plan.micro_batch is not None:
        rows = plan.micro_batch * plan.accumulation
        return Code(settings=(f"micro_batch = {plan.micro_batch}",), loop=(
            f"# Each batch is one optimizer step of {rows} rows ({plan.micro_batch} x {plan.accumulation} "
            "micro-batches).",
            "for batch in batches:",
            "    rows = len(next(iter(batch.values())))",
            "    starts = range(0, rows, micro_batch)",
            "    for start in starts:",
            "        micro = {k: v[start : start + micro_batch].to(device) for k, v in batch.items()}",
            "        FORWARD len(starts)",
            "    STEP",
        ))
    if plan.accumulation == 1:
        return Code(loop=(
            "# Each batch is one optimizer step.",
            "for batch in batches:",
            "    micro = {k: v.to(device) for k, v in batch.items()}",
            "    FORWARD accumulation",
            "    STEP",
        ))
    return Code(loop=(
        f"# Each batch is one micro-batch; {plan.accumulation} batches make one optimizer step.",
        "for index, batch in enumerate(batches):",
        "    micro = {k: v.to(device) for k, v in batch.items()}",
        "    FORWARD accumulation",
        "    if (index + 1) % accumulation == 0:",
        "        STEP",
    ))


def _micro_batch_script(plan: PlanLike) -> Accelerate:
    if plan.micro_batch is None:
        return Accelerate(script=Code(
            settings=("BATCH_SIZE = ...  # your batch's rows: memlab measured each batch whole (micro_batch=None)",),
            data={"batch_size": "BATCH_SIZE"},
        ))
    return Accelerate(script=Code(
        settings=(f"MICRO_BATCH = {plan.micro_batch}  # rows per GPU per micro-step (memlab's micro-batch)",),
        data={"batch_size": "MICRO_BATCH"},
    ))


def _micro_batch(target: str) -> Callable[[PlanLike], Fragment]:
    def fragment(plan: PlanLike) -> Fragment:
        rows = plan.micro_batch
        if target == "trainer":  # None: the Trainer's own per_device_train_batch_size stays
            return Keys({} if rows is None else {"per_device_train_batch_size": rows})
        if target == "deepspeed":
            return Keys({"train_micro_batch_size_per_gpu": "auto" if rows is None else rows})
        if target == "code":
            return _loop(plan)
        if target == "accelerate":
            return _micro_batch_script(plan)
        return Elsewhere()

    return fragment


def _accumulation(target: str) -> Callable[[PlanLike], Fragment]:
    def fragment(plan: PlanLike) -> Fragment:
        steps = plan.accumulation
        if target in ("trainer", "deepspeed"):
            return Keys({"gradient_accumulation_steps": steps})
        if target == "code":
            return Code(settings=(f"accumulation = {steps}",))
        if target == "accelerate":
            return Accelerate(**zero({"gradient_accumulation_steps": steps}),
                              script=Code(accelerator={"gradient_accumulation_steps": str(steps)}))
        return Elsewhere()

    return fragment


DECLARATIONS = (
    Lever(
        "micro_batch",
        None,
        help="rows per forward/backward: fewer rows, fewer activations; None means the whole batch",
        none_means="all of the batch's rows",
        split=True,
        technique=ACCUMULATION,
        from_arguments=lambda args: getattr(args, "per_device_train_batch_size", None),
        exports=per_target(_micro_batch),
    ),
    Lever(
        "accumulation",
        1,
        help="micro-batches per optimizer step: keeps the effective batch while micro-batches shrink; more steps",
        split=True,
        technique=ACCUMULATION,
        from_arguments=lambda args: getattr(args, "gradient_accumulation_steps", 1),
        exports=per_target(_accumulation),
    ),
)
"""The levers that cut the batch, ``micro_batch`` and ``accumulation`` (:data:`memlab.techniques.core.registry.REGISTRY`
gathers them).

Example:
    >>> [lever.name for lever in DECLARATIONS]
    ['micro_batch', 'accumulation']
"""
