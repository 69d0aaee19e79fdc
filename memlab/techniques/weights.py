"""Pure bf16 weights: the model's floating-point weights and buffers held in bf16, so that the trained weights, their
gradients and the optimizer state built on them are bf16 too (no fp32 master copy)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from memlab.live.structure import trainable_parameters, unique_parameters
from memlab.plan import Plan

Undo = Callable[[], None]


def cast_weights(model: nn.Module, plan: Plan) -> Undo | None:
    """Put the model's floating-point parameters and buffers in bf16 for ``plan.weights == "bf16"``.

    The returned function takes the model back to its own dtypes. Frozen weights and buffers come back bit-exact:
    their originals are kept (on CUDA in host memory, so that the device holds only the bf16 copy while the plan
    runs). Trained weights are cast back from bf16 and so keep what training did; a trial's snapshot puts their
    exact values back afterwards. Returns None when the plan keeps the model's dtypes.

    Example:
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
