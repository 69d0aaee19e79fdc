"""The declarations of the levers that cut the batch: ``micro_batch`` and ``accumulation`` (see
:mod:`memlab.techniques.accumulation` for the technique, :mod:`memlab.techniques.lever` for the facets).

Example:
    >>> [lever.name for lever in DECLARATIONS]
    ['micro_batch', 'accumulation']
"""

from __future__ import annotations

from collections.abc import Callable

from memlab.techniques.accumulation import ACCUMULATION
from memlab.techniques.fragments import Accelerate, Code, Elsewhere, Fragment, Keys, per_target, zero
from memlab.techniques.lever import Lever, PlanLike


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
        exports=per_target(_micro_batch),
    ),
    Lever(
        "accumulation",
        1,
        help="micro-batches per optimizer step: keeps the effective batch while micro-batches shrink; more steps",
        split=True,
        technique=ACCUMULATION,
        exports=per_target(_accumulation),
    ),
)
