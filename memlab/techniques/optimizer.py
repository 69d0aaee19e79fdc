"""The optimizer of a plan, over the trainable parameters only: torch AdamW (fused where the device has it, as
the Trainer builds it, or foreach, as a plain loop's ``torch.optim.AdamW(params)`` runs on CUDA), bitsandbytes'
8-bit AdamW (paged on CUDA), or Adafactor."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from memlab.errors import MemlabError
from memlab.techniques.technique import PlanFields, StepParts, Technique, Undo

# Devices whose fused AdamW kernel torch 2.x has (the Trainer's default optim is "adamw_torch_fused" from torch 2.8).
FUSED_ADAMW_DEVICES = ("cuda", "cpu")

PAGED_ON_CPU = "paged_adamw8bit pages its state only on CUDA: on cpu this is the unpaged 8-bit AdamW (same state)"
PAGED_ESTIMATED = (
    "paged_adamw8bit is estimated as the unpaged 8-bit AdamW: its state counted on the device, where it stays "
    "until the GPU runs short"
)
FOREACH_ON_CPU = (
    "adamw_foreach runs torch's foreach AdamW on cpu too, as a plain loop's torch.optim.AdamW(params) does on CUDA "
    "(on a CPU that loop gets the for-loop update, whose temporaries are one weight's size)"
)
PAGED_OUTSIDE_ALLOCATOR = (
    "paged_adamw8bit: bitsandbytes keeps the 8-bit state of tensors of 100k elements or more in CUDA unified memory, "
    "outside PyTorch's allocator, so it is not in the peak; the driver pages it to CPU memory when the GPU runs short"
)


def build_optimizer(
    parameters: Sequence[nn.Parameter],
    plan: PlanFields,
    lr: float,
    *,
    device_type: str | None = None,
    fused: bool | None = None,
) -> torch.optim.Optimizer:
    """A fresh optimizer of the plan's kind for ``parameters``, as the Hugging Face Trainer builds it on
    ``device_type`` (default: the parameters' device).

    - ``"adamw"``: ``torch.optim.AdamW``, fused where torch has the kernel (CUDA and CPU; the Trainer's default
      ``optim="adamw_torch_fused"`` from torch 2.8): one kernel per update, no temporaries the size of the
      weights. ``fused=False`` asks for torch's own choice without fusing (foreach on CUDA, whose temporaries are
      part of the peak); ``fused=True`` insists.
    - ``"adamw8bit"`` / ``"paged_adamw8bit"``: bitsandbytes' ``AdamW8bit`` / ``PagedAdamW8bit``; paging exists only
      on CUDA, so elsewhere the paged plan builds the unpaged optimizer (:func:`optimizer_notes` says so).
    - ``"adafactor"``: ``transformers.optimization.Adafactor`` with the Trainer's settings for
      ``optim="adafactor"`` (``scale_parameter=False, relative_step=False``, the given ``lr``, no first moment).
    - ``"adamw_foreach"``: ``torch.optim.AdamW(parameters, lr=lr, foreach=True)`` on every device: what a plain
      loop's ``torch.optim.AdamW(params)`` runs on CUDA (and the Trainer's ``optim="adamw_torch"``). Its update
      holds ``torch._foreach_sqrt`` of the second moments, a temporary as large as the trained weights (per
      group of one device and dtype); the bias corrections are Python numbers, not tensors.

    Example:
        >>> from memlab.plan import Plan
        >>> layer = nn.Linear(4, 4)
        >>> optimizer = build_optimizer(list(layer.parameters()), Plan(), lr=1e-3)
        >>> type(optimizer).__name__, optimizer.defaults["fused"]
        ('AdamW', True)
        >>> type(build_optimizer(list(layer.parameters()), Plan(optimizer="adafactor"), lr=1e-3)).__name__
        'Adafactor'
        >>> build_optimizer(list(layer.parameters()), Plan(optimizer="adamw_foreach"), lr=1e-3).defaults["foreach"]
        True
    """
    if not parameters:
        raise MemlabError("the model has no trainable parameters; set requires_grad=True on what should train")
    device_type = device_type or parameters[0].device.type
    if plan.optimizer in ("adamw8bit", "paged_adamw8bit"):
        # Imported here: bitsandbytes is heavy and prints at import; `import memlab` must not pull it in.
        import bitsandbytes

        paged = plan.optimizer == "paged_adamw8bit" and device_type == "cuda" and _real_cuda(parameters[0])
        kind = bitsandbytes.optim.PagedAdamW8bit if paged else bitsandbytes.optim.AdamW8bit
        optimizer = kind(parameters, lr=lr)
        optimizer.mng = _own_override_manager(optimizer, parameters)
        return optimizer
    if plan.optimizer == "adafactor":
        # transformers' Adafactor rather than torch.optim.Adafactor: it is what the Trainer's optim="adafactor"
        # (memlab's export) builds, so the plan measured is the plan exported. torch's differs in its defaults
        # (a relative step size, a beta2 decay schedule) and keeps a step tensor per parameter.
        from transformers.optimization import Adafactor

        return Adafactor(parameters, lr=lr, scale_parameter=False, relative_step=False)
    if plan.optimizer == "adamw_foreach":
        # Asked for on any device: a CPU run and a dry run on CPU kernels then hold the temporaries CUDA's does.
        return torch.optim.AdamW(parameters, lr=lr, foreach=True)
    if fused is None:
        fused = device_type in FUSED_ADAMW_DEVICES and all(p.is_floating_point() for p in parameters)
    if fused:
        return torch.optim.AdamW(parameters, lr=lr, fused=True)
    # torch picks foreach by itself on real CUDA tensors; a dry run for CUDA on CPU kernels must ask for it.
    return torch.optim.AdamW(parameters, lr=lr, foreach=True if device_type == "cuda" else None)


def optimizer_notes(plan: PlanFields, device_type: str, parameters: Sequence[torch.Tensor] = ()) -> list[str]:
    """What a trial's notes say about the plan's optimizer on ``device_type`` for ``parameters`` (fake ones: a dry
    run, which pages nothing).

    Example:
        >>> from memlab.plan import Plan
        >>> optimizer_notes(Plan(optimizer="paged_adamw8bit"), "cpu") == [PAGED_ON_CPU]
        True
        >>> optimizer_notes(Plan(), "cpu")
        []
    """
    if plan.optimizer == "adamw_foreach" and device_type == "cpu":
        return [FOREACH_ON_CPU]
    if plan.optimizer != "paged_adamw8bit":
        return []
    if device_type != "cuda":
        return [PAGED_ON_CPU]
    if parameters and not _real_cuda(parameters[0]):
        return [PAGED_ESTIMATED]
    return [PAGED_OUTSIDE_ALLOCATOR]


def _real_cuda(tensor: torch.Tensor) -> bool:
    from torch._subclasses.fake_tensor import is_fake

    return tensor.device.type == "cuda" and not is_fake(tensor)


def _own_override_manager(optimizer: torch.optim.Optimizer, parameters: Sequence[nn.Parameter]) -> Any:
    """A bitsandbytes override manager holding only the overrides that name these parameters.

    bitsandbytes keeps overrides on a process-wide singleton, keyed partly by (group, position) and never cleared:
    after the Trainer has registered 32-bit embeddings for one model, every later 8-bit optimizer would keep
    32-bit state at those positions. A private copy keeps what the user set for these parameters and nothing else.
    """
    from bitsandbytes.optim import GlobalOptimManager

    shared = GlobalOptimManager.get_instance()
    own = GlobalOptimManager.__new__(GlobalOptimManager)
    own.initialize()
    ours = {id(p) for p in parameters}
    own.module_weight_config_triple = [
        (module, name, config)
        for module, name, config in shared.module_weight_config_triple
        if id(getattr(module, name, None)) in ours
    ]
    own.pid2config = {key: config for key, config in shared.pid2config.items() if key in ours}
    own.uses_config_override = bool(own.pid2config or own.module_weight_config_triple)
    for group_index, group in enumerate(optimizer.param_groups):
        for position, parameter in enumerate(group["params"]):
            if id(parameter) in own.pid2config:
                own.index2config[(group_index, position)] = own.pid2config[id(parameter)]
    return own


def state_tensors(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """Every tensor the optimizer keeps as state (moments, quantization maps, step counters)."""
    target = getattr(optimizer, "inner", optimizer)
    return [value for state in target.state.values() for value in state.values() if isinstance(value, torch.Tensor)]


class Optimizer(Technique):
    """``optimizer``: how the step's optimizer is built (:func:`build_optimizer`, as the Trainer builds it on
    ``parts.optimizer_device_type``); a dry run of paged 8-bit AdamW for CUDA counts its state on the device.

    Example:
        >>> from memlab.plan import Plan
        >>> from memlab.techniques.technique import StepParts
        >>> parts = StepParts(nn.Linear(2, 2), Plan(optimizer="adafactor"), torch.device("cpu"))
        >>> OPTIMIZER.put_on(parts); type(parts.make_optimizer(parts.parameters)).__name__
        'Adafactor'
    """

    def put_on(self, parts: StepParts) -> Undo | None:
        plan, lr, device_type = parts.plan, parts.lr, parts.optimizer_device_type
        parts.make_optimizer = lambda parameters: build_optimizer(parameters, plan, lr, device_type=device_type)
        return None

    def notes(self, parts: StepParts) -> list[str]:
        if self._paged_estimated(parts):
            return []
        return optimizer_notes(parts.plan, parts.optimizer_device_type, parts.parameters)

    def dry_run(self, parts: StepParts) -> list[str]:
        return [PAGED_ESTIMATED] if self._paged_estimated(parts) else []

    @staticmethod
    def _paged_estimated(parts: StepParts) -> bool:
        return parts.plan.optimizer == "paged_adamw8bit" and parts.optimizer_device_type == "cuda" and parts.fake


OPTIMIZER = Optimizer()
