"""The weights of an inference plan: cast to its dtype, linear layers quantized to int8 or NF4 (bitsandbytes), and
everything put back bit-exact afterwards.

Casting keeps each original tensor (on CUDA in host memory, so that the device holds only the cast copy) and puts
that same tensor back; quantizing replaces each target ``nn.Linear`` by a bitsandbytes layer built from a copy of
its weight, and the session's :class:`~memlab.live.structure.ModuleStructure` (or the returned undo) puts the
original
module back. The originals are never written to.

Example:
    >>> model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    >>> before = model[0].weight
    >>> undo = prepare_weights(model, InferencePlan(weights="bf16"))
    >>> model[0].weight.dtype
    torch.bfloat16
    >>> undo(); model[0].weight is before, model[0].weight.dtype
    (True, torch.float32)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from memlab.errors import MemlabError, UnsupportedTechnique
from memlab.live.device import model_device
from memlab.live.structure import ModuleStructure, unique_parameters
from memlab.plan import InferencePlan
from memlab.techniques.adapters import quantized_targets

__all__ = [
    "DTYPES",
    "HELD_AS_LOADED",
    "FakeQuantizedLinear",
    "cast_model",
    "check_quantizable",
    "prepare_weights",
    "quantization_tensors",
    "quantize_linears",
    "quantized_bytes",
]

Undo = Callable[[], None]

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
"""The torch dtype of each ``InferencePlan.weights``."""

_NF4_BLOCK = 64  # elements per NF4 block (one 8-bit absmax each)
_NF4_NESTED_BLOCK = 256  # absmaxes per block of the double quantization (one float32 each)
_NF4_FIXED_BYTES = 16 * 4 + 4 + 256 * 4  # the 16-value NF4 code, the absmax offset, the nested 256-value code


HELD_AS_LOADED = "memlab_held_as_loaded"
"""The attribute a dry run's load (:func:`memlab.estimation.dryrun.load.apply_load`) sets on the model it materialised:
its weights are held as that load gives them (a rotary ``inv_freq`` in fp32, quantization state in its dtypes), and no
plan casts them."""


def prepare_weights(model: nn.Module, plan: InferencePlan) -> Undo:
    """Put the plan's weights on the model: linear layers quantized (``plan.quantize``), then every floating-point
    parameter and buffer cast to ``plan.weights`` (but on a model a dry run's load made, :data:`HELD_AS_LOADED`).
    The returned function puts the original tensors and modules back.

    Example:
        >>> model = nn.Linear(2, 2)
        >>> prepare_weights(model, InferencePlan())()  # fp32, nothing quantized: nothing changes
    """
    undos: list[Undo] = []
    try:
        if plan.quantize != "none":
            undos.append(quantize_linears(model, plan.quantize, DTYPES[plan.weights]))
        if not getattr(model, HELD_AS_LOADED, False):
            undos.append(cast_model(model, DTYPES[plan.weights]))
    except BaseException:
        for undo in reversed(undos):
            undo()
        raise

    def undo_all() -> None:
        for undo in reversed(undos):
            undo()
        undos.clear()

    return undo_all


def cast_model(model: nn.Module, dtype: torch.dtype) -> Undo:
    """Hold every floating-point parameter and buffer of ``model`` in ``dtype``; the returned function puts each
    original tensor back (the same tensor: bit-exact, nothing copied on CPU).

    Example:
        >>> model = nn.Linear(2, 2)
        >>> undo = cast_model(model, torch.float16)
        >>> model.bias.dtype, (undo(), model.bias.dtype)[1]
        (torch.float16, torch.float32)
    """
    kept: list[tuple[torch.Tensor, torch.Tensor, torch.device]] = []
    state = {id(b) for m in model.modules() if getattr(m, "keeps_dtypes", False) for b in m.buffers(recurse=False)}
    buffers = [b for b in {id(b): b for b in model.buffers()}.values() if id(b) not in state]
    try:
        for tensor in [*unique_parameters(model), *buffers]:
            if not tensor.is_floating_point() or tensor.dtype == dtype:
                continue
            original = tensor.data
            saved = original if original.device.type in ("cpu", "meta") else original.to("cpu")
            kept.append((tensor, saved, original.device))
            tensor.data = original.to(dtype)
            del original
    except BaseException:
        _put_back(kept)
        raise

    def undo() -> None:
        _put_back(kept)

    return undo


def _put_back(kept: list[tuple[torch.Tensor, torch.Tensor, torch.device]]) -> None:
    for tensor, saved, device in reversed(kept):
        tensor.data = saved if saved.device == device else saved.to(device)
    kept.clear()


def check_quantizable(model: nn.Module, quantize: str) -> list[str]:
    """The linear layers ``quantize`` would replace: those a bitsandbytes load quantizes
    (:func:`memlab.techniques.adapters.quantized_targets`, transformers' own choice: every ``nn.Linear`` (exact ones
    under transformers 5) and GPT-2-style ``Conv1D`` but the output head); a clear error, before anything changes,
    where there are none (saying why, for Falcon's ``FalconLinear``) or
    bitsandbytes cannot run them.

    Example:
        >>> check_quantizable(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1)), "nf4")
        ['0']
        >>> check_quantizable(nn.Sequential(nn.Linear(4, 1)), "int8")
        Traceback (most recent call last):
        ...
        memlab.errors.UnsupportedTechnique: quantize='int8' quantizes linear layers, and this model has none \
