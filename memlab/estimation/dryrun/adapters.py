"""LoRA and QLoRA on a model of fake tensors, for dry runs.

peft builds its adapters with ``Module.to``, which cannot move parameters between fake tensors, and bitsandbytes'
4-bit weights cannot be fake tensors at all. So the adapters are built outside the fake mode on the fake model (they
are small) and then made fake; and for QLoRA each target layer is first replaced by :class:`FakeNF4Linear`, which
holds the bytes an NF4 weight takes (packed 4-bit values and their block scales) and dequantizes into a temporary
in forward and again in backward, as bitsandbytes' kernels do. What the 4-bit matmul keeps for backward follows the
bitsandbytes version (:func:`four_bit_keeps_inputs`): the installed one, or the one :func:`modelled_bitsandbytes`
names.
"""

from __future__ import annotations

import contextlib
import functools
import math
import threading
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from importlib import metadata
from typing import Any

import torch
from packaging.version import InvalidVersion, Version
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode, unset_fake_temporarily

from memlab.live.patching import patched
from memlab.live.structure import ModuleStructure
from memlab.plan import Plan
from memlab.techniques.adapters import attach_adapter, compute_dtype, qlora_targets

Undo = Callable[[], None]

NF4_BLOCK = 64
"""Values per block scale of bitsandbytes' 4-bit quantization (``Params4bit``'s default blocksize)."""
NESTED_BLOCK = 256
"""Block scales per second-level scale (``compress_statistics=True``, bitsandbytes' default)."""

INPUTS_FREED_IN = "0.43.2"
"""The bitsandbytes release whose ``MatMul4Bit`` stopped keeping its input for backward (its changelog: "activations
being unnecessary for frozen parameters, yet the memory for them was still erroneously allocated", PR #1270)."""

_MODELLED_VERSION: ContextVar[str | None] = ContextVar("memlab_modelled_bitsandbytes", default=None)


def bitsandbytes_version() -> str | None:
    """The bitsandbytes version a dry run models: the one :func:`modelled_bitsandbytes` names, else the installed
    one (None where it is not installed: the dry run then models the current release)."""
    named = _MODELLED_VERSION.get()
    return named if named is not None else _installed_bitsandbytes()


@functools.cache
def _installed_bitsandbytes() -> str | None:
    # Read once: every 4-bit layer of a dry run asks, and a package's metadata is a directory scan.
    try:
        return metadata.version("bitsandbytes")
    except metadata.PackageNotFoundError:
        return None


def four_bit_keeps_inputs(version: str | None) -> bool:
    """Whether bitsandbytes ``version``'s 4-bit matmul keeps each layer's input for backward, although the frozen
    4-bit weight needs no gradient: every release before 0.43.2 did, which costs QLoRA one activation per 4-bit
    layer.

    Example:
        >>> four_bit_keeps_inputs("0.41.1"), four_bit_keeps_inputs("0.50.2"), four_bit_keeps_inputs(None)
        (True, False, False)
    """
    if version is None:
        return False
    try:
        return Version(version) < Version(INPUTS_FREED_IN)
    except InvalidVersion:
        raise ValueError(f"bitsandbytes version {version!r} is not a version number; write one such as "
                         f"'0.41.1'") from None


@contextlib.contextmanager
def modelled_bitsandbytes(version: str) -> Iterator[None]:
    """Dry runs inside model bitsandbytes ``version`` rather than the installed one: for a run published with an
    older release (what it kept for backward differs, :func:`four_bit_keeps_inputs`).

    Example:
        >>> with modelled_bitsandbytes("0.41.1"):
        ...     four_bit_keeps_inputs(bitsandbytes_version())
        True
    """
    four_bit_keeps_inputs(version)  # a bad version is refused before anything runs
    token = _MODELLED_VERSION.set(version)
    try:
        yield
    finally:
        _MODELLED_VERSION.reset(token)


def kept_inputs_note(version: str | None) -> str | None:
    """What a training estimate with 4-bit layers says when the modelled bitsandbytes keeps their inputs."""
    if not four_bit_keeps_inputs(version):
        return None
    return (f"bitsandbytes {version} (before {INPUTS_FREED_IN}) keeps each 4-bit layer's input for backward, and "
            f"this estimate counts it: `pip install -U bitsandbytes` frees that memory")


def nf4_bytes(numel: int) -> int:
    """Bytes of one NF4 weight of ``numel`` values as bitsandbytes stores it: the packed values, one 8-bit scale per
    block of 64 (double quantization) and one fp32 scale per 256 of those.

    Example:
        >>> nf4_bytes(4096 * 4096) / (4096 * 4096 * 4)  # against fp32
        0.1289...
    """
    blocks = math.ceil(numel / NF4_BLOCK)
    return (numel + 1) // 2 + blocks + 4 * math.ceil(blocks / NESTED_BLOCK)


