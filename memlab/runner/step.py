"""One optimizer step of a plan on a live model: the techniques put together.

``TrainingStep`` is what ``apply`` hands the user and what every trial runs, so the measured step and the applied
step are the same code.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch
from torch import nn

from memlab.live.batch import Batch, LossFn, batch_device, check_loss, map_tensors, resolve_loss_fn
from memlab.live.device import model_device
from memlab.live.structure import trainable_parameters
from memlab.plan import Plan
from memlab.techniques.accumulation import micro_batches, scale_loss
from memlab.techniques.adapters import attach_adapter
from memlab.techniques.checkpointing import disable_checkpointing, enable_checkpointing, is_checkpointing
from memlab.techniques.loss import loss_for_plan
from memlab.techniques.offload import OffloadedOptimizer, activation_offload, offload_notes
from memlab.techniques.optimizer import build_optimizer, optimizer_notes
from memlab.techniques.precision import autocast, check_precision, grad_scaler
from memlab.techniques.registry import stepping
from memlab.techniques.weights import cast_weights


class Phases(Protocol):
    """What a memory tracker offers the step: a category for new allocations, and re-labelling of tensors."""

    def phase(self, category: str) -> contextlib.AbstractContextManager[None]: ...

    def mark(self, tensors: Any, category: str) -> None: ...


class _NoPhases:
    def phase(self, category: str) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def mark(self, tensors: Any, category: str) -> None:
        return None


NO_PHASES = _NoPhases()


class OptimizerStepping(Protocol):
    """How the optimizer step runs where a lever changes it (a lever's ``stepping`` facet in
    :data:`memlab.techniques.registry.REGISTRY` gives one for the plan).

    ``install`` puts it on the model's trainable ``parameters``, building optimizers with ``build`` (the plan's
    optimizer over the parameters given), and returns what takes it off again. ``optimizer`` is then what the step
    (and ``Applied.optimizer``) holds. Where ``steps_in_backward`` is True the parameters step during backward, so
    the step calls neither ``optimizer.step()`` nor ``zero_grad()`` after it; ``watch(on_grad)`` asks it to call
    ``on_grad(parameter)`` on each gradient before stepping it (None: stop), which is how a tracked step labels
    gradients that live only for a moment.
    """

    steps_in_backward: bool

    @property
    def optimizer(self) -> Any: ...

    def install(
        self,
        model: nn.Module,
        parameters: Sequence[nn.Parameter],
        build: Callable[[Sequence[nn.Parameter]], torch.optim.Optimizer],
    ) -> Callable[[], None]: ...

    def watch(self, on_grad: Callable[[nn.Parameter], None] | None) -> None: ...


class TrainingStep:
    """A model prepared for a plan: checkpointing on, its optimizer built, ready to run optimizer steps.

    Call ``close()`` to take checkpointing off again (weights keep what training did). ``optimizer_device_type``
    chooses whose optimizer defaults to build with (default: the model's device; a dry run on CPU kernels for a
    CUDA estimate passes ``"cuda"``).

    Example:
        >>> model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
        >>> step = TrainingStep(model, Plan(accumulation=2, micro_batch=2), loss_fn=lambda m, b: m(b).mean())
        >>> isinstance(step(torch.randn(4, 4)), float)
        True
        >>> step.close()
    """

    def __init__(
        self,
        model: nn.Module,
        plan: Plan,
        *,
        loss_fn: LossFn | None = None,
        lr: float = 1e-5,
        optimizer_device_type: str | None = None,
    ) -> None:
        self.model = model
        self.plan = plan
        self.device = model_device(model)
        # Checked before the model is touched: a chunked loss that cannot apply is refused here.
        self.loss_fn = loss_for_plan(model, plan, loss_fn)
        self._undo_checkpointing: Callable[[], None] | None = None
        # Adapters first: they decide which weights train, and so which weights pure bf16 casts back afterwards.
        self._undo_model: list[Callable[[], None]] = []
        try:
            for put_on in (attach_adapter, cast_weights):
                undo = put_on(model, plan)
                if undo is not None:
                    self._undo_model.append(undo)
            self.parameters = trainable_parameters(model)
            self.notes = (
                check_precision(plan, self.device, self.parameters)
                + offload_notes(plan, self.device)
                + _weights_notes(plan, self.parameters)
                + optimizer_notes(plan, optimizer_device_type or self.device.type, self.parameters)
            )
            self._stepping: OptimizerStepping | None = stepping(plan)
            self.optimizer = self._build_optimizer(lr, optimizer_device_type or self.device.type)
        except BaseException:
            self._take_off_model_changes()
            raise
        if plan.checkpointing:
            self._undo_checkpointing = enable_checkpointing(model)
        elif is_checkpointing(model):
            self._undo_checkpointing = disable_checkpointing(model)
        self.scaler = grad_scaler(plan, self.device)
        # Set once, not every step: a user who puts a submodule in eval mode between steps (a frozen
        # BatchNorm, say) keeps it that way.
        model.train()

    def _build_optimizer(self, lr: float, device_type: str) -> Any:
        def make(parameters: Any) -> torch.optim.Optimizer:
            return build_optimizer(parameters, self.plan, lr, device_type=device_type)

        if self._stepping is not None:
            self._undo_model.append(self._stepping.install(self.model, self.parameters, make))
            return self._stepping.optimizer
        if self.plan.offloads_optimizer and self.device.type != "cpu":
            return OffloadedOptimizer(self.parameters, make)
        return make(self.parameters)

    @property
    def _steps_in_backward(self) -> bool:
        return self._stepping is not None and self._stepping.steps_in_backward

    def __call__(self, batch: Batch, tracker: Phases = NO_PHASES) -> float:
        """One optimizer step over one effective batch; returns the mean micro-batch loss as a float."""
        loss_fn = self.loss_fn or resolve_loss_fn(batch, None)
        # Gradients left by the user's own backward, or by a step that failed half-way, must not leak in.
        self.optimizer.zero_grad(set_to_none=True)
        with torch.enable_grad():
            return self._step(batch, loss_fn, tracker)

    def _step(self, batch: Batch, loss_fn: LossFn, tracker: Phases) -> float:
        with tracker.phase("other"):
            parts = micro_batches(_on_device(batch, self.device), self.plan)
            if self.plan.weights == "bf16":
                # Pure bf16 computes in bf16 throughout: float inputs come in at the weights' dtype.
                parts = [map_tensors(part, _as_bf16) for part in parts]
        total = torch.zeros((), device=self.device)
        # While tracking, a gradient is labelled the moment it is accumulated, so that a peak inside backward
        # counts it as a gradient rather than as an activation.
        hooks = self._mark_grads(tracker)
        try:
            self._accumulate(parts, loss_fn, total, tracker)
        except BaseException:
            self.optimizer.zero_grad(set_to_none=True)
            raise
        finally:
            for hook in hooks:
                hook.remove()
            if self._stepping is not None and self._steps_in_backward:
                self._stepping.watch(None)
        del parts
        if self._steps_in_backward:
            return float(total.item())
        with tracker.phase("other"):
            if self.scaler is not None:
                self.scaler.step(self.optimizer)
                self.scaler.update()
            else:
                self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        return float(total.item())

    def _mark_grads(self, tracker: Phases) -> list[Any]:
        if tracker is NO_PHASES:
            return []

        def mark(param: torch.Tensor) -> None:
            tracker.mark([param.grad], "grads")

        if self._stepping is not None and self._steps_in_backward:
            # Its own hooks may step and free a gradient at once: it marks them first.
            self._stepping.watch(mark)
            return []
        return [p.register_post_accumulate_grad_hook(mark) for p in self.parameters]

    def _accumulate(self, parts: list[Batch], loss_fn: LossFn, total: torch.Tensor, tracker: Phases) -> None:
        for part in parts:
            with tracker.phase("activations"):
                with autocast(self.plan, self.device), activation_offload(self.plan, self.device):
                    loss = check_loss(loss_fn(self.model, part))
                scaled = scale_loss(loss.float(), self.plan)
                if self.scaler is not None:
                    self.scaler.scale(scaled).backward()
                else:
                    scaled.backward()
                total += scaled.detach()
                del loss, scaled

    def close(self) -> None:
        """Take the plan off the model: checkpointing's previous setting, adapters and weight dtypes come back
        exactly (trained weights keep what training did)."""
        if self._undo_checkpointing is not None:
            self._undo_checkpointing()
            self._undo_checkpointing = None
        self._take_off_model_changes()

    def _take_off_model_changes(self) -> None:
        while self._undo_model:
            self._undo_model.pop()()


def _on_device(batch: Batch, device: torch.device) -> Batch:
    source = batch_device(batch)
    if source is None or source == device:
        return batch
    return map_tensors(batch, lambda tensor: tensor.to(device, non_blocking=True))


def model_weights(plan: Plan, parameters: list[nn.Parameter]) -> str | None:
    """``"bf16"`` or ``"fp16"`` when the plan keeps the model's dtypes and the model's trained weights are all
    held in that dtype (loaded so); None otherwise.

    Example:
        >>> model_weights(Plan(), [nn.Parameter(torch.zeros(2, dtype=torch.bfloat16))])
        'bf16'
    """
    if plan.weights != "fp32" or plan.adapter != "none" or not parameters:
        return None
    for dtype, name in ((torch.bfloat16, "bf16"), (torch.float16, "fp16")):
        if all(p.dtype == dtype for p in parameters):
            return name
    return None


def _weights_notes(plan: Plan, parameters: list[nn.Parameter]) -> list[str]:
    """A note when the model itself is held in bf16, so that weights='fp32' trains bf16 weights anyway."""
    if model_weights(plan, parameters) == "bf16":
        return ["the model's weights are bf16 (loaded in bf16): this trains pure bf16, as weights='bf16' does"]
    return []


def _as_bf16(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to(torch.bfloat16) if tensor.is_floating_point() else tensor
