"""Activation (gradient) checkpointing: keep fewer activations, recompute them in the backward pass; the lever's
declaration, what the search assumes of it (:func:`blocks_needed`) and what each export writes for it (the lines that
turn it on, :data:`CHECKPOINTING_CODE`, and those that checkpoint some blocks only)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch.utils.checkpoint
from torch import nn

from memlab.errors import MemlabError, UnsupportedTechnique
from memlab.live.compat import checkpoint_recomputations, checkpoint_traced
from memlab.live.structure import ModuleStructure
from memlab.techniques.core.fragments import Accelerate, Code, Elsewhere, Export, Fragment, Keys, per_target
from memlab.techniques.core.lever import Lever, PlanLike
from memlab.techniques.core.technique import StepParts, Technique, Undo

RECOMPUTE_CONTEXTS: list[Callable[[], contextlib.AbstractContextManager[Any]]] = []
r"""Factories of contexts the recomputation in backward runs under, besides autocast (which torch restores itself),
registered by :func:`recomputed_under`: a dry run for CUDA without CUDA puts its emulation of CUDA's kernels here
(``TorchFunctionMode``\ s are not active in backward). Empty, no recomputation is changed."""


def _under_recompute_contexts(function: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` run under fresh contexts of the factories registered now (as a checkpoint's forward runs), for
    its recomputation in backward; ``function`` itself where none are, or where ``torch.compile`` traces the
    checkpoint (its recomputation is traced with the forward, under the modes the forward ran in)."""
    factories = list(RECOMPUTE_CONTEXTS)
    if not factories or checkpoint_traced():
        return function

    def recompute(*args: Any, **kwargs: Any) -> Any:
        with contextlib.ExitStack() as stack:
            for factory in factories:
                stack.enter_context(factory())
            return function(*args, **kwargs)

    return recompute


