"""``fp8``: torchao's float8 training on the model's linear layers (``convert_to_float8_training``), as accelerate's
``mixed_precision="fp8"`` with torchao (``AORecipeKwargs``) does it, and its declaration.

The layers converted are accelerate's: every ``nn.Linear`` whose two dimensions divide by 16, except the model's first
and last linear layers (kept for stability; a causal LM's head is the last). Tensorwise dynamic scaling, torchao's
default recipe. A trial swaps those layers for torchao's ``Float8Linear`` in place (each shares the original's weight
and bias) and swaps the original modules back when it is taken off, so the user's model is the same object tree after.

What float8 keeps in high precision, read from torchao as installed (:func:`saved_for_backward`): the weights, their
gradients and the optimizer state stay in their dtype; each converted layer saves its high-precision input and weight
for backward and casts them to float8 again there (``matmul_with_hp_or_float8_args``), so the float8 copies exist
only inside each matmul. Eagerly, then, float8 saves no activation memory by itself: what changes is autocast's, whose
bf16 copies of fp32 weights a ``Float8Linear`` does not make. Under ``torch.compile`` the partitioner may save the
float8 casts instead.

A live trial needs torchao and a CUDA GPU of compute capability 8.9 or newer (L4, RTX 4090, H100): elsewhere it is an
error trial that says so, as an unavailable attention kernel is. A dry run runs torchao's own ``Float8Linear`` on
fake tensors (its float8 casts and ``torch._scaled_mm`` have fake kernels); the GPU it answers for is judged by the
estimate (:data:`OLD_GPU_NOTE`).

Example:
    >>> [lever.name for lever in DECLARATIONS]
    ['fp8']
"""

from __future__ import annotations

import functools
import importlib.util
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from memlab.errors import UnsupportedTechnique
from memlab.techniques.core.fragments import Accelerate, Code, Elsewhere, nothing_for, per_target_but_peft
from memlab.techniques.core.lever import Lever, PlanLike
from memlab.techniques.core.technique import StepParts, Technique, Undo

if TYPE_CHECKING:  # annotations only
    from memlab.techniques.core.fragments import Export, Fragment

__all__ = ["DECLARATIONS", "FP8", "LEAST_CAPABILITY", "NEEDS", "OLD_GPU_NOTE", "Fp8", "converted_layers",
           "estimate_note", "fp8_conflicts", "saved_for_backward", "unavailable"]

LEAST_CAPABILITY = (8, 9)
"""The compute capability of the first GPUs with float8 matrix units (Ada: L4, RTX 4090; Hopper: H100 is 9.0)."""

NEEDS = ("torchao installed (pip install torchao) and a CUDA GPU of compute capability 8.9 or newer (an H100, L4 or "
         "RTX 4090-class GPU)")
"""What a float8 trial needs, as the refusals say it."""

OLD_GPU_NOTE = (
    "fp8: torchao's float8 training cannot run on {where}, which has no float8 matrix units (a live trial there is an "
    "error trial); estimated as the step would run on a GPU that has them (compute capability 8.9+: L4, RTX 4090, "
    "H100)"
)
"""The note of an estimate for a CPU or a GPU kind below :data:`LEAST_CAPABILITY` (``{where}``: which)."""


def estimate_note(plan: PlanLike, target: str, capability: tuple[int, int], gpu: str) -> str:
    """What an estimate of ``plan`` for ``target`` (a device type; on CUDA a GPU kind of ``capability``) says of
    float8: :data:`OLD_GPU_NOTE` where float8 cannot run there, else ``""``.

    Example:
        >>> from types import SimpleNamespace
        >>> estimate_note(SimpleNamespace(fp8=True), "cuda", (8, 0), "A100-80GB").split(",")[0]
        "fp8: torchao's float8 training cannot run on the A100-80GB (compute capability 8.0)"
        >>> estimate_note(SimpleNamespace(fp8=True), "cuda", (9, 0), "H100-80GB")
        ''
    """
    if not getattr(plan, "fp8", False) or (target == "cuda" and capability >= LEAST_CAPABILITY):
        return ""
    where = f"the {gpu} (compute capability {capability[0]}.{capability[1]})" if target == "cuda" else \
        f"the {target.upper()}"
    return OLD_GPU_NOTE.format(where=where)


