"""The one shape of a technique, and the parts of a training step that techniques fill in.

A :class:`Technique` is what a lever's declaration (:class:`memlab.techniques.core.lever.Lever`) names as its
``technique``. :class:`memlab.runner.step.TrainingStep` makes a :class:`StepParts` with the plain step (the whole
batch at once, no forward context, ``loss.backward()``, ``optimizer.step()``), then puts each technique on in the
registry's declared order (:func:`memlab.techniques.core.registry.step_techniques`): each may change the model and
return what undoes that, and may replace or add parts of the step. The step then runs the parts; it names no lever.
This is the shape of Lightning Fabric's ``Precision`` plugins (``convert_module``, ``forward_context``, ``backward``,
``optimizer_step``), spread over every lever rather than precision alone.

Example:
    >>> from torch import nn
    >>> class Halve(Technique):
    ...     def put_on(self, parts):
    ...         parts.loss_scales.append(lambda loss: loss / 2)
    ...         return None
    >>> parts = StepParts(nn.Linear(2, 1), plan=None, device=torch.device("cpu"))
    >>> Halve().put_on(parts); parts.scale(torch.tensor(4.0)).item()
    2.0
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import nn

from memlab.live.batch import Batch, LossFn

Undo = Callable[[], None]
"""What takes a technique off again, exactly."""


@dataclass(frozen=True, match_args=False)  # frozen: its fields read-only, as a Plan's are (for mypy)
class PlanFields(Protocol):
    """What a technique reads of a :class:`memlab.Plan`: its levers' values. The techniques name this shape rather
    than the Plan, because the Plan builds on them (its levers are the registry's); a Plan is one.

    Example:
        >>> from memlab.plan import Plan
        >>> def precision_of(plan: PlanFields) -> str:
        ...     return plan.precision
        >>> precision_of(Plan(precision="bf16"))
        'bf16'
    """

    micro_batch: int | None
    accumulation: int
    precision: str
    weights: str
    optimizer: str
    offload: str
    adapter: str
    lora_targets: str | tuple[str, ...]
    loss: str
    compile: bool



class HostLedger:
    """The host memory a step's levers hold, by their own accounting: what they keep between steps (``resident``:
    each source says its bytes when asked, such as an offloaded optimizer's copies and state) and what comes and goes
    within a step (offloaded activations, counted with :meth:`add` and :meth:`remove`); :attr:`peak` is the most at
    once: the resident bytes and the most held within a step.

    Example:
        >>> ledger = HostLedger()
        >>> ledger.resident.append(lambda: 100); ledger.add(50); ledger.add(30); ledger.remove(80)
        >>> ledger.peak, ledger.held
        (180, 0)
    """

    def __init__(self) -> None:
        self.resident: list[Callable[[], int]] = []
        self.held = 0
        self.held_peak = 0

    @property
    def peak(self) -> int:
        """The resident bytes now and the most held within a step so far."""
        return sum(source() for source in self.resident) + self.held_peak

    def add(self, nbytes: int) -> None:
        """Count ``nbytes`` more held within the step."""
        self.held += nbytes
        self.held_peak = max(self.held_peak, self.held)

    def remove(self, nbytes: int) -> None:
        """Count ``nbytes`` given back."""
        self.held -= nbytes


@dataclass
class StepParts:
    """The parts of one optimizer step, as the techniques leave them.

    Args:
        model: the live model (techniques change it in place and undo that).
        plan: the :class:`memlab.Plan` being put on.
        device: where the model lives.
        optimizer_device_type: whose optimizer defaults to build with (a CUDA dry run on CPU kernels: ``"cuda"``).
        lr: the learning rate of the optimizer built.
        loss_fn: the loss of a micro-batch (None: the batch's default loss).
        split: a batch -> the micro-batches of one optimizer step.
        input_casts: applied to every tensor of each micro-batch, in order.
        forward_contexts: made afresh for each micro-batch's forward (and so its saved tensors).
        loss_scales: applied to each micro-batch's loss before backward, in order.
        backward: runs backward of a scaled loss.
        make_optimizer: builds an optimizer over parameters (the optimizer lever sets it).
        optimizer: the step's optimizer where a technique builds it itself (offloaded, in backward); None: the
            step builds ``make_optimizer(parameters)``.
        optimizer_step: steps the optimizer after the last backward.
        steps_in_backward: the parameters step during backward: no ``optimizer_step`` after it.
        watch_grads: where ``steps_in_backward``: ``watch_grads(on_grad)`` asks for ``on_grad(parameter)`` on each
            gradient before it is stepped and freed (None: stop).
        host: what the levers hold in host memory (:class:`HostLedger`), by their own accounting.
        compiled: the model's forward runs under ``torch.compile`` (the runner reads such a step's peak from the
            allocator: a dispatch mode would run it eagerly, and compiled kernels allocate past the dispatcher).
        late_notes: notes a technique learns only while steps run (a dry run's compile that fell back to eager);
            the trial's notes (the training workload hands its record's list here).
    """

    model: nn.Module
    plan: Any
    device: torch.device
    optimizer_device_type: str = ""
    lr: float = 1e-5
    loss_fn: LossFn | None = None
    split: Callable[[Batch], list[Batch]] = field(default=lambda batch: [batch])
    input_casts: list[Callable[[torch.Tensor], torch.Tensor]] = field(default_factory=list)
    forward_contexts: list[Callable[[], contextlib.AbstractContextManager[Any]]] = field(default_factory=list)
    loss_scales: list[Callable[[torch.Tensor], torch.Tensor]] = field(default_factory=list)
    backward: Callable[[torch.Tensor], None] = field(default=lambda loss: loss.backward())
    make_optimizer: Callable[[Sequence[nn.Parameter]], torch.optim.Optimizer] | None = None
    optimizer: Any = None
    optimizer_step: Callable[[Any], None] = field(default=lambda optimizer: optimizer.step())
    steps_in_backward: bool = False
    watch_grads: Callable[[Callable[[nn.Parameter], None] | None], None] | None = None
    host: HostLedger = field(default_factory=HostLedger)
    compiled: bool = False
    late_notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.optimizer_device_type = self.optimizer_device_type or self.device.type

    @property
    def parameters(self) -> list[nn.Parameter]:
        """The parameters that train now (after the techniques put on before the one asking)."""
        seen: dict[int, nn.Parameter] = {}
        for parameter in self.model.parameters():
            if parameter.requires_grad:
                seen.setdefault(id(parameter), parameter)
        return list(seen.values())

    @property
    def fake(self) -> bool:
        """Whether the model's weights are fake tensors (a dry run)."""
        from torch._subclasses.fake_tensor import FakeTensor

        return any(isinstance(p, FakeTensor) for p in self.model.parameters())

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        """``loss`` through every ``loss_scales`` entry, in order."""
        for scale in self.loss_scales:
            loss = scale(loss)
        return loss

    def forward_context(self) -> contextlib.ExitStack:
        """Every technique's forward context, entered in order (leave the returned stack to leave them)."""
        stack = contextlib.ExitStack()
        for make in self.forward_contexts:
            stack.enter_context(make())
        return stack


class Technique:
    """One lever's technique: ``put_on`` changes the model and the step's parts and returns what undoes the model
    changes (None where it changed only parts); ``notes`` says what a trial should know (after every technique is
    on); ``dry_run`` says, as notes, what a dry run on fake tensors makes of the plan's value (none where it runs the
    same step).
    Each default changes nothing, so a technique overrides only what it does.

    Example:
        >>> Technique().notes(None)
        []
    """

    def put_on(self, parts: StepParts) -> Undo | None:
        """Put the technique on (for ``parts.plan``); return what takes its model changes off again."""
        return None

    def notes(self, parts: StepParts) -> list[str]:
        """What a trial of ``parts.plan`` should know about this technique on this device."""
        return []

    def trains_model_weights(self, model: nn.Module, plan: Any) -> bool:
        """Whether a step of ``plan`` on ``model`` with this technique still trains the model's own weights (a trial
        then keeps their values to put back); False where the technique trains weights of its own instead
        (adapters it puts on)."""
        return True

    def dry_run(self, parts: StepParts) -> list[str]:
        """What a dry run on fake tensors makes of the lever's value, as notes (none: it runs the same step)."""
        return []

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"
