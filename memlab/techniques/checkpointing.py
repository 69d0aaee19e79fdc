"""Activation (gradient) checkpointing: keep fewer activations, recompute them in the backward pass."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch.utils.checkpoint
from torch import nn

from memlab.errors import UnsupportedTechnique
from memlab.module_state import ModuleStructure

Undo = Callable[[], None]


def enable_checkpointing(model: nn.Module) -> Undo:
    """Turn checkpointing on; the returned function puts the model's previous setting back exactly.

    Hugging Face models go through their own switch (``activation_checkpointing_enable``, the successor of
    ``gradient_checkpointing_enable``) with ``use_reentrant=False``; any other module gets the blocks of its largest
    ``ModuleList``/``Sequential`` wrapped in non-reentrant ``torch.utils.checkpoint``.

    Example:
        >>> model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
        >>> undo = enable_checkpointing(model)
        >>> undo()
    """
    # The Hugging Face switch also adds an input-embedding hook that its "disable" leaves behind, so undo
    # restores the captured per-module state instead of calling "disable".
    before = ModuleStructure.capture(model)
    if _is_hugging_face(model):
        kwargs = {"use_reentrant": False}
        switch = getattr(model, "activation_checkpointing_enable", None)
        if switch is not None:
            switch(activation_checkpointing_kwargs=kwargs)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)  # type: ignore[operator]
    else:
        for block in repeated_blocks(model):
            _wrap_forward(block)
    return before.restore


def _is_hugging_face(model: nn.Module) -> bool:
    return bool(getattr(model, "supports_gradient_checkpointing", False)) and hasattr(
        model, "gradient_checkpointing_enable"
    )


def repeated_blocks(model: nn.Module) -> list[nn.Module]:
    """The children of the model's largest ``nn.ModuleList``/``nn.Sequential`` (by count, then by parameters).

    Example:
        >>> len(repeated_blocks(nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))))
        2
    """
    containers = [m for m in model.modules() if isinstance(m, (nn.ModuleList, nn.Sequential)) and len(m) > 1]
    if not containers:
        raise UnsupportedTechnique(
            f"checkpointing found no repeated blocks in {type(model).__name__}; put its layers in an "
            "nn.ModuleList or nn.Sequential, or use a Hugging Face model"
        )

    def size(container: nn.Module) -> tuple[int, int]:
        return len(list(container.children())), sum(p.numel() for p in container.parameters())

    return list(max(containers, key=size).children())


def _wrap_forward(block: nn.Module) -> None:
    original = block.forward

    def checkpointed_forward(*args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():
            return original(*args, **kwargs)
        return torch.utils.checkpoint.checkpoint(original, *args, use_reentrant=False, **kwargs)

    # An instance attribute shadows the class's forward; restoring the captured state removes it again.
    block.forward = checkpointed_forward  # type: ignore[method-assign]