def _torchao_problem() -> str:
    """Why torchao's float8 training cannot be imported here (``""`` when it can)."""
    if importlib.util.find_spec("torchao") is None:
        return "torchao is not installed"
    try:
        from torchao.float8 import convert_to_float8_training  # noqa: F401
    except Exception as error:  # torchao built for another torch raises more than ImportError
        return f"torchao.float8 does not import ({type(error).__name__}: {str(error).splitlines()[0][:160]})"
    return ""


def unavailable(device: torch.device, *, fake: bool = False) -> str:
    """Why float8 training cannot run on ``device`` here, saying what it needs; ``""`` when it can. A dry run
    (``fake``) needs torchao only: the GPU it answers for is the estimate's to judge, and no CUDA call is made.

    Example:
        >>> reason = unavailable(torch.device("cpu"))
        >>> "compute capability 8.9" in reason and "fp8=False" in reason
        True
    """
    problem = _torchao_problem()
    if not problem and (fake or device.type == "cuda"):
        if fake:
            return ""
        capability = torch.cuda.get_device_capability(device)
        if capability >= LEAST_CAPABILITY:
            return ""
        problem = (f"{torch.cuda.get_device_name(device)} has compute capability {capability[0]}.{capability[1]}, "
                   "without float8 matrix units")
    elif not problem:
        problem = f"the model is on {device.type}, and torchao's float8 matmuls run on CUDA GPUs only"
    return f"fp8 cannot run here: {problem}; it needs {NEEDS}. Write fp8=False, or run on such a GPU"


def _first_and_last_linear(model: nn.Module) -> tuple[str | None, str | None]:
    names = [name for name, module in model.named_modules() if isinstance(module, nn.Linear)]
    return (names[0], names[-1]) if names else (None, None)


def converted_layers(model: nn.Module) -> list[str]:
    """The names of the linear layers float8 training converts in ``model``: accelerate's default filter (both
    dimensions divisible by 16, neither the first nor the last linear layer).

    Example:
        >>> model = nn.Sequential(nn.Linear(16, 32), nn.Linear(32, 32), nn.Linear(32, 8), nn.Linear(8, 16))
        >>> converted_layers(model)
        ['1']
    """
    skipped = _first_and_last_linear(model)
    return [name for name, module in model.named_modules()
            if type(module) is nn.Linear and name not in skipped
            and module.in_features % 16 == 0 and module.out_features % 16 == 0]


@functools.cache
def saved_for_backward() -> tuple[torch.dtype, ...]:
    """The dtypes torchao's ``Float8Linear`` (as installed) saves for backward of a bf16 input and weight: what it
    keeps in high precision, read by running one on the meta device (no memory, no GPU).

    Example:
        >>> saved_for_backward()  # doctest: +SKIP
        (torch.bfloat16, torch.bfloat16)
    """
    from torchao.float8 import convert_to_float8_training

    saved: list[torch.dtype] = []

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        saved.append(tensor.dtype)
        return tensor

    with torch.device("meta"):
        layer = nn.Sequential(nn.Linear(16, 16, bias=False, dtype=torch.bfloat16))
        convert_to_float8_training(layer)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            layer(torch.empty(16, 16, dtype=torch.bfloat16, requires_grad=True))
    return tuple(saved)


