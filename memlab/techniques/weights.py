"""Pure bf16 weights: the model's floating-point weights and buffers held in bf16, so that the trained weights, their
gradients and the optimizer state built on them are bf16 too (no fp32 master copy); the lever's declaration and
exports."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar

import torch
from torch import nn
from torch._subclasses.fake_tensor import is_fake

from memlab.live.structure import trainable_parameters, unique_parameters
from memlab.techniques.core.fragments import Accelerate, Code, Elsewhere, Export, Fragment, Keys, per_target
from memlab.techniques.core.lever import Lever, PlanLike
from memlab.techniques.core.technique import PlanFields, StepParts, Technique, Undo

WEIGHT_DTYPES = ("fp32", "bf16")
"""Every ``weights`` value (its choices), which other modules ask instead of spelling them."""

_MODELLED_RELEASE: ContextVar[Callable[[], None] | None] = ContextVar("memlab_modelled_release", default=None)


@contextlib.contextmanager
def modelled_release(release: Callable[[], None]) -> Iterator[None]:
    """Within the block, where the cast gives the caching allocator's cache back on a dry run's fake tensors,
    ``release`` is called instead (a model of the allocator's ``empty_cache``): no real CUDA call is made.

    Example:
        >>> from memlab.plan import Plan
        >>> from memlab.estimation.dryrun.fake import FakeMode, fake_copy
        >>> mode, said = FakeMode(), []
        >>> model = fake_copy(nn.Linear(4, 2), mode, torch.device("cpu"))
        >>> with modelled_release(lambda: said.append("empty_cache")), mode:
        ...     cast_weights(model, Plan(weights="bf16"))()
        >>> said
        ['empty_cache', 'empty_cache', 'empty_cache']
    """
    token = _MODELLED_RELEASE.set(release)
    try:
        yield
    finally:
        _MODELLED_RELEASE.reset(token)


def release_cache(tensor: torch.Tensor) -> None:
    """Give back the caching allocator's segments that hold no tensor (``torch.cuda.empty_cache``) where ``tensor``
    is a live CUDA tensor; where a model of the allocator follows the tensors (:func:`modelled_release`: a dry run),
    tell it instead and call nothing of CUDA; elsewhere nothing.

    Example:
        >>> release_cache(torch.zeros(1))  # a CPU tensor: nothing to give back
    """
    release = _MODELLED_RELEASE.get()
    if release is not None:  # a model of the allocator follows these tensors: it is told, CUDA is not called
        release()
        return
    if tensor.device.type == "cuda" and not is_fake(tensor) and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def cast_weights(model: nn.Module, plan: PlanFields) -> Undo | None:
    """Put the model's floating-point parameters and buffers in bf16 for ``plan.weights == "bf16"``.

    The returned function takes the model back to its own dtypes. Frozen weights and buffers come back bit-exact:
    their originals are kept (on CUDA in host memory, so that the device holds only the bf16 copy while the plan
    runs). Trained weights are cast back from bf16 and so keep what training did; a trial's snapshot puts their
    exact values back afterwards. Returns None when the plan keeps the model's dtypes.

    On CUDA the cast gives the caching allocator's cache back when it is done (:func:`release_cache`): the freed
    originals' segments would otherwise stay reserved beside the step's, as they do after a user's own in-place
    cast. Taking it off gives the cache back before the copies of the original dtype are made (the step's cached
    blocks, half their size, cannot hold them: the card would grow past the step's peak) and after.

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
    if kept:
        release_cache(kept[0][0])

    def undo() -> None:
        if not kept:
            return
        first = kept[0][0]
        release_cache(first)
        for tensor, dtype, device, saved in kept:
            tensor.data = saved.to(device) if saved is not None else tensor.data.to(dtype)
        kept.clear()
        release_cache(first)

    return undo


def _unique_buffers(model: nn.Module) -> list[torch.Tensor]:
    return list({id(b): b for b in model.buffers()}.values())


def model_weights(plan: PlanFields, parameters: list[nn.Parameter]) -> str | None:
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
        >>> from memlab.techniques.core.technique import StepParts
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


def _pure_bf16_elsewhere(target: str, instead: str) -> Export:
    def refusal(plan: PlanLike) -> Fragment:
        if plan.weights != "bf16":
            return Keys()
        return (
            f"weights='bf16' (pure bf16, no fp32 master copy) is not {target}: load the model in bf16 "
            f"(from_pretrained(name, dtype=torch.bfloat16)) and export plan.replace(weights='fp32'), or use {instead}"
        )

    return refusal


def _weights(target: str) -> Export:
    pure = "torch.bfloat16" if target != "peft" else ""

    def fragment(plan: PlanLike) -> Fragment:
        bf16 = plan.weights == "bf16"
        if target == "code":
            return Code(model=("# Pure bf16: weights, gradients and optimizer state in bf16 (no fp32 master copy)",
                               f"model = model.to({pure})") if bf16 else ())
        if target == "accelerate":
            return Accelerate(script=Code(load={"dtype": pure if bf16 else "torch.float32"}))
        return Elsewhere()

    if target == "trainer":
        return _pure_bf16_elsewhere("a TrainingArguments setting", "plan.to_code()")
    if target == "deepspeed":
        return _pure_bf16_elsewhere("a DeepSpeed setting (its bf16 mode keeps fp32 master weights)", "plan.to_code()")
    return fragment


def weights_of(model: nn.Module) -> str | None:
    """``"bf16"`` where every trained parameter of ``model`` is bf16 (pure bf16 training), else None.

    Example:
        >>> weights_of(nn.Linear(2, 2).to(torch.bfloat16)), weights_of(nn.Linear(2, 2))
        ('bf16', None)
    """
    trained = [p for p in model.parameters() if p.requires_grad]
    return "bf16" if trained and all(p.dtype == torch.bfloat16 for p in trained) else None


DECLARATIONS = (
    Lever(
        "weights",
        "fp32",
        short="{}-weights",
        choices=WEIGHT_DTYPES,
        help="dtype of the trained weights, their grads and optimizer state: bf16 halves all three (pure bf16, no "
        "fp32 master copy); updates are less exact",
        technique=WEIGHTS,
        family=True,
        activation_key=lambda value: value,
        least_params={"bf16": 0.5},
        least_trained={"bf16": 0.5},
        speed={"bf16": (1.6, 1.0)},
        suggest=("bf16",),
        from_model=weights_of,
        exports=per_target(_weights),
    ),
)
"""The ``weights`` lever (:data:`memlab.techniques.core.registry.REGISTRY` gathers it)."""
