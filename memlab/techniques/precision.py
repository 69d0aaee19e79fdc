"""Mixed precision: ``torch.autocast`` on the model's device type, a ``GradScaler`` for fp16, fp32 master weights;
the lever's values, its declaration and exports."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch._subclasses.fake_tensor import is_fake

from memlab.errors import MemlabError, UnsupportedTechnique
from memlab.live.device import bf16_capable, cuda_bf16_supported
from memlab.techniques.core.fragments import Accelerate, Code, Elsewhere, Export, Fragment, Keys, per_target
from memlab.techniques.core.lever import Lever, PlanLike
from memlab.techniques.core.technique import PlanFields, StepParts, Technique, Undo

FULL_PRECISION = "fp32"
"""The ``precision`` value that runs without autocast."""

BF16 = "bf16"
"""The ``precision`` value that autocasts to bfloat16."""

FP16 = "fp16"
"""The ``precision`` value that autocasts to float16, with a GradScaler."""

PRECISIONS = (FULL_PRECISION, BF16, FP16)
"""Every ``precision`` value (its choices), which other modules ask instead of spelling them."""

_DTYPES = {BF16: torch.bfloat16, FP16: torch.float16}


def half_precision(bf16: bool) -> str:
    """The half precision a device runs: bf16 where it has it (``bf16``), fp16 where it has not.

    Example:
        >>> half_precision(True), half_precision(False)
        ('bf16', 'fp16')
    """
    return BF16 if bf16 else FP16

CPU_BF16_UNITS = ("amx_bf16", "avx512_bf16", "bf16")
"""The CPU flags of bf16 matrix units, as Linux's ``/proc/cpuinfo`` names them: x86's AMX and AVX512-BF16, Arm's BF16
extension. PyTorch's bf16 matrix products on a CPU go through oneDNN, which runs them natively on these units; on a
CPU without any of them it emulates them, several times slower than fp32."""

BF16_ON_CPU = ("bf16 on this CPU is emulated, so slow: it lists no bf16 matrix units (amx_bf16, avx512_bf16 or Arm's "
               "bf16), so PyTorch emulates its matrix products (a GPU runs them natively: measure the speed there)")
"""The note of a plan measured in bf16 on a CPU without bf16 matrix units (:func:`cpu_bf16_units`), which the tables
and the figures show where its speed is read: without it, bf16 looked like a slow choice on any device. A CPU with
them runs bf16 natively, and its measured speed needs no note."""
BF16_ON_CPU_SHORT = "slow on this CPU, which emulates bf16"
""":data:`BF16_ON_CPU` in the few words a figure writes beside such a plan."""


def cpu_flags(cpuinfo: str) -> frozenset[str]:
    """The flags a ``/proc/cpuinfo`` text lists: its ``flags`` lines (x86) and ``Features`` lines (Arm).

    Example:
        >>> sorted(cpu_flags("processor : 0\\nflags : fpu avx512f avx512_bf16\\n"))
        ['avx512_bf16', 'avx512f', 'fpu']
        >>> sorted(cpu_flags("Features : fp asimd bf16"))
        ['asimd', 'bf16', 'fp']
    """
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        name, _, value = line.partition(":")
        if name.strip().lower() in ("flags", "features"):
            flags.update(value.split())
    return frozenset(flags)


@functools.cache
def machine_cpu_flags() -> frozenset[str]:
    """This machine's CPU flags (:func:`cpu_flags` of ``/proc/cpuinfo``, read once); none where it cannot be read
    (macOS, Windows): then no bf16 matrix unit is known.

    Example:
        >>> isinstance(machine_cpu_flags(), frozenset)
        True
    """
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as file:
            return cpu_flags(file.read())
    except OSError:
        return frozenset()


def cpu_bf16_units(flags: Iterable[str] | None = None) -> tuple[str, ...]:
    """The bf16 matrix units (:data:`CPU_BF16_UNITS`) among ``flags`` (default: this machine's,
    :func:`machine_cpu_flags`): the one rule for whether bf16 is native on a CPU, which a bf16 trial's note, the demo
    and the notebooks follow.

    Example:
        >>> cpu_bf16_units({"avx512f", "avx512_bf16", "amx_bf16"}), cpu_bf16_units({"avx2", "fma"})
        (('amx_bf16', 'avx512_bf16'), ())
    """
    found = machine_cpu_flags() if flags is None else frozenset(flags)
    return tuple(unit for unit in CPU_BF16_UNITS if unit in found)


def bf16_on_cpu(flags: Iterable[str] | None = None) -> str:
    """What bf16 is on a CPU with ``flags`` (default: this machine's), in a sentence a front end shows: native on its
    bf16 matrix units (named), or emulated and slow.

    Example:
        >>> bf16_on_cpu({"amx_bf16", "avx512_bf16"})
        'this CPU runs bf16 natively, on its bf16 matrix units (amx_bf16, avx512_bf16)'
        >>> bf16_on_cpu({"avx2"})
        "this CPU emulates bf16, slowly: it lists no bf16 matrix units (amx_bf16, avx512_bf16 or Arm's bf16)"
    """
    units = cpu_bf16_units(flags)
    if units:
        return f"this CPU runs bf16 natively, on its bf16 matrix units ({', '.join(units)})"
    return "this CPU emulates bf16, slowly: it lists no bf16 matrix units (amx_bf16, avx512_bf16 or Arm's bf16)"


def check_precision(plan: PlanFields, device: torch.device, parameters: Sequence[torch.Tensor] = ()) -> list[str]:
    """Notes about the plan's precision on this device; a clear error where the device cannot run it, or where
    the trained ``parameters`` are fp16 (loss scaling cannot unscale fp16 gradients).

    Example:
        >>> from memlab.plan import Plan
        >>> check_precision(Plan(precision="fp16"), torch.device("cpu"))
        ['fp16 on CPU is slow: CPUs have no fast fp16 matrix units; compare bf16, or measure on the GPU']
        >>> check_precision(Plan(precision="bf16"), torch.device("cpu")) == ([] if cpu_bf16_units() else [BF16_ON_CPU])
        True
    """
    if plan.precision == "fp32":
        return []
    if plan.precision == "fp16" and any(p.dtype == torch.float16 for p in parameters):
        raise UnsupportedTechnique(
            "the trained weights are fp16, and fp16 loss scaling needs fp32 weights; load the model in fp32 "
            "(autocast computes in fp16), or write precision='bf16'"
        )
    # A dry run's fake weights (on "cuda" where this machine has one) are checked by no real device: no CUDA call
    # is made under its fake mode (DESIGN.md 2.4), and the GPU it is for need not be this one.
    real = not any(is_fake(p) for p in parameters)
    notes = []
    if device.type == "cuda" and real and not cuda_bf16_supported(device):
        emulated = bf16_emulated(torch.cuda.get_device_capability(device), torch.cuda.get_device_name(device),
                                 precision=plan.precision)
        notes += [emulated] if emulated else []
    if device.type not in ("cuda", "cpu", "xpu", "mps"):
        raise UnsupportedTechnique(f"mixed precision on {device.type} is not supported; write precision='fp32'")
    if device.type == "cpu" and plan.precision == "fp16":
        return ["fp16 on CPU is slow: CPUs have no fast fp16 matrix units; compare bf16, or measure on the GPU"]
    if device.type == "cpu" and plan.precision == "bf16" and real and not cpu_bf16_units():  # a dry run times nothing
        return [BF16_ON_CPU]
    return notes


TRAINER_FP16 = "a Trainer's fp16=True, bf16=False"
"""What a Trainer's arguments say for ``precision='fp16'``, in :func:`bf16_emulated`'s text."""


def bf16_emulated(capability: tuple[int, int], gpu: str, *, precision: str | None = None,
                  weights: str | None = None) -> str:
    """What a step in bf16 costs on the GPU ``gpu`` of compute ``capability`` that has no native bf16, as a note;
    ``""`` where it has it, or where nothing runs in bf16. The one text for a live GPU (a trial) and a GPU kind (an
    estimate, ``memlab estimate --gpu``): below compute capability 8.0 (a T4) PyTorch emulates bf16
    (``torch.cuda.is_bf16_supported(including_emulation=True)``), so autocast in bf16 (``precision``) and bf16
    ``weights`` run, as transformers and TRL run them there (TRL's T4 notebooks train so): slower than fp16, and no
    fused attention kernel takes bf16 there, so attention runs PyTorch's math kernel, which keeps its
    probabilities for backward (the estimate follows that kernel). It is estimated and measured as it runs, never
    refused; the note names the fp16 that such a GPU runs natively.

    Example:
        >>> print(bf16_emulated((7, 5), "T4-16GB", precision="bf16"))
        the T4-16GB (compute capability 7.5) has no native bf16: PyTorch emulates it (slower than fp16, and \
attention runs the math kernel, which keeps its probabilities for backward), as this step runs it; precision='fp16' \
(autocast in fp16, loss-scaled; a Trainer's fp16=True, bf16=False) runs natively there
        >>> bf16_emulated((8, 0), "A100-80GB", precision="bf16"), bf16_emulated((7, 5), "T4-16GB", precision="fp16")
        ('', '')
    """
    if bf16_capable(capability) or BF16 not in (precision, weights):
        return ""
    where = (f"the {gpu} (compute capability {capability[0]}.{capability[1]}) has no native bf16: PyTorch emulates "
             "it (slower than fp16, and attention runs the math kernel, which keeps its probabilities for "
             "backward), as this step runs it")
    if precision == BF16:
        return f"{where}; precision='fp16' (autocast in fp16, loss-scaled; {TRAINER_FP16}) runs natively there"
    return f"{where}; weights='fp16' runs natively there"


def autocast(plan: PlanFields, device: torch.device) -> contextlib.AbstractContextManager[object]:
    """The autocast context of the plan (a no-op for fp32).

    Example:
        >>> from memlab.plan import Plan
        >>> with autocast(Plan(precision="bf16"), torch.device("cpu")):
        ...     (torch.ones(2, 2) @ torch.ones(2, 2)).dtype
        torch.bfloat16
    """
    if plan.precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=_DTYPES[plan.precision])


def grad_scaler(plan: PlanFields, device: torch.device) -> torch.amp.GradScaler | None:
    """A dynamic loss scaler for fp16 (None otherwise): small fp16 gradients would underflow to zero without it."""
    if plan.precision != "fp16":
        return None
    return torch.amp.GradScaler(device.type)


class ScaledStep:
    """The optimizer step of fp16: unscale and step through the ``GradScaler``, then update its scale."""

    def __init__(self, scaler: torch.amp.GradScaler) -> None:
        self.scaler = scaler

    def backward(self, loss: torch.Tensor) -> None:
        self.scaler.scale(loss).backward()

    def __call__(self, optimizer: torch.optim.Optimizer) -> None:
        self.scaler.step(optimizer)
        self.scaler.update()


class Precision(Technique):
    """``precision``: autocast around each forward, and for fp16 the ``GradScaler``'s backward and step. Refused
    (before the step runs) where the device or the trained weights cannot take it.

    Example:
        >>> from torch import nn
        >>> from memlab.plan import Plan
        >>> from memlab.techniques.core.technique import StepParts
        >>> parts = StepParts(nn.Linear(2, 2), Plan(precision="bf16"), torch.device("cpu"))
        >>> PRECISION.put_on(parts)
        >>> with parts.forward_context():
        ...     parts.model(torch.ones(1, 2)).dtype
        torch.bfloat16
    """

    def put_on(self, parts: StepParts) -> Undo | None:
        plan, device = parts.plan, parts.device
        check_precision(plan, device, parts.parameters)
        if plan.precision != "fp32":
            parts.forward_contexts.append(lambda: autocast(plan, device))
        scaler = grad_scaler(plan, device)
        if scaler is not None:
            scaled = ScaledStep(scaler)
            parts.backward = scaled.backward
            parts.optimizer_step = scaled
        return None

    def notes(self, parts: StepParts) -> list[str]:
        return check_precision(parts.plan, parts.device, parts.parameters)


PRECISION = Precision()


_AUTOCAST = {"bf16": "torch.bfloat16", "fp16": "torch.float16"}


def _precision(target: str) -> Export:
    def fragment(plan: PlanLike) -> Fragment:
        half = plan.precision
        if target == "trainer":
            return Keys({"bf16": half == "bf16", "fp16": half == "fp16"})
        if target == "deepspeed":
            return Keys({"bf16": {"enabled": True}} if half == "bf16" else {
                "fp16": {"enabled": True, "loss_scale": 0}} if half == "fp16" else {})
        if target == "accelerate":  # accelerate's autocast and fp16 loss scaling come from the config
            # accelerate's mixed_precision="fp8" is bf16 autocast with float8 linear layers (the fp8 lever's)
            fp8 = getattr(plan, "fp8", False)
            return Accelerate(config={"mixed_precision": "fp8" if fp8 else {"fp32": "no"}.get(half, half)})
        if target != "code" or half == "fp32":
            return Code() if target == "code" else Elsewhere()
        autocast = Code(contexts=(f"torch.autocast(device.type, dtype={_AUTOCAST[half]})",))
        if half == "bf16":
            return autocast
        return autocast + Code(
            after_optimizer=("scaler = torch.amp.GradScaler(device.type)  # dynamic loss scaling for fp16",),
            backward="scaler.scale(loss).backward()",
            step=("scaler.step(optimizer)", "scaler.update()"),
        )

    return fragment


def precision_from_arguments(args: Any) -> str:
    """The precision a ``TrainingArguments`` trains in (``bf16`` / ``fp16``; fp32 where neither is set).

    Example:
        >>> from types import SimpleNamespace
        >>> precision_from_arguments(SimpleNamespace(bf16=True)), precision_from_arguments(SimpleNamespace())
        ('bf16', 'fp32')
    """
    bf16, fp16 = bool(getattr(args, "bf16", False)), bool(getattr(args, "fp16", False))
    if bf16 and fp16:
        raise MemlabError("bf16=True and fp16=True together are not one precision; keep one of them")
    return "bf16" if bf16 else "fp16" if fp16 else "fp32"


DECLARATIONS = (
    Lever(
        "precision",
        "fp32",
        short="{}",
        choices=PRECISIONS,
        help="autocast compute dtype: bf16/fp16 halve activations and are faster on GPUs; fp16 scales the loss",
        technique=PRECISION,
        activation_key=lambda value: value,
        speed={"bf16": (1.6, 1.0), "fp16": (1.6, 0.3)},
        from_arguments=precision_from_arguments,
        exports=per_target(_precision),
    ),
)
"""The ``precision`` lever (:data:`memlab.techniques.core.registry.REGISTRY` gathers it)."""