@contextlib.contextmanager
def recomputed_under(*factories: Callable[[], contextlib.AbstractContextManager[Any]]) -> Iterator[None]:
    """``factories`` in :data:`RECOMPUTE_CONTEXTS` while active, and each ``torch.utils.checkpoint`` whose forward
    runs meanwhile recomputing in backward under a fresh context of each factory registered then: memlab's
    checkpointing and a model's own alike (a trainer's ``gradient_checkpointing``, which TRL's DPOTrainer turns off
    around its reference forward and back on with the trainer's keywords, replacing memlab's; a model that calls
    ``torch.utils.checkpoint`` itself), reentrant or not (:func:`memlab.live.compat.checkpoint_recomputations`).

    Example:
        >>> seen = []
        >>> @contextlib.contextmanager
        ... def watched():
        ...     seen.append("recompute")
        ...     yield
        >>> x = torch.ones(2, requires_grad=True)
        >>> with recomputed_under(watched):
        ...     y = torch.utils.checkpoint.checkpoint(torch.sin, x, use_reentrant=False)
        ...     y.sum().backward()
        >>> seen, RECOMPUTE_CONTEXTS
        (['recompute'], [])
    """
    hooked = bool(RECOMPUTE_CONTEXTS)  # an enclosing call has wrapped the recomputations already
    RECOMPUTE_CONTEXTS.extend(factories)
    try:
        with contextlib.nullcontext() if hooked else checkpoint_recomputations(_under_recompute_contexts):
            yield
    finally:
        for factory in factories:
            RECOMPUTE_CONTEXTS.remove(factory)


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
        kwargs = {"use_reentrant": False}
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

    def checkpointed_forward(*args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():
            return original(*args, **kwargs)
        return torch.utils.checkpoint.checkpoint(original, *args, use_reentrant=False, **kwargs)

    setattr(checkpointed_forward, _MEMLAB_MARK, True)
    # An instance attribute shadows the class's forward; restoring the captured state removes it again.
    block.forward = checkpointed_forward  # type: ignore[method-assign]


class Checkpointing(Technique):
    """``checkpointing``: on where the plan asks for it, and off where the model checkpoints by itself and the plan
    does not (the plan decides).

    Example:
        >>> from memlab.plan import Plan
        >>> from memlab.techniques.core.technique import StepParts
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


CHECKPOINTING_CODE = (
    "# Activation checkpointing: keep only each block's input, recompute the rest in backward",
    'if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5',
    '    model.activation_checkpointing_enable({"use_reentrant": False})',
    "else:",
    '    model.gradient_checkpointing_enable({"use_reentrant": False})',
)
"""The lines that turn a Hugging Face model's activation checkpointing on (the code, the ZeRO scripts)."""

_CHECKPOINTING_ELSEWHERE = (
    "activation checkpointing is the model's, not a DeepSpeed setting: pass TrainingArguments("
    "activation_checkpointing=True) (plan.to_training_arguments()), or call "
    'model.gradient_checkpointing_enable({"use_reentrant": False}) as plan.to_code() does'
)


_BLOCKS_IMPORT = "from transformers.modeling_layers import GradientCheckpointingLayer"


def _chosen_lines(blocks: int) -> tuple[str, ...]:
    """Code for the blocks ``checkpointing=blocks`` checkpoints (as
    :func:`memlab.techniques.checkpointing.chosen_blocks` chooses them): ``blocks`` and ``chosen``."""
    return (
        "blocks = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]",
        f"chosen = {{i * len(blocks) // {blocks} for i in range({blocks})}}  # the last one only when it is every one",
    )


def selective_checkpointing_code(blocks: int) -> Code:
    """The code lines that checkpoint ``blocks`` of a Hugging Face model's layers, spread evenly: the model's own
    switch, then its per-layer flag put back off on the layers not chosen.

    Example:
        >>> selective_checkpointing_code(4).model[-1]
        '    block.gradient_checkpointing = index in chosen'
    """
    return Code(imports=(_BLOCKS_IMPORT,), model=(
        *CHECKPOINTING_CODE,
        f"# ... on {blocks} of its layers only, spread evenly: the others keep their activations and run once",
        *_chosen_lines(blocks),
        "for index, block in enumerate(blocks):",
        "    block.gradient_checkpointing = index in chosen",
    ))


def _fsdp2_selective(blocks: int) -> Code:
    """FSDP2's ``fsdp_activation_checkpointing`` is all or nothing: ``blocks`` layers wrapped before
    ``accelerator.prepare`` with torch's ``apply_activation_checkpointing`` and a check function."""
    return Code(imports=(
        "from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import apply_activation_checkpointing",
        _BLOCKS_IMPORT,
    ), model=(
        f"# Activation checkpointing of {blocks} of the model's layers, spread evenly (non-reentrant)",
        *_chosen_lines(blocks),
        "checkpointed = [blocks[index] for index in sorted(chosen)]",
        "apply_activation_checkpointing(model, check_fn=lambda module: any(module is b for b in checkpointed))",
    ))


def _checkpointing(target: str) -> Export:
    def fragment(plan: PlanLike) -> Fragment:
        on = bool(plan.checkpointing)
        some = plan.checkpointing if on and plan.checkpointing is not True else 0
        if target == "trainer":  # transformers before 5 names it gradient_checkpointing
            if some:
                return (
                    f"checkpointing={some} blocks is not a TrainingArguments setting (its activation_checkpointing is "
                    "every block or none): export plan.replace(checkpointing=True), or keep checkpointing off in the "
                    "arguments and checkpoint the blocks on the model before Trainer(...) as plan.to_code() does"
                )
            keys = {"checkpointing": on, **({"checkpointing_kwargs": {"use_reentrant": False}} if on else {})}
            return Keys({f"activation_{key}": value for key, value in keys.items()},
                        legacy={f"gradient_{key}": value for key, value in keys.items()})
        if target == "deepspeed":
            return Elsewhere(_CHECKPOINTING_ELSEWHERE if on else "")
        if target == "code":
            return selective_checkpointing_code(some) if some else Code(model=CHECKPOINTING_CODE if on else ())
        if target == "accelerate":  # FSDP2 checkpoints from its config; DeepSpeed leaves it to the model
            script = selective_checkpointing_code(some) if some else Code(model=CHECKPOINTING_CODE if on else ())
            return Accelerate(fsdp2={"fsdp_activation_checkpointing": on and not some},
                              by_strategy={"zero2": script, "zero3": script,
                                           **({"fsdp2": _fsdp2_selective(some)} if some else {})})
        return Elsewhere()

    return fragment


def blocks_needed(mine: bool | int, theirs: bool | int) -> bool:
    """Whether checkpointing ``mine`` blocks keeps at least the activations of ``theirs`` (fewer blocks keep more).

    Example:
        >>> blocks_needed(False, 4), blocks_needed(4, 8), blocks_needed(8, 4), blocks_needed(True, 4)
        (True, True, False, False)
    """
    def count(value: bool | int) -> float:
        return float("inf") if value is True else float(value)

    return count(mine) <= count(theirs)


def trainer_checkpointing(args: Any) -> tuple[bool, dict[str, Any]]:
    """Whether a ``TrainingArguments`` checkpoints activations, and the keywords that go with it (5.x names first).

    Example:
        >>> from types import SimpleNamespace
        >>> trainer_checkpointing(SimpleNamespace(gradient_checkpointing=True, gradient_checkpointing_kwargs=None))
        (True, {})
        >>> trainer_checkpointing(SimpleNamespace())
        (False, {})
    """
    for name in ("activation_checkpointing", "gradient_checkpointing"):
        if getattr(args, name, False):
            kwargs = getattr(args, f"{name}_kwargs", None) or {}
            if not isinstance(kwargs, Mapping):
                raise MemlabError(f"{name}_kwargs={kwargs!r} is not a dict of keywords; write for example "
                                  f"{name}_kwargs={{'use_reentrant': False}}, or leave it out")
            return True, dict(kwargs)
    return False, {}


DECLARATIONS = (
    Lever(
        "checkpointing",
        False,
        short="ckpt",
        help="activation checkpointing: keeps fewer activations and recomputes them in backward (about 30% slower); "
             "a number checkpoints that many blocks, spread evenly (less recomputation)",
        technique=CHECKPOINTING,
        blocks=True,
        needs_at_least=blocks_needed,
        slower=((True, False),),
        activation_key=lambda value: "all" if value is True else value or "off",  # True == 1: never one key
        speed={True: (0.75, 0.75)},
        from_arguments=lambda args: trainer_checkpointing(args)[0],
        exports=per_target(_checkpointing),
    ),
)
"""The ``checkpointing`` lever (:data:`memlab.techniques.core.registry.REGISTRY` gathers it)."""
