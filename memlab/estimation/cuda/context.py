"""The CUDA context in an estimate: what the driver holds on each GPU beside torch's caching allocator, per GPU kind.

What nvidia-smi shows for a training process, and what an out-of-memory error is about, is the caching allocator's
reserve plus the CUDA context (the kernel modules loaded, per-thread stacks, library handles): the card figure
(:attr:`memlab.report.Trial.card_bytes`). A dry run cannot read a driver, so an estimate for ``device="cuda"`` takes
the context of a GPU kind from :data:`memlab.estimation.cuda.gpus.GPUS` (default an 80 GB H100) and says so in a note;
measured trials read it from the driver instead (:func:`memlab.measure.cuda.cuda_context_bytes`).

The context depends more on the driver, the CUDA version and which kernels ran (CUDA loads modules lazily, on first
use, since 11.7; by default on Linux since 12.2) than on the card, and grows with the number of SMs (per-thread
stacks). Each figure in :data:`memlab.estimation.cuda.gpus.GPUS` says where it comes from; an assumed one is the
measured H100's until the GPU run measures that kind (it records ``cuda_context_bytes`` with every trial).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TypeVar

import torch
from torch import nn

from memlab.estimation.cuda.gpus import GpuKind, kind_or_default
from memlab.plan import format_bytes
from memlab.report import Trial

__all__ = ["card_context", "card_contexts", "live_card_context"]

TrialT = TypeVar("TrialT", bound=Trial)

_NOTE_PREFIX = "card figure"


def card_context(trial: TrialT, gpu: GpuKind | None = None, *, read_on: torch.device | None = None) -> TrialT:
    """``trial`` with the CUDA context of its card (:attr:`~memlab.report.Trial.context_bytes`) and a note saying
    where the figure comes from: modelled for the GPU kind ``gpu`` (default: an H100-80GB), or read from the
    driver on ``read_on`` (a live GPU: a dry run of a model that lives there). A trial not on CUDA is returned as it
    is. The note also says whether the card figure is known: it needs the allocator's reserve as well.

    Example:
        >>> from memlab.estimation.cuda.gpus import GPUS
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
        kind = kind_or_default(gpu)
        context = kind.context_bytes
        where = f"modelled for {kind.called}"
        known = f"{_NOTE_PREFIX} (reserve + CUDA context) {where}: context {format_bytes(context)} ({kind.source})"
        unknown = f"CUDA context {where}: {format_bytes(context)} ({kind.source})"
    if trial.reserved_bytes is None:
        note = f"{unknown}; {_NOTE_PREFIX} unknown: the allocator's reserve is not known"
    else:
        note = known
    notes = [n for n in trial.notes if not n.startswith((_NOTE_PREFIX, "CUDA context"))]
    return dataclasses.replace(trial, context_bytes=context, notes=(*notes, note))


def card_contexts(trials: Sequence[TrialT], gpu: GpuKind | None = None) -> list[TrialT]:
    """:func:`card_context` of each trial, for the GPU kind ``gpu``.

    Example:
        >>> card_contexts([], None)
        []
    """
    return [card_context(trial, gpu) for trial in trials]


def live_card_context(trial: TrialT, model: nn.Module) -> TrialT:
    """:func:`card_context` for a dry run of a live ``model``: the context read on the GPU the model is on, modelled
    for the default GPU kind where it is not on one (a model on the meta device estimated for CUDA).

    Example:
        >>> from memlab.estimation.cuda.gpus import DEFAULT_GPU, GPUS
        >>> from memlab.plan import Plan
        >>> trial = Trial(Plan(), "ok", 90, {}, None, None, None, "cuda", estimated=True)
        >>> live_card_context(trial, nn.Linear(2, 2, device="meta")).context_bytes == GPUS[DEFAULT_GPU].context_bytes
        True
    """
    from memlab.live.device import model_device

    device = model_device(model)
    return card_context(trial, read_on=device if device.type == "cuda" else None)
