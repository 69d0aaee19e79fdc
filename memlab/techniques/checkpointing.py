"""Activation (gradient) checkpointing: keep fewer activations, recompute them in the backward pass."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch.utils.checkpoint
from torch import nn

from memlab.errors import UnsupportedTechnique
from memlab.live.structure import ModuleStructure
from memlab.techniques.technique import StepParts, Technique, Undo

RECOMPUTE_CONTEXTS: list[Callable[[], contextlib.AbstractContextManager[Any]]] = []
r"""Factories of contexts the recomputation in backward runs under, besides autocast (which torch restores itself):
a dry run for CUDA without CUDA puts its emulation of CUDA's kernels here (``TorchFunctionMode``\ s are not active
in backward). Read when checkpointing is turned on; empty, checkpointing passes torch nothing more."""


def _contexts() -> tuple[contextlib.AbstractContextManager[Any], contextlib.AbstractContextManager[Any]]:
    """``torch.utils.checkpoint``'s ``context_fn``: nothing around the forward, the registered contexts around the
    recomputation."""
    stack = contextlib.ExitStack()
    factories = list(RECOMPUTE_CONTEXTS)

    @contextlib.contextmanager
    def recompute() -> Any:
        with stack:
            for factory in factories:
                stack.enter_context(factory())
            yield

    return contextlib.nullcontext(), recompute()


def _checkpoint_kwargs() -> dict[str, Any]:
    return {"use_reentrant": False, **({"context_fn": _contexts} if RECOMPUTE_CONTEXTS else {})}


def enable_checkpointing(model: nn.Module) -> Undo:
    """Turn checkpointing on; the returned function puts the model's previous setting back exactly.

    Hugging Face models go through their own switch (``activation_checkpointing_enable``, the successor of
    ``gradient_checkpointing_enable``) with ``use_reentrant=False``; any other module gets its repeated blocks
    (see :func:`repeated_blocks`) wrapped in non-reentrant ``torch.utils.checkpoint``.

    Example:
        >>> model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
        >>> undo = enable_checkpointing(model)
        >>> is_checkpointing(model)
        True
        >>> undo(); is_checkpointing(model)
        False
    """
    # The Hugging Face switch also adds an input-embedding hook that its "disable" leaves behind, so undo
    # restores the captured per-module state instead of calling "disable".
    before = ModuleStructure.capture(model)
    if _is_hugging_face(model):
        kwargs = _checkpoint_kwargs()
        switch = getattr(model, "activation_checkpointing_enable", None)
        if switch is not None:
            switch(activation_checkpointing_kwargs=kwargs)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)  # type: ignore[operator]
    else:
        for block in repeated_blocks(model):
            _wrap_forward(block)
    return before.restore


def disable_checkpointing(model: nn.Module) -> Undo:
    """Turn checkpointing off where the model already has it on (a plan without it must run without it).

    Example:
        >>> model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
        >>> undo_on = enable_checkpointing(model)
        >>> undo_off = disable_checkpointing(model)
        >>> is_checkpointing(model)
        False
        >>> undo_off(); is_checkpointing(model)
        True
    """
    before = ModuleStructure.capture(model)
    for module in model.modules():
        if getattr(module.__dict__.get("forward"), _MEMLAB_MARK, False):
            del module.__dict__["forward"]
        if getattr(module, "gradient_checkpointing", False) is True:
            module.__dict__["gradient_checkpointing"] = False
    return before.restore


def is_checkpointing(model: nn.Module) -> bool:
    """Whether any block of the model is checkpointed (by Hugging Face's switch or by memlab's wrapper)."""
    return any(
        getattr(module, "gradient_checkpointing", False) is True
        or getattr(module.__dict__.get("forward"), _MEMLAB_MARK, False)
        for module in model.modules()
    )


def _is_hugging_face(model: nn.Module) -> bool:
    return bool(getattr(model, "supports_gradient_checkpointing", False)) and hasattr(
        model, "gradient_checkpointing_enable"
    )


def repeated_blocks(model: nn.Module) -> list[nn.Module]:
    """The blocks to checkpoint: the children of the ``nn.ModuleList``/``nn.Sequential`` that holds the most
    parameters in blocks of their own (children with submodules), so that a transformer's layer list wins over
    the small ``Sequential`` inside each layer; containers of single layers are used only when there is no other.

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

    def block_parameters(container: nn.Module) -> int:
        blocks = [child for child in container.children() if any(True for _ in child.children())]
        return sum(p.numel() for block in blocks for p in block.parameters()) if len(blocks) > 1 else 0

    def size(container: nn.Module) -> tuple[int, int, int]:
        every_parameter = sum(p.numel() for p in container.parameters())
        return block_parameters(container), every_parameter, len(list(container.children()))

    return list(max(containers, key=size).children())


_MEMLAB_MARK = "_memlab_checkpointed"


def _wrap_forward(block: nn.Module) -> None:
    original = block.forward
    options = _checkpoint_kwargs()

    def checkpointed_forward(*args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():
            return original(*args, **kwargs)
        return torch.utils.checkpoint.checkpoint(original, *args, **options, **kwargs)

    setattr(checkpointed_forward, _MEMLAB_MARK, True)
    # An instance attribute shadows the class's forward; restoring the captured state removes it again.
    block.forward = checkpointed_forward  # type: ignore[method-assign]


class Checkpointing(Technique):
    """``checkpointing``: on where the plan asks for it, and off where the model checkpoints by itself and the plan
    does not (the plan decides).

    Example:
        >>> from memlab.plan import Plan
        >>> from memlab.techniques.technique import StepParts
        >>> model = nn.Sequential(*[nn.Linear(2, 2) for _ in range(3)])
        >>> undo = CHECKPOINTING.put_on(StepParts(model, Plan(checkpointing=True), torch.device("cpu")))
        >>> is_checkpointing(model)
        True
        >>> undo(); is_checkpointing(model)
        False
    """

    def put_on(self, parts: StepParts) -> Undo | None:
        if parts.plan.checkpointing:
            return enable_checkpointing(parts.model)
        if is_checkpointing(parts.model):
            return disable_checkpointing(parts.model)
        return None


CHECKPOINTING = Checkpointing()
