"""What :func:`memlab.estimate` was asked, as one object: :class:`EstimateRequest`.

``memlab.estimate(model_or_config, batch, plan, *, loss_fn, budget, lr, device, gpus, strategy, gpu, load,
expandable_segments, host_budget)`` builds an :class:`EstimateRequest` once, and each route
(:mod:`memlab.estimation.routes`) takes that object and nothing else. A setting added to the request (the user's
``load=`` was the first) reaches every route; a route that cannot honour it refuses it with one
:class:`~memlab.errors.MemlabError` saying what to write instead. The request is data: it imports no route, so the
routes' modules (the sharded estimate's among them) may read it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import torch

from memlab.estimation.cuda.gpus import GpuKind
from memlab.live.batch import LossFn
from memlab.live.sharding import ZeroSettings, check_sharding
from memlab.plan import Plan, parse_budget

if TYPE_CHECKING:
    from memlab.plan import InferencePlan
    from memlab.techniques.vllm import VLLMServer

__all__ = ["EstimateRequest"]


@dataclass(frozen=True)
class EstimateRequest:
    """Everything :func:`memlab.estimate` was asked: the model (a live model, a config, a name or a Trainer), the
    batch (tensors or shapes), one plan (training or inference), the loss, the budget (bytes), the learning rate,
    the device, the GPUs and the strategy that shards them, the GPU kind, the user's load, and whether the card
    figure assumes the allocator's expandable segments (``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``), and
    the host budget the trial's ``host_bytes`` are judged against (none: not judged), a GRPOTrainer's vLLM server, and
    the DeepSpeed settings a trainer's config gives a ZeRO estimate.

    :meth:`checked` validates what can be validated before anything is built (the sharding, the budget), so that
    every route gets a request it can trust; ``gpu`` comes resolved (a :class:`GpuKind`, or None where none was
    named).

    Example:
        >>> request = EstimateRequest("llama-7b", {"input_ids": (1, 512)}, Plan(), gpus=8, strategy="FSDP2",
        ...                           budget="80GiB").checked()
        >>> request.gpus, request.strategy, request.budget, request.sharded
        (8, 'fsdp2', 85899345920, True)
        >>> request.replace(gpus=1, strategy="none").sharded
        False
    """

    model: Any
    batch: Any = None
    plan: Plan | InferencePlan | None = None
    loss_fn: LossFn | None = None
    budget: int | str | None = None
    lr: float = 1e-5
    device: str | torch.device | None = None
    gpus: int = 1
    strategy: str = "none"
    gpu: GpuKind | None = None
    """The GPU kind a CUDA estimate is for, resolved where its name came in (``memlab.estimate``); None: none named
    (the default kind's figures, and the model's own device unless ``device`` says)."""
    load: Mapping[str, Any] | None = None
    expandable_segments: bool = False
    host_budget: int | str | None = None
    vllm_server: VLLMServer | None = None
    """A GRPOTrainer's vLLM server (``vllm_mode="server"``): its ``trl vllm-serve`` settings (None: TRL's defaults)."""
    live_layers: bool = False
    """A live model's repeated layers may be carried from a dry run of a few (a Trainer's model: its route sets it)."""
    zero: ZeroSettings | None = None
    """DeepSpeed's bucket sizes and persistence threshold a ZeRO estimate uses: a trainer's DeepSpeed config read (its
    route sets it); None: DeepSpeed's defaults."""

    def replace(self, **changes: Any) -> EstimateRequest:
        """The same request with ``changes`` (field names as keywords)."""
        return dataclasses.replace(self, **changes)

    def checked(self) -> EstimateRequest:
        """The request with its sharding (``gpus``, ``strategy``) and budget checked and normalised; a MemlabError
        saying what to write where one is wrong. (The GPU kind was resolved, an unknown one refused, where the request
        was made: :func:`memlab.estimate`.)"""
        gpus, strategy = check_sharding(self.gpus, self.strategy)
        return self.replace(gpus=gpus, strategy=strategy, budget=parse_budget(self.budget))

    @property
    def sharded(self) -> bool:
        """Whether training is sharded over GPUs (a strategy other than ``"none"``)."""
        return self.strategy != "none"

    @property
    def training_plan(self) -> Plan:
        """The plan as a training :class:`~memlab.plan.Plan` (default ``Plan()``)."""
        return Plan() if self.plan is None else cast(Plan, self.plan)