def _cast_like_cuda_autocast(module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """A CUDA dry run on CPU kernels runs CPU autocast, which ``Float8Linear`` does not see (it asks CUDA's): the
    cast of its input to the autocast dtype it makes on a GPU, made here."""
    if torch.is_autocast_enabled("cpu") and not torch.is_autocast_enabled("cuda"):
        dtype = torch.get_autocast_dtype("cpu")
        return tuple(arg.to(dtype) if isinstance(arg, torch.Tensor) and arg.is_floating_point() else arg
                     for arg in args)
    return None


class Fp8(Technique):
    """``fp8=True``: torchao's ``Float8Linear`` swapped in for the converted linear layers (:func:`converted_layers`)
    for the trial, the original modules swapped back when it comes off.

    Example:
        >>> from memlab.plan import Plan
        >>> FP8.put_on(StepParts(nn.Linear(16, 16), Plan(), torch.device("cpu"))) is None
        True
    """

    def put_on(self, parts: StepParts) -> Undo | None:
        self._converted: list[str] = []
        if not getattr(parts.plan, "fp8", False):
            return None
        fake = _fake(parts)
        reason = unavailable(parts.device, fake=fake)
        if reason:
            raise UnsupportedTechnique(reason)
        model = parts.model
        if _sharded(model):
            raise UnsupportedTechnique(
                "fp8 on a sharded model is not modelled: torchao converts the linear layers before FSDP2 shards them, "
                "and this step's model is sharded already; estimate fp8 on one GPU (gpus=1), whose activations are "
                "one rank's, or write fp8=False")
        names = converted_layers(model)
        if not names:
            raise UnsupportedTechnique(
                f"fp8 converts linear layers whose dimensions divide by 16, other than the first and last; "
                f"{type(model).__name__} has none; write fp8=False")
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training

        chosen = set(names)
        originals = [(parent, child_name, child) for parent_name, parent in model.named_modules()
                     for child_name, child in parent.named_children()
                     if (f"{parent_name}.{child_name}" if parent_name else child_name) in chosen]
        hooks: list[Any] = []

        def undo() -> None:
            for hook in hooks:
                hook.remove()
            for parent, child_name, child in originals:
                setattr(parent, child_name, child)

        try:
            convert_to_float8_training(model, config=Float8LinearConfig(),
                                       module_filter_fn=lambda module, fqn: fqn in chosen)
            if fake and parts.device.type == "cpu":
                hooks.extend(getattr(parent, child_name).register_forward_pre_hook(_cast_like_cuda_autocast)
                             for parent, child_name, _ in originals)
            saved_for_backward()
        except BaseException:
            undo()
            raise
        self._converted = names
        return undo

    def notes(self, parts: StepParts) -> list[str]:
        converted = getattr(self, "_converted", [])
        if not converted or not getattr(parts.plan, "fp8", False):
            return []
        kept = [name for name in _first_and_last_linear(parts.model) if name]
        saved = ", ".join(sorted({str(dtype).removeprefix("torch.") for dtype in saved_for_backward()}))
        return [
            # no count of layers: a dry run carried from three layers to the model's depth says what three did
            f"fp8: torchao's Float8Linear (tensorwise dynamic scaling) on the linear layers but the first and last "
            f"({', '.join(dict.fromkeys(kept))}) and any not divisible by 16; kept in high "
            f"precision: the weights, their gradients and the optimizer state in their own dtype, and each converted "
            f"layer's input and weight saved for backward as they come ({saved} for a bf16 input), cast to float8 "
            "again in backward, so the float8 copies live only inside each matmul (under torch.compile the "
            "partitioner may save them instead)"
        ]

    def dry_run(self, parts: StepParts) -> list[str]:
        if not getattr(parts.plan, "fp8", False) or not getattr(self, "_converted", []):
            return []
        return ["fp8: estimated through torchao's own Float8Linear on fake tensors (its float8 casts and "
                "torch._scaled_mm's output as fake kernels give them; cuBLASLt's float8 workspace not modelled)"]


FP8 = Fp8()
"""The ``fp8`` lever's technique."""


def _sharded(model: nn.Module) -> bool:
    from torch.distributed.tensor import DTensor

    return any(isinstance(parameter, DTensor) for parameter in model.parameters())


def _fake(parts: StepParts) -> bool:
    """Whether the step is a dry run: fake weights, also inside a sharded dry run's DTensors (which
    :attr:`StepParts.fake` does not look into)."""
    from torch._subclasses.fake_tensor import is_fake

    return parts.fake or any(is_fake(parameter) for parameter in parts.model.parameters())


def fp8_conflicts(plan: PlanLike) -> str:
    """Why ``plan`` cannot train in float8 with its other settings (``""`` when it can).

    Example:
        >>> from types import SimpleNamespace
        >>> fp8_conflicts(SimpleNamespace(fp8=True, precision="fp16", weights="fp32", adapter="none"))[:40]
        "fp8 runs torchao's float8 matmuls beside"
    """
    if not plan.fp8:
        return ""
    if plan.precision != "bf16" and not (plan.precision == "fp32" and plan.weights == "bf16"):
        return ("fp8 runs torchao's float8 matmuls beside bf16 for the rest of the step (accelerate's "
                "mixed_precision='fp8' autocasts to bf16); write precision='bf16' with fp8=True")
    if plan.adapter != "none":
        return ("fp8 converts the model's trained linear layers, and an adapter's base layers are frozen inside peft's "
                "wrappers; write adapter='none' with fp8=True, or fp8=False")
    return ""


_CONVERT = (
    "# FP8: torchao's float8 training on the linear layers (needs a GPU of compute capability 8.9+: H100, L4, 4090);",
    "# the first and last linear layers and those not divisible by 16 stay in high precision, as accelerate keeps them",
    "_linear = [name for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)]",
    "convert_to_float8_training(",
    "    model,",
    "    config=Float8LinearConfig(),",
    "    module_filter_fn=lambda module, fqn: fqn not in (_linear[0], _linear[-1])",
    "    and module.in_features % 16 == 0 and module.out_features % 16 == 0,",
    ")",
)


def _export(target: str) -> Export:
    """What ``target``'s export writes for the lever: the conversion above (code, accelerate's script), the
    Trainer's keyword or where it goes instead."""

    def fragment(plan: PlanLike) -> Fragment:
        if not plan.fp8:
            return nothing_for(target)
        if target == "code":
            return Code(imports=("from torchao.float8 import Float8LinearConfig, convert_to_float8_training",),
                        model=_CONVERT)
        if target == "accelerate":  # mixed_precision itself is the precision lever's key ("fp8" where fp8 is on)
            return Accelerate(
                config={"fp8_config": {"backend": "AO", "enable_fsdp_float8_all_gather": True,
                                       "pad_inner_dim": True}},
                # accelerate refuses torchao's float8 with FSDP2's RAM-efficient loading
                fsdp2={"fsdp_cpu_ram_efficient_loading": False},
                script=Code(imports=("from accelerate.utils import AORecipeKwargs",),
                            accelerator={"kwargs_handlers": "[AORecipeKwargs()]"}))
        where = "TrainingArguments" if target == "trainer" else "a DeepSpeed config"
        return Elsewhere(f"fp8 is not a setting of {where}: launch with accelerate's mixed_precision='fp8' and "
                         "torchao (plan.to_accelerate_config(), AORecipeKwargs), or convert the model in your own loop "
                         "as plan.to_code() does (torchao's convert_to_float8_training)")

    return fragment


DECLARATIONS = (
    Lever(
        "fp8",
        False,
        short="fp8",
        help="torchao's float8 training on the linear layers (but the first and last): float8 matmuls, faster on "
        "an H100/L4/RTX 4090-class GPU (compute capability 8.9+, torchao installed); the weights, gradients, "
        "optimizer state and the inputs saved for backward stay in high precision, so it saves little memory by "
        "itself",
        technique=FP8,
        conflicts=fp8_conflicts,
        activation_key=lambda value: value,
        speed={True: (1.2, 1.0)},
        exports=per_target_but_peft(_export),
    ),
)
"""The lever's declaration (:data:`memlab.techniques.core.registry.REGISTRY` gathers it)."""

