"""The CUDA context in an estimate: what the driver holds on each GPU beside torch's caching allocator, per GPU kind.

What nvidia-smi shows for a training process, and what an out-of-memory error is about, is the caching allocator's
reserve plus the CUDA context (the kernel modules loaded, per-thread stacks, library handles): the card figure
(:attr:`memlab.report.Trial.card_bytes`). A dry run cannot read a driver, so an estimate for ``device="cuda"`` takes
the context of a GPU kind from :data:`GPUS` (default :data:`DEFAULT_GPU`, an 80 GB H100) and says so in a note;
measured trials read it from the driver instead (:func:`memlab.measure.cuda.cuda_context_bytes`).

The context depends more on the driver, the CUDA version and which kernels ran (CUDA loads modules lazily, on first
use, since 11.7; by default on Linux since 12.2) than on the card, and grows with the number of SMs (per-thread
stacks). Each figure below says where it comes from; an assumed one is the measured H100's until the GPU run measures
that kind (it records ``cuda_context_bytes`` with every trial).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

import torch
from torch import nn

from memlab.errors import MemlabError
from memlab.plan import format_bytes
from memlab.report import Trial

__all__ = ["DEFAULT_GPU", "GPUS", "GpuKind", "card_context", "card_contexts", "gpu_kind", "live_card_context"]

TrialT = TypeVar("TrialT", bound=Trial)


@dataclass(frozen=True)
class GpuKind:
    """A kind of GPU an estimate can answer for: its name (the ``gpu=`` keyword, ``--gpu``), the name torch gives
    the device, the CUDA context of a training process on it, and where that figure comes from."""

    name: str
    device_name: str
    context_bytes: int
    source: str


# Measured: an H100 80GB HBM3 (torch 2.11+cu130, CUDA 13.0, driver 580.159.04, lazy module loading), after a compare
# and fits over fp32, bf16, fp16, 8-bit AdamW and offload plans had loaded their kernels: the device's total memory
# (85,017,493,504 bytes) less what the process could hold (free + reserved = 84,205,043,712 bytes), alone on the GPU.
# benchmarks/results/gpu_acceptance-cuda-nvidia-h100-80gb-hbm3.json: device.gpu_memory_bytes less
# parts.restore.outcomes["fit with the default CUDA budget"].capacity.
_H100_CONTEXT = 85_017_493_504 - 84_205_043_712
_MEASURED = "measured on an H100 80GB HBM3, torch 2.11, CUDA 13.0"
# Assumed: no run on these kinds yet; the H100's figure (same driver stack). PyTorch's own measurement of a bare
# context (pytorch/pytorch#86509, CUDA 11.7) was 274 MiB with lazy loading and 636 MiB without: training loads more.
_ASSUMED = "assumed: the H100's figure, not yet measured on this GPU"

GPUS: dict[str, GpuKind] = {
    kind.name: kind
    for kind in (
        GpuKind("H100-80GB", "NVIDIA H100 80GB HBM3", _H100_CONTEXT, _MEASURED),
        GpuKind("H200-141GB", "NVIDIA H200", _H100_CONTEXT, _ASSUMED),
        GpuKind("A100-80GB", "NVIDIA A100-SXM4-80GB", _H100_CONTEXT, _ASSUMED),
        GpuKind("A100-40GB", "NVIDIA A100-SXM4-40GB", _H100_CONTEXT, _ASSUMED),
        GpuKind("L40S-48GB", "NVIDIA L40S", _H100_CONTEXT, _ASSUMED),
        GpuKind("RTX4090-24GB", "NVIDIA GeForce RTX 4090", _H100_CONTEXT, _ASSUMED),
        GpuKind("L4-24GB", "NVIDIA L4", _H100_CONTEXT, _ASSUMED),
    )
}
"""The GPU kinds an estimate knows the CUDA context of, by name."""

DEFAULT_GPU = "H100-80GB"
"""The GPU an estimate for CUDA answers for unless told another (``gpu=``, ``--gpu``)."""

_NOTE_PREFIX = "card figure"


def gpu_kind(name: str | None = None) -> GpuKind:
    """The GPU kind called ``name`` (default :data:`DEFAULT_GPU`); a MemlabError listing the kinds otherwise.

    Example:
        >>> gpu_kind().name, gpu_kind("a100-80gb").device_name
        ('H100-80GB', 'NVIDIA A100-SXM4-80GB')
    """
    if name is None:
        return GPUS[DEFAULT_GPU]
    found = {key.lower(): kind for key, kind in GPUS.items()}.get(str(name).lower())
    if found is None:
        raise MemlabError(f"gpu={name!r} is not a GPU memlab knows; write one of {', '.join(GPUS)}")
    return found


def card_context(trial: TrialT, gpu: str | None = None, *, read_on: torch.device | None = None) -> TrialT:
    """``trial`` with the CUDA context of its card (:attr:`~memlab.report.Trial.context_bytes`) and a note saying
    where the figure comes from: modelled for the GPU kind ``gpu`` (default :data:`DEFAULT_GPU`), or read from the
    driver on ``read_on`` (a live GPU: a dry run of a model that lives there). A trial not on CUDA is returned as it
    is. The note also says whether the card figure is known: it needs the allocator's reserve as well.

    Example:
        >>> from memlab.plan import Plan
        >>> trial = Trial(Plan(), "ok", 90, {}, None, None, None, "cuda", estimated=True, reserved_bytes=100)
        >>> carded = card_context(trial)
        >>> carded.context_bytes == GPUS["H100-80GB"].context_bytes, carded.card_bytes > carded.reserved_bytes
        (True, True)
        >>> print(carded.notes[-1])
        card figure (reserve + CUDA context) modelled for an H100-80GB: context 774.8 MiB (measured on an H100 80GB \
HBM3, torch 2.11, CUDA 13.0)
        >>> card_context(dataclasses.replace(trial, device="cpu")).context_bytes is None
        True
    """
    if not str(trial.device).startswith("cuda"):
        return trial
    if read_on is not None:
        from memlab.measure.cuda import cuda_context_bytes

        context = cuda_context_bytes(read_on)
        where = f"read on {read_on}"
        known = f"{_NOTE_PREFIX} (reserve + CUDA context): context {format_bytes(context)} {where}"
        unknown = f"CUDA context {format_bytes(context)} {where}"
    else:
        kind = gpu_kind(gpu)
        context = kind.context_bytes
        where = f"modelled for an {kind.name}"
        known = f"{_NOTE_PREFIX} (reserve + CUDA context) {where}: context {format_bytes(context)} ({kind.source})"
        unknown = f"CUDA context {where}: {format_bytes(context)} ({kind.source})"
    if trial.reserved_bytes is None:
        note = f"{unknown}; {_NOTE_PREFIX} unknown: the allocator's reserve is not known"
    else:
        note = known
    notes = [n for n in trial.notes if not n.startswith((_NOTE_PREFIX, "CUDA context"))]
    return dataclasses.replace(trial, context_bytes=context, notes=(*notes, note))


def card_contexts(trials: Sequence[TrialT], gpu: str | None = None) -> list[TrialT]:
    """:func:`card_context` of each trial, for the GPU kind ``gpu``.

    Example:
        >>> card_contexts([], "L4-24GB")
        []
    """
    return [card_context(trial, gpu) for trial in trials]


def live_card_context(trial: TrialT, model: nn.Module) -> TrialT:
    """:func:`card_context` for a dry run of a live ``model``: the context read on the GPU the model is on, modelled
    for :data:`DEFAULT_GPU` where it is not on one (a model on the meta device estimated for CUDA).

    Example:
        >>> from memlab.plan import Plan
        >>> trial = Trial(Plan(), "ok", 90, {}, None, None, None, "cuda", estimated=True)
        >>> live_card_context(trial, nn.Linear(2, 2, device="meta")).context_bytes == GPUS[DEFAULT_GPU].context_bytes
        True
    """
    from memlab.measure.device import model_device

    device = model_device(model)
    return card_context(trial, read_on=device if device.type == "cuda" else None)
