"""Offload to CPU: optimizer state with the update on the CPU, and activations through ``save_on_cpu``."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import is_fake

from memlab.techniques.technique import PlanFields, StepParts, Technique, Undo

NOTHING_TO_MOVE = "offload moves nothing on a CPU-only device: memory and speed are as without it"

OPTIMIZER_OFFLOADS = ("optimizer", "all", "params")
"""The ``offload`` values that put the optimizer's state and update on the CPU (``"params"``, sharded only, puts
each GPU's shard of the weights there too)."""

PARAMS_NEED_SHARDING = (
    "offload='params' keeps each GPU's shard of the weights in CPU memory (FSDP offload_params, DeepSpeed ZeRO-3 "
    "offload_param), which needs training sharded over GPUs; on one GPU write offload='optimizer' (or 'all'), or "
    "estimate it sharded: memlab.estimate(model, batch, plan, gpus=N, strategy='fsdp2')"
)
"""Why one GPU refuses ``offload="params"``, and what to write instead."""

ACTIVATION_OFFLOADS = ("activations", "all")
"""The ``offload`` values that put the tensors saved for backward in CPU memory."""


def offloads(plan: PlanFields, part: str) -> bool:
    """Whether ``plan`` keeps ``part`` in CPU memory: ``"optimizer"``, the optimizer's state and update
    (``Plan.offloads_optimizer``), or ``"activations"``, the tensors saved for backward (``Plan.offloads_activations``).

    Example:
        >>> from memlab.plan import Plan
        >>> offloads(Plan(offload="all"), "optimizer"), offloads(Plan(offload="activations"), "optimizer")
        (True, False)
        >>> offloads(Plan(offload="activations"), "activations"), offloads(Plan(offload="optimizer"), "activations")
        (True, False)
    """
    return plan.offload in {"optimizer": OPTIMIZER_OFFLOADS, "activations": ACTIVATION_OFFLOADS}[part]


def offload_notes(plan: PlanFields, device: torch.device) -> list[str]:
    """What the plan's offload means on this device.

    Example:
        >>> from memlab.plan import Plan
        >>> offload_notes(Plan(offload="all"), torch.device("cpu"))
        ['offload moves nothing on a CPU-only device: memory and speed are as without it']
    """
    if plan.offload != "none" and device.type == "cpu":
        return [NOTHING_TO_MOVE]
    return []


def activation_offload(plan: PlanFields, device: torch.device) -> contextlib.AbstractContextManager[object]:
    """Saved activations go to (pinned) CPU memory during forward and come back for backward."""
    if not offloads(plan, "activations") or device.type == "cpu":
        return contextlib.nullcontext()
    return torch.autograd.graph.save_on_cpu(pin_memory=True)


class OffloadedOptimizer(torch.optim.Optimizer):
    """Keeps fp32 master weights and optimizer state in CPU memory and runs the update there.

    It is a real ``torch.optim.Optimizer`` whose ``param_groups`` hold the device parameters, so a ``GradScaler``
    unscales their gradients as usual and LR schedulers (``LambdaLR``, ...) and hand-set learning rates work on it:
    before each update the hyperparameters of its groups are copied to the CPU optimizer's. ``step()`` copies the
    gradients into (pinned) CPU buffers, steps the CPU optimizer, and copies the new weights back.

    Example:
        >>> layer = nn.Linear(4, 4)
        >>> optimizer = OffloadedOptimizer(list(layer.parameters()), lambda ps: torch.optim.AdamW(ps, lr=1e-3))
        >>> scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.5)
        >>> layer(torch.ones(2, 4)).sum().backward(); optimizer.step(); scheduler.step()
        >>> optimizer.param_groups[0]["lr"], optimizer.inner.param_groups[0]["lr"]
        (0.0005, 0.0005)
    """

    def __init__(
        self,
        parameters: Sequence[nn.Parameter],
        make_optimizer: Callable[[Sequence[nn.Parameter]], torch.optim.Optimizer],
    ) -> None:
        self.device_parameters = list(parameters)
        pin = torch.cuda.is_available()
        self.cpu_parameters = [
            nn.Parameter(torch.empty(p.shape, dtype=torch.float32, pin_memory=pin).copy_(p.detach()))
            for p in self.device_parameters
        ]
        self.inner = make_optimizer(self.cpu_parameters)
        super().__init__(self.device_parameters, dict(self.inner.defaults))
        # The groups' hyperparameters are the inner optimizer's (its lr, betas...), over the device parameters.
        self.param_groups[0].update({k: v for k, v in self.inner.param_groups[0].items() if k != "params"})

    def zero_grad(self, set_to_none: bool = True) -> None:
        for parameter in self.device_parameters:
            parameter.grad = None
        self.inner.zero_grad(set_to_none=set_to_none)

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> None:  # type: ignore[override]
        for outer, inner in zip(self.param_groups, self.inner.param_groups, strict=True):
            inner.update({key: value for key, value in outer.items() if key != "params"})
        for device_param, cpu_param in zip(self.device_parameters, self.cpu_parameters, strict=True):
            if device_param.grad is None:
                cpu_param.grad = None
                continue
            if cpu_param.grad is None:
                cpu_param.grad = torch.empty_like(cpu_param, pin_memory=cpu_param.is_pinned())
            cpu_param.grad.copy_(device_param.grad, non_blocking=True)
        # The copies to the host must land before the CPU steps; fake ones (a dry run) hold nothing to wait for,
        # and no CUDA call is made under a dry run's fake mode (DESIGN.md 2.4).
        if torch.cuda.is_available() and not all(is_fake(p) for p in self.device_parameters):
            torch.cuda.synchronize()
        self.inner.step()
        for device_param, cpu_param in zip(self.device_parameters, self.cpu_parameters, strict=True):
            device_param.copy_(cpu_param, non_blocking=True)

    def state_dict(self) -> dict[str, Any]:
        return self.inner.state_dict()


class Offload(Technique):
    """``offload``: saved activations through ``save_on_cpu`` during forward, the optimizer's state and update on
    the CPU (:class:`OffloadedOptimizer` over the optimizer the plan builds). On a CPU-only device there is nothing
    to move: a note says so.

    Example:
        >>> from memlab.plan import Plan
        >>> from memlab.techniques.technique import StepParts
        >>> parts = StepParts(nn.Linear(2, 2), Plan(offload="all"), torch.device("cpu"))
        >>> OFFLOAD.put_on(parts); OFFLOAD.notes(parts) == [NOTHING_TO_MOVE]
        True
    """

    def put_on(self, parts: StepParts) -> Undo | None:
        plan = parts.plan
        if parts.device.type == "cpu":
            return None
        if offloads(plan, "activations"):
            parts.forward_contexts.append(lambda: activation_offload(plan, parts.device))
        if offloads(plan, "optimizer"):
            if parts.make_optimizer is None:
                raise RuntimeError("the optimizer's technique goes on before offload's")
            parts.optimizer = OffloadedOptimizer(parts.parameters, parts.make_optimizer)
        return None

    def notes(self, parts: StepParts) -> list[str]:
        return offload_notes(parts.plan, parts.device)


OFFLOAD = Offload()