besides its output; write quantize='none'
    """
    if quantize == "none":
        return []
    targets = quantized_targets(model)
    if not targets:
        raise UnsupportedTechnique(_nothing_to_quantize(model, quantize))
    for name in targets:
        layer: Any = model.get_submodule(name)
        if layer.weight.dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise UnsupportedTechnique(
                f"{name} holds {layer.weight.dtype} weights (already quantized?); quantize float weights only, or "
                "write quantize='none'"
            )
    return targets


def _nothing_to_quantize(model: nn.Module, quantize: str) -> str:
    """Why ``quantize`` finds no layer in ``model``: none but the output head, or (transformers 5) linear layers of a
    subclass of ``nn.Linear`` (Falcon's ``FalconLinear``), which transformers' bitsandbytes load leaves in full
    precision too, so that ``load_in_8bit`` of that model quantizes nothing."""
    kinds = sorted({type(m).__name__ for m in model.modules() if isinstance(m, nn.Linear) and type(m) is not nn.Linear})
    if kinds:
        return (
            f"quantize={quantize!r} quantizes what transformers' bitsandbytes load quantizes, and that replaces exact "
            f"nn.Linear (and Conv1D) layers only: {type(model).__name__}'s {', '.join(kinds)} layers stay in full "
            "precision (from_pretrained with a BitsAndBytesConfig quantizes nothing of this model); write "
            "quantize='none' (weights='bf16' holds half the weights' bytes)"
        )
    return (
        f"quantize={quantize!r} quantizes linear layers, and this model has none besides its output; write "
        "quantize='none'"
    )


def quantize_linears(model: nn.Module, quantize: str, compute_dtype: torch.dtype) -> Undo:
    """Replace the linear layers of :func:`check_quantizable` by bitsandbytes layers: ``"int8"``: ``Linear8bitLt``
    (int8 weights with a float32 scale per output row, no outlier threshold); ``"nf4"``: ``Linear4bit`` (4-bit
    NormalFloat in blocks of 64, their scales quantized again), computing in ``compute_dtype``. On a model of fake
    tensors (a dry run) each becomes a :class:`FakeQuantizedLinear` of the same byte layout. The returned function
    puts the original layers back.

    Example:
        >>> model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 2))
        >>> undo = quantize_linears(model, "nf4", torch.float32)
        >>> type(model[0]).__name__, (undo(), type(model[0]).__name__)[1]
        ('Linear4bit', 'Linear')
    """
    targets = check_quantizable(model, quantize)
    structure = ModuleStructure.capture(model)
    device = model_device(model)
    fake = device.type == "meta" or any(_is_fake(p) for p in model.parameters())
    try:
        for name in targets:
            original = model.get_submodule(name)
            if fake:
                replacement: nn.Module = FakeQuantizedLinear(original, quantize, compute_dtype)
            else:
                replacement = _bitsandbytes_linear(original, quantize, compute_dtype, device)
            parent_name, _, child = name.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            setattr(parent, child, replacement)
    except BaseException:
        structure.restore()
        raise
    return structure.restore




def _is_fake(tensor: torch.Tensor) -> bool:
    from torch._subclasses.fake_tensor import is_fake

    return bool(is_fake(tensor))


def _out_in(original: nn.Module) -> torch.Tensor:
    """The layer's weight as ``(out, in)``: an ``nn.Linear``'s, or a GPT-2-style ``Conv1D``'s transposed."""
    weight: Any = original.weight
    values: torch.Tensor = weight.data.detach()
    return values if isinstance(original, nn.Linear) else values.t()