def loaded_weight_bytes(model: nn.Module) -> int:
    """Bytes of ``model``'s parameters as they are held once loaded (a model on the meta device too): each in its
    dtype, a bitsandbytes 4-bit layer's weight in its NF4 layout (:func:`nf4_bytes`), an 8-bit layer's as int8 with a
    float32 scale per row; a parameter shared by two modules counted once. What no lever of a training step can
    lower: the figure a budget must hold before anything runs.

    Example:
        >>> loaded_weight_bytes(nn.Linear(4, 4))  # 16 weights and 4 biases in fp32
        80
    """
    seen: set[int] = set()
    total = 0
    for module in model.modules():
        kind = type(module).__name__ if type(module).__module__.startswith("bitsandbytes") else ""
        for name, parameter in module.named_parameters(recurse=False):
            if id(parameter) in seen:
                continue
            seen.add(id(parameter))
            if name == "weight" and kind in ("Linear4bit", "LinearNF4", "LinearFP4"):
                rows, columns = linear_features(module)  # packed or not yet (on the meta device): its layout
                total += nf4_bytes(rows * columns)
            elif name == "weight" and kind == "Linear8bitLt":
                rows, columns = linear_features(module)
                total += rows * columns + 4 * columns
            else:
                total += parameter.numel() * parameter.element_size()
    return total


