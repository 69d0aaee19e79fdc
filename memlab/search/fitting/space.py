"""fit's space: what a checked :class:`~memlab.search.fitting.request.FitRequest` searches, as one
:class:`FitSpace`: the budget (given, the GPU kind's memory, or what this process's CUDA device can hold), the levers
searched (:func:`memlab.search.space.default_space` for the device searched, with the user's restriction put in)
and the candidate plans at the effective batch, each checked against the batch."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from memlab.errors import MemlabError
from memlab.live.batch import atomic_refusal, is_atomic
from memlab.live.device import cuda_bf16_supported, model_device
from memlab.live.structure import trainable_parameters
from memlab.measure.cuda import cuda_card_capacity
from memlab.options import RunOptions
from memlab.plan import Plan
from memlab.search.fitting.request import FitRequest
from memlab.search.space import candidate_plans, default_space
from memlab.search.speed import SpeedPrior, speed_prior
from memlab.techniques.accumulation import check_split
from memlab.techniques.attention import fused_attention_instead
from memlab.techniques.loss import chunked_loss_applies
from memlab.techniques.precision import BF16, half_precision

__all__ = ["FitSpace", "fit_space"]


@dataclass(frozen=True)
class FitSpace:
    """What a search covers: ``device`` the model is on, ``searched`` the device whose plans are searched (CUDA for
    a GPU kind's dry run, wherever the model is), whether that device runs ``bf16``, the ``budget`` in bytes (also in
    ``options``, the run's options every trial runs with), the levers searched (``levers``: each plan field's values)
    and the ``candidates`` they make at the effective batch, the model's ``trainable`` bytes, the speed ``prior``
    of the device searched, and the device a dry run is asked for (``estimated_for``: ``"cuda"`` for a GPU kind;
    None for a model on the meta device, which ``memlab.estimate`` estimates for CUDA; else the model's)."""

    device: torch.device
    searched: torch.device
    bf16: bool
    budget: int
    options: RunOptions
    levers: dict[str, Sequence[Any]]
    candidates: list[Plan]
    trainable: int
    prior: SpeedPrior
    estimated_for: torch.device | str | None

    @property
    def half(self) -> str:
        """The half precision autocast runs in on the device searched: bf16 where it runs it, else fp16."""
        return half_precision(self.bf16)


def fit_space(request: FitRequest) -> FitSpace:
    """The space a checked ``request`` searches; a MemlabError where the budget is missing on a CPU, the space is
    not a dict, the GPU kind runs no bf16 the space asks for, or a plan cannot split the batch.

    Example:
        >>> request = FitRequest(torch.nn.Linear(4, 1), torch.randn(4, 4), options=RunOptions(budget="1MiB"),
        ...                      space={"precision": ["fp32"], "optimizer": ["adamw"], "checkpointing": [False],
        ...                             "offload": ["none"], "loss": ["full"]}).checked()
        >>> space = fit_space(request)
        >>> space.budget, space.searched.type, [plan.label() for plan in space.candidates]
        (1048576, 'cpu', ['plain', 'mb2x2', 'mb1x4'])
    """
    device = model_device(request.model)
    gpu = request.gpu
    # a dry run for a GPU kind searches what that card runs, wherever the model is
    searched = torch.device("cuda") if gpu is not None else device
    bf16 = gpu.bf16 if gpu is not None else device.type == "cuda" and cuda_bf16_supported(device)
    budget = _budget(request, device)
    levers = _levers(request, searched, bf16)
    candidates = candidate_plans(request.effective_batch, levers, batch_rows=request.rows)
    for plan in candidates:
        check_split(request.batch, plan)
    trainable = sum(p.numel() * p.element_size() for p in trainable_parameters(request.model))
    estimated_for = "cuda" if gpu is not None else None if device.type == "meta" else device
    return FitSpace(device, searched, bf16, budget, request.options.replace(budget=budget), levers, candidates,
                    trainable, speed_prior(searched.type), estimated_for)


def _budget(request: FitRequest, device: torch.device) -> int:
    """The budget in bytes: the one given, else a GPU kind's memory (what the card figure must fit, as
    ``memlab.estimate(..., gpu=...)`` judges it), else on CUDA what the card shows this process can hold (the
    allocator's part and the context); a MemlabError on a CPU without one."""
    if request.options.budget is not None:
        return request.options.budget
    if request.gpu is not None:
        return request.gpu.memory_bytes
    if device.type != "cuda":
        raise MemlabError(f"fit on {device.type} needs a budget; write for example budget='8GiB' or budget='500MB'")
    return cuda_card_capacity(device)


def _levers(request: FitRequest, searched: torch.device, bf16: bool) -> dict[str, Sequence[Any]]:
    """The levers searched: the default space of the device searched, the user's ``space`` put in; a batch taken
    whole (:func:`memlab.live.batch.is_atomic`) is every micro-batch, accumulation making up the effective batch."""
    model, space, gpu = request.model, request.space, request.gpu
    levers: dict[str, Sequence[Any]] = dict(default_space(
        request.effective_batch, searched.type, bf16, chunked_loss=chunked_loss_applies(model, request.options.loss_fn),
        fused_attention=fused_attention_instead(model),
    ))
    if space is not None:
        if not isinstance(space, Mapping):
            raise MemlabError("space must be a dict of plan fields to values, e.g. {'precision': ['fp32', 'bf16']}")
        levers.update(space)
    if gpu is not None and not gpu.bf16 and BF16 in list(levers.get("precision", [])):
        half = [value for value in levers["precision"] if value != BF16] + [half_precision(False)]
        raise MemlabError(f"the {gpu.name} runs no bf16 (compute capability {gpu.capability[0]}.{gpu.capability[1]}), "
                          f"and the space asks for it; write space={{'precision': {sorted(set(half))!r}}}")
    if is_atomic(request.batch):  # taken whole: each micro-batch is the batch itself, accumulation makes up the batch
        rows, batch_size = request.rows, request.effective_batch
        if batch_size % rows:
            raise atomic_refusal(rows, f"batch_size={batch_size} (not a multiple of its {rows} rows)")
        levers["micro_batch"] = (space or {}).get("micro_batch", [rows])
    return levers