def _bitsandbytes_linear(
    original: nn.Module, quantize: str, compute_dtype: torch.dtype, device: torch.device
) -> nn.Module:
    import bitsandbytes

    weight: Any
    values = _out_in(original).contiguous().clone()
    out_features, in_features = values.shape
    if quantize == "nf4":
        layer: Any = bitsandbytes.nn.Linear4bit(
            in_features, out_features, bias=False, compute_dtype=compute_dtype, quant_type="nf4", device="meta",
        )
        weight = bitsandbytes.nn.Params4bit(values, requires_grad=False, quant_type="nf4")
    else:
        layer = bitsandbytes.nn.Linear8bitLt(
            in_features, out_features, bias=False, has_fp16_weights=False, threshold=0.0, device="meta",
        )
        weight = bitsandbytes.nn.Int8Params(values, requires_grad=False, has_fp16_weights=False)
    layer.weight = weight.to(device)  # moving it quantizes it (bitsandbytes' Params4bit / Int8Params .to)
    layer.bias = original.bias  # the same bias, shared (cast with the rest)
    return layer


def quantization_tensors(model: nn.Module) -> list[torch.Tensor]:
    """Tensors that quantized weights keep beside their data (NF4 block scales and codes, int8 row scales, on the
    weight or, after a first forward, on the layer's ``state``): part of the parameters' memory, though neither
    parameters nor buffers. A tensor may come twice (the tracker counts each storage once).

    Example:
        >>> quantization_tensors(nn.Linear(2, 2))
        []
    """
    found: list[torch.Tensor] = []
    for parameter in unique_parameters(model):
        state = getattr(parameter, "quant_state", None)
        if state is not None:
            found.extend(_state_tensors(state))
        scales = getattr(parameter, "SCB", None)
        if isinstance(scales, torch.Tensor):
            found.append(scales)
    for module in model.modules():
        # Linear8bitLt moves its row scales from the weight to its ``state`` at the first forward.
        state = getattr(module, "state", None)
        if state is not None and type(module).__module__.startswith("bitsandbytes"):
            found.extend(value for value in vars(state).values() if isinstance(value, torch.Tensor))
    return found


def _state_tensors(state: Any, depth: int = 0) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []
    for value in vars(state).values():
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif depth < 2 and type(value).__name__ == "QuantState":
            found.extend(_state_tensors(value, depth + 1))
    return found


def quantized_bytes(numel: int, rows: int, quantize: str) -> int:
    """Bytes bitsandbytes holds for a ``rows`` x ``numel / rows`` weight quantized ``quantize``: NF4 packs two
    values a byte, with an 8-bit scale per block of 64 and a float32 scale per 256 of those, plus its codes; int8
    holds a byte a value and a float32 scale per row.

    Example:
        >>> quantized_bytes(4096 * 4096, 4096, "int8") / (4096 * 4096)
        1.0009765625
        >>> round(quantized_bytes(4096 * 4096, 4096, "nf4") / (4096 * 4096), 3)
        0.516
    """
    if quantize == "int8":
        return numel + 4 * rows
    if quantize == "nf4":
        blocks = math.ceil(numel / _NF4_BLOCK)
        return math.ceil(numel / 2) + blocks + 4 * math.ceil(blocks / _NF4_NESTED_BLOCK) + _NF4_FIXED_BYTES
    raise MemlabError(f"quantize={quantize!r} is not known; write one of none, int8, nf4")


class FakeQuantizedLinear(nn.Module):
    """A quantized linear layer for dry runs on fake tensors, where bitsandbytes cannot run: it holds bitsandbytes'
    bytes (:func:`quantized_bytes`) as one uint8 buffer, and its forward makes the full weight in the compute dtype
    for the matrix product, as bitsandbytes does on CPU.

    Example:
        >>> layer = FakeQuantizedLinear(nn.Linear(64, 32), "int8", torch.float32)
        >>> layer.packed.numel(), tuple(layer(torch.ones(2, 64)).shape)
        (2176, (2, 32))
    """

    packed: torch.Tensor

    def __init__(self, original: nn.Module, quantize: str, compute_dtype: torch.dtype) -> None:
        super().__init__()
        weight: Any = original.weight
        self.out_features, self.in_features = _out_in(original).shape
        self.compute_dtype = compute_dtype
        size = quantized_bytes(weight.numel(), self.out_features, quantize)
        self.register_buffer("packed", torch.empty(size, dtype=torch.uint8, device=weight.device))
        self.bias: Any = original.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = torch.empty(
            (self.out_features, self.in_features), dtype=self.compute_dtype, device=self.packed.device
        )
        return nn.functional.linear(x.to(self.compute_dtype), weight, self.bias)
