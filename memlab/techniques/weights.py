"""Pure bf16 weights: the model's floating-point weights and buffers held in bf16, so that the trained weights, their
gradients and the optimizer state built on them are bf16 too (no fp32 master copy)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from memlab.live.structure import trainable_parameters, unique_parameters
from memlab.techniques.technique import StepParts, Technique

if TYPE_CHECKING:
    from memlab.plan import Plan

from memlab.techniques.technique import Undo


def cast_weights(model: nn.Module, plan: Plan) -> Undo | None:
    """Put the model's floating-point parameters and buffers in bf16 for ``plan.weights == "bf16"``.

    The returned function takes the model back to its own dtypes. Frozen weights and buffers come back bit-exact:
    their originals are kept (on CUDA in host memory, so that the device holds only the bf16 copy while the plan
    runs). Trained weights are cast back from bf16 and so keep what training did; a trial's snapshot puts their
    exact values back afterwards. Returns None when the plan keeps the model's dtypes.

    Example:
        >>> from memlab.plan import Plan
        >>> model = nn.Linear(4, 2)
        >>> undo = cast_weights(model, Plan(weights="bf16"))
        >>> model.weight.dtype
        torch.bfloat16
        >>> undo(); model.weight.dtype
        torch.float32
    """
    if plan.weights != "bf16":
        return None
    trained = {id(p) for p in trainable_parameters(model)}
    kept: list[tuple[torch.Tensor, torch.dtype, torch.device, torch.Tensor | None]] = []
    for tensor in [*unique_parameters(model), *_unique_buffers(model)]:
        if not tensor.is_floating_point() or tensor.dtype == torch.bfloat16:
            continue
        original = tensor.data
        if id(tensor) in trained:
            saved = None
        elif original.device.type == "cpu":
            saved = original
        else:
            saved = original.to("cpu")
        kept.append((tensor, original.dtype, original.device, saved))
        tensor.data = original.to(torch.bfloat16)
        del original

    def undo() -> None:
        for tensor, dtype, device, saved in kept:
            tensor.data = saved.to(device) if saved is not None else tensor.data.to(dtype)
        kept.clear()

    return undo


def _unique_buffers(model: nn.Module) -> list[torch.Tensor]:
    return list({id(b): b for b in model.buffers()}.values())


def model_weights(plan: Plan, parameters: list[nn.Parameter]) -> str | None:
    """``"bf16"`` or ``"fp16"`` when the plan keeps the model's dtypes and the model's trained weights are all
    held in that dtype (loaded so); None otherwise.

    Example:
        >>> from memlab.plan import Plan
        >>> model_weights(Plan(), [nn.Parameter(torch.zeros(2, dtype=torch.bfloat16))])
        'bf16'
    """
    if plan.weights != "fp32" or plan.adapter != "none" or not parameters:
        return None
    for dtype, name in ((torch.bfloat16, "bf16"), (torch.float16, "fp16")):
        if all(p.dtype == dtype for p in parameters):
            return name
    return None


def as_bf16(tensor: torch.Tensor) -> torch.Tensor:
    """A floating-point input in bf16 (pure bf16 computes in bf16 throughout); other tensors as they are.

    Example:
        >>> as_bf16(torch.ones(1)).dtype, as_bf16(torch.ones(1, dtype=torch.long)).dtype
        (torch.bfloat16, torch.int64)
    """
    return tensor.to(torch.bfloat16) if tensor.is_floating_point() else tensor


class Weights(Technique):
    """``weights``: pure bf16 weights (:func:`cast_weights`), float inputs in bf16; a note where the model is
    already held in bf16 and the plan keeps its dtypes (it trains pure bf16 anyway).

    Example:
        >>> from memlab.plan import Plan
        >>> from memlab.techniques.technique import StepParts
        >>> parts = StepParts(nn.Linear(2, 2).to(torch.bfloat16), Plan(), torch.device("cpu"))
        >>> WEIGHTS.notes(parts)[0].split(":")[0]
        "the model's weights are bf16 (loaded in bf16)"
    """

    def put_on(self, parts: StepParts) -> Undo | None:
        undo = cast_weights(parts.model, parts.plan)
        if parts.plan.weights == "bf16":
            parts.input_casts.append(as_bf16)
        return undo

    def notes(self, parts: StepParts) -> list[str]:
        if model_weights(parts.plan, parts.parameters) == "bf16":
            return ["the model's weights are bf16 (loaded in bf16): this trains pure bf16, as weights='bf16' does"]
        return []


WEIGHTS = Weights()