class FakeNF4Linear(nn.Linear):
    """A linear layer whose weight is 4-bit (NF4 or FP4: the same bytes), for fake tensors, laid out as
    bitsandbytes' ``Params4bit`` holds it: the packed values as a frozen uint8 parameter, and as buffers its
    ``QuantState``: one scale per block of 64 (uint8 with double quantization, else float32), the 16-value code,
    and with double quantization a float32 scale per 256 block scales, their offset and their 256-value code.
    ``forward`` dequantizes into a ``compute_dtype`` temporary (never kept for backward); it keeps its input for
    backward only where the modelled bitsandbytes did (:func:`four_bit_keeps_inputs`)."""

    keeps_input = False
    keeps_dtypes = True
    """Its buffers are bitsandbytes' quantization state, whose dtypes no cast changes
    (:func:`memlab.inference.weights.cast_model` leaves them)."""

    def __init__(
        self, original: nn.Module, dtype: torch.dtype, mode: FakeTensorMode, device: torch.device,
        *, double_quant: bool = True,
    ) -> None:
        nn.Module.__init__(self)
        self.in_features, self.out_features = linear_features(original)
        self.compute_dtype = dtype
        numel = self.in_features * self.out_features
        blocks = math.ceil(numel / NF4_BLOCK)
        with mode:
            packed = torch.empty(((numel + 1) // 2, 1), dtype=torch.uint8, device=device)
            state = {"code": torch.empty(16, dtype=torch.float32, device=device)}
            if double_quant:
                state["block_scales"] = torch.empty(blocks, dtype=torch.uint8, device=device)
                state["nested_scales"] = torch.empty(math.ceil(blocks / NESTED_BLOCK), dtype=torch.float32,
                                                     device=device)
                state["nested_offset"] = torch.empty((), dtype=torch.float32, device=device)
                state["nested_code"] = torch.empty(256, dtype=torch.float32, device=device)
            else:
                state["block_scales"] = torch.empty(blocks, dtype=torch.float32, device=device)
        self.keeps_input = four_bit_keeps_inputs(bitsandbytes_version())
        self.weight = nn.Parameter(packed, requires_grad=False)
        self.bias = original.bias  # type: ignore[assignment]
        for name, tensor in state.items():
            self.register_buffer(name, tensor, persistent=False)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        # As Linear4bit.forward: in at the compute dtype, out at the input's dtype.
        computed = inputs.to(self.compute_dtype)
        output: torch.Tensor = _DequantizedLinear.apply(computed, self.out_features, self.compute_dtype,
                                                        self.keeps_input)
        if self.bias is not None:
            output = output + self.bias.to(self.compute_dtype)
        return output.to(inputs.dtype)


class FakeInt8Linear(FakeNF4Linear):
    """A linear layer whose weight is LLM.int8, for fake tensors, laid out as bitsandbytes' ``Int8Params``: the
    int8 weight as a frozen parameter and one float32 scale per row (``SCB``); ``forward`` as :class:`FakeNF4Linear`
    (bitsandbytes' int8 backward multiplies by the dequantized weight, a temporary too; what older releases kept
    for it is not modelled)."""

    def __init__(self, original: nn.Module, dtype: torch.dtype, mode: FakeTensorMode, device: torch.device) -> None:
        nn.Module.__init__(self)
        self.in_features, self.out_features = linear_features(original)
        self.compute_dtype = dtype
        with mode:
            weight = torch.empty((self.out_features, self.in_features), dtype=torch.int8, device=device)
            scales = torch.empty(self.out_features, dtype=torch.float32, device=device)
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.bias = original.bias  # type: ignore[assignment]
        self.register_buffer("SCB", scales, persistent=False)


def linear_features(layer: nn.Module) -> tuple[int, int]:
    """``(in_features, out_features)`` of an ``nn.Linear``, a bitsandbytes layer or a GPT-2-style ``Conv1D``
    (whose weight is ``(in, out)``), as transformers reads them when it quantizes the layer.

    Example:
        >>> linear_features(nn.Linear(3, 5))
        (3, 5)
    """
    sizes: Any = layer  # nn.Linear and bitsandbytes' layers name their sizes
    if hasattr(sizes, "in_features") and hasattr(sizes, "out_features"):
        return int(sizes.in_features), int(sizes.out_features)
    weight: Any = layer.weight  # a Conv1D's
    rows, columns = weight.shape
    return int(rows), int(columns)


def fake_quantized_layers(
    model: nn.Module, mode: FakeTensorMode, device: torch.device, live: nn.Module | None = None
) -> None:
    """On a fake copy of a live model loaded in 4-bit or 8-bit (bitsandbytes' ``Linear4bit``, ``Linear8bitLt``,
    peft's LoRA layers around them included), put in place of each bitsandbytes layer the fake layer of its layout
    (:class:`FakeNF4Linear`, :class:`FakeInt8Linear`): bitsandbytes' own kernels cannot run on fake tensors.
    ``live``: the model copied, whose layers' quantization states say how each was quantized.

    Example:
        >>> model = nn.Sequential(nn.Linear(2, 2))
        >>> fake_quantized_layers(model, FakeTensorMode(), torch.device("cpu")); type(model[0]).__name__
        'Linear'
    """
    for name, module in list(model.named_modules()):
        kind = type(module).__name__
        if not name or not type(module).__module__.startswith("bitsandbytes") or kind not in (
                "Linear4bit", "LinearNF4", "LinearFP4", "Linear8bitLt"):
            continue
        if kind == "Linear8bitLt":
            bias = getattr(module, "bias", None)
            dtype = bias.dtype if isinstance(bias, torch.Tensor) else torch.float32
            layer: nn.Module = FakeInt8Linear(module, dtype, mode, device)
        else:
            state = getattr((live or model).get_submodule(name).weight, "quant_state", None)
            layer = FakeNF4Linear(module, getattr(module, "compute_dtype", None) or torch.float32, mode, device,
                                  double_quant=bool(getattr(state, "nested", True)))
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, child, layer)


class _DequantizedLinear(torch.autograd.Function):
    """``inputs @ W.T`` with ``W`` dequantized into a temporary in forward and again in backward (bitsandbytes'
    ``MatMul4Bit`` saves no dequantized weight for backward); the input is kept for backward where ``keeps_input``
    says so, as bitsandbytes before 0.43.2 kept it."""

    @staticmethod
    def forward(
        ctx: Any, inputs: torch.Tensor, out_features: int, dtype: torch.dtype, keeps_input: bool = False
    ) -> torch.Tensor:
        ctx.shape = (out_features, inputs.shape[-1])
        ctx.dtypes = (dtype, inputs.dtype)
        if keeps_input:
            ctx.save_for_backward(inputs)
        weight = torch.empty(ctx.shape, dtype=dtype, device=inputs.device)
        return torch.nn.functional.linear(inputs.to(dtype), weight)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, None, None, None]:
        dtype, input_dtype = ctx.dtypes
        weight = torch.empty(ctx.shape, dtype=dtype, device=grad.device)
        return (grad.to(dtype) @ weight).to(input_dtype), None, None, None


