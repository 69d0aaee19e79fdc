"""Activation (gradient) checkpointing: keep fewer activations, recompute them in the backward pass."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch.utils.checkpoint
from torch import nn

from memlab.errors import MemlabError, UnsupportedTechnique
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


def enable_checkpointing(model: nn.Module, blocks: bool | int = True) -> Undo:
    """Turn checkpointing on (``blocks``: True for every repeated block, or how many, spread evenly as
    :func:`chosen_blocks` says); the returned function puts the model's previous setting back exactly.

    Hugging Face models go through their own switch (``activation_checkpointing_enable``, the successor of
    ``gradient_checkpointing_enable``) with ``use_reentrant=False``; the switch's flag (``gradient_checkpointing``,
    which transformers' ``GradientCheckpointingLayer`` reads) is then set on the chosen layers and off on the others,
    whichever layers the switch itself picked (an override of it may pick every n-th). Any other module (and a Hugging
    Face model without such layers) gets its chosen repeated blocks (see :func:`checkpoint_blocks`) wrapped in
    non-reentrant ``torch.utils.checkpoint``.

    Example:
        >>> model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
        >>> undo = enable_checkpointing(model)
        >>> is_checkpointing(model)
        True
        >>> undo(); is_checkpointing(model)
        False
        >>> undo = enable_checkpointing(model, 2); checkpointed_blocks(model)
        [0, 1]
    """
    # The Hugging Face switch also adds an input-embedding hook that its "disable" leaves behind, so undo
    # restores the captured per-module state instead of calling "disable".
    every = checkpoint_blocks(model)
    chosen = set(chosen_blocks(len(every), blocks, type(model).__name__))
    if len(chosen) == len(every):
        blocks = True  # every block: the same plan as True, put on the same way
    before = ModuleStructure.capture(model)
    if _is_hugging_face(model) and (blocks is True or _flagged_layers(model)):
        kwargs = _checkpoint_kwargs()
        switch = getattr(model, "activation_checkpointing_enable", None)
        if switch is not None:
            switch(activation_checkpointing_kwargs=kwargs)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)  # type: ignore[operator]
        # The plan's blocks, whichever the switch chose (an override of it may pick its own, every n-th layer)
        for index, layer in enumerate(_flagged_layers(model)):
            layer.__dict__["gradient_checkpointing"] = index in chosen
    else:
        for index, block in enumerate(every):
            if index in chosen:
                _wrap_forward(block)
    return before.restore


def chosen_blocks(count: int, blocks: bool | int, model: str = "the model") -> list[int]:
    """Which of ``count`` repeated blocks ``checkpointing=blocks`` checkpoints: every one for True or for ``count``
    itself (the same plan), none for False, else ``k`` spread evenly from the first: the first block of each of ``k``
    equal runs, ``i * count // k`` for ``i < k`` (torchtune's "every n-th layer" when ``k`` divides ``count``). A
    number above ``count`` is refused (``model`` names whose blocks they are), with what to write instead.

    The last block is chosen only when every block is: backward starts with it, so recomputing it there holds its
    activations at the step's peak anyway, and checkpointing it would cost time and save nothing.

    Example:
        >>> chosen_blocks(8, 2), chosen_blocks(8, 3), chosen_blocks(4, True), chosen_blocks(4, 4), chosen_blocks(4, 0)
        ([0, 4], [0, 2, 5], [0, 1, 2, 3], [0, 1, 2, 3], [])
        >>> chosen_blocks(4, 5, "LlamaForCausalLM")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        memlab.errors.MemlabError: checkpointing=5, but LlamaForCausalLM has 4 blocks to checkpoint; write ...
    """
    if blocks is True:
        return list(range(count))
    if blocks > count:
        raise MemlabError(
            f"checkpointing={blocks}, but {model} has {count} block{'' if count == 1 else 's'} to checkpoint; write "
            f"checkpointing=True (every block) or a number of blocks from 1 to {count}"
        )
    if blocks == count:
        return list(range(count))
    return [i * count // blocks for i in range(int(blocks))]


def checkpoint_blocks(model: nn.Module) -> list[nn.Module]:
    """The blocks ``checkpointing=k`` counts, in the model's order: a Hugging Face model's decoder (or encoder)
    layers, the layers of transformers' ``GradientCheckpointingLayer`` class; else :func:`repeated_blocks`.

    Example:
        >>> len(checkpoint_blocks(nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2), nn.Linear(2, 2))))
        3
    """
    return _flagged_layers(model) or repeated_blocks(model)


def checkpointed_blocks(model: nn.Module) -> list[int]:
    """The indices, among :func:`checkpoint_blocks`, of the blocks checkpointed now.

    Example:
        >>> checkpointed_blocks(nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2)))
        []
    """
    return [index for index, block in enumerate(checkpoint_blocks(model))
            if getattr(block, "gradient_checkpointing", False) is True
            or getattr(block.__dict__.get("forward"), _MEMLAB_MARK, False)]


def _flagged_layers(model: nn.Module) -> list[nn.Module]:
    """transformers' checkpointable layers (they read their own ``gradient_checkpointing`` flag)."""
    try:
        from transformers.modeling_layers import GradientCheckpointingLayer
    except ImportError:  # transformers before 4.52, or none: memlab wraps the blocks itself
        return []
    return [module for module in model.modules() if isinstance(module, GradientCheckpointingLayer)]


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

    def notes(self, parts: StepParts) -> list[str]:
        blocks = parts.plan.checkpointing
        if blocks is True or not blocks:
            return []
        count = len(checkpoint_blocks(parts.model))
        chosen = chosen_blocks(count, blocks, type(parts.model).__name__)
        if len(chosen) == count:
            return [f"checkpointing {count} of {count} blocks (every block)"]
        which = f"block {chosen[0]}" if len(chosen) == 1 else f"blocks {', '.join(map(str, chosen))}"
        return [f"checkpointing {len(chosen)} of {count} blocks ({which})"]

    def put_on(self, parts: StepParts) -> Undo | None:
        if parts.plan.checkpointing:
            return enable_checkpointing(parts.model, parts.plan.checkpointing)
        if is_checkpointing(parts.model):
            return disable_checkpointing(parts.model)
        return None


CHECKPOINTING = Checkpointing()