def attach_fake_adapter(model: nn.Module, plan: Plan, mode: FakeTensorMode, device: torch.device) -> Undo:
    """Put the plan's adapters on a model of fake tensors; the returned function takes them off again.

    Example:
        >>> from memlab.estimation.estimate import estimate
        >>> model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))
        >>> trial = estimate(model, torch.randn(8, 64), Plan(adapter="qlora", lora_rank=4),
        ...                  loss_fn=lambda m, b: m(b).mean())
        >>> trial.status, trial.breakdown["optimizer"] > 0
        ('ok', True)
    """
    structure = ModuleStructure.capture(model)
    try:
        # Built without the torch-function modes of a dry run (CUDA's attention, dropout and autocast emulated):
        # building layers runs no kernel they change, and peft's initialisers made some 45,000 calls through them
        # per trial on a 7B model. peft makes each adapter real (on the CPU) and moves it to its base layer's
        # device: _FakeMoves makes that move a fake one, so a dry run for a GPU makes nothing on the real GPU.
        moves = _FakeMoves()
        with torch._C.DisableTorchFunction(), moves:
            if plan.adapter == "qlora" and not any(isinstance(m, FakeNF4Linear) for m in model.modules()):
                # Quantized here unless the load already did (memlab.estimation.dryrun.load: the base loaded in 4-bit).
                dtype = compute_dtype(plan)
                for name in qlora_targets(model):
                    parent_name, _, child = name.rpartition(".")
                    parent = model.get_submodule(parent_name) if parent_name else model
                    setattr(parent, child, FakeNF4Linear(model.get_submodule(name), dtype, mode, device))
            with unset_fake_temporarily():
                undo_peft = attach_adapter(model, plan.replace(adapter="lora"))
            _make_fake(model, mode, moves)
    except BaseException:
        structure.restore()
        raise

    def undo() -> None:
        if undo_peft is not None:
            undo_peft()
        structure.restore()

    return undo


class _FakeMoves:
    """While adapters are built on a fake model (in this thread): a real tensor moved to another device (peft moves
    each new adapter to its base layer's device and dtype, in ``_move_adapter_to_device_of_base_layer`` and
    ``_replace_module``) becomes a ``meta`` tensor of the same shape, strides, dtype and ``requires_grad``, and the
    device it was moved to is kept for :meth:`fake`: where the fake model is on ``cuda``, a real move would be a
    real allocation and copy on the user's GPU. Moves within one device (a dry run for the CPU) run as they are.

    ``Tensor.to`` is replaced while it lasts (a torch-function mode would see each of peft's calls, some 45,000 on a
    7B model, and doubled the build's time); other threads' moves run as they are."""

    def __init__(self) -> None:
        self.devices: dict[int, tuple[torch.Tensor, torch.device]] = {}
        """Each moved tensor's device, by its (meta) storage; the tensor kept alive so that no storage is reused."""
        self._patch = contextlib.ExitStack()

    def __enter__(self) -> _FakeMoves:
        original = torch.Tensor.to
        thread = threading.get_ident()

        def to(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
            if threading.get_ident() != thread or type(tensor) not in (torch.Tensor, nn.Parameter):
                return original(tensor, *args, **kwargs)
            device, dtype, _, _ = torch._C._nn._parse_to(*args, **kwargs)
            if device is not None and device != tensor.device:
                moved = torch.empty_strided(tensor.size(), tensor.stride(), dtype=dtype or tensor.dtype,
                                            device="meta").requires_grad_(tensor.requires_grad)
                self.devices[moved.untyped_storage()._cdata] = (moved, device)
                return moved
            result = original(tensor, *args, **kwargs)
            # A moved adapter cast afterwards (QLoRA's bf16 adapters held in fp32 once they sit on their base layer's
            # device: techniques/adapters.py, as peft does) is a new meta tensor: it goes where the one it was cast
            # from went. Without this, a QLoRA dry run for a GPU made on a GPU machine mixed meta and CUDA tensors
            # (the H200, 2026-11-27: "Unhandled FakeTensor Device Propagation ... cuda:0, meta").
            known = self.devices.get(tensor.untyped_storage()._cdata) if tensor.device.type == "meta" else None
            if known is not None and result.untyped_storage()._cdata not in self.devices:
                self.devices[result.untyped_storage()._cdata] = (result, known[1])
            return result

        self._patch.enter_context(patched(torch.Tensor, to=to))
        return self

    def __exit__(self, *exc: Any) -> None:
        self._patch.close()

    def fake(self, tensor: torch.Tensor, mode: FakeTensorMode) -> torch.Tensor:
        """The fake twin of a real tensor of the model: on the device it was moved to, if it was."""
        moved = self.devices.get(tensor.untyped_storage()._cdata) if tensor.device.type == "meta" else None
        if moved is None:
            return mode.from_tensor(tensor.detach())
        with mode:
            return torch.empty_strided(tensor.size(), tensor.stride(), dtype=tensor.dtype, device=moved[1])


def _make_fake(model: nn.Module, mode: FakeTensorMode, moves: _FakeMoves) -> None:
    """Replace every real parameter (the adapters just built) by a fake twin."""
    for module in model.modules():
        for name, parameter in list(module._parameters.items()):
            if parameter is not None and not isinstance(parameter, FakeTensor):
                fake = moves.fake(parameter, mode)
                module._parameters[name] = nn.Parameter(fake, requires_grad=parameter.requires_grad)
