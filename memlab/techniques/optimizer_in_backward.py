"""The optimizer in backward: each trainable parameter has its own optimizer, stepped (and its gradient freed) in the
parameter's post-accumulate-grad hook, so the gradients never all exist at once (as torchtune's
``optimizer_in_bwd``). Peak gradients drop from all of them to about the largest parameter's.

It cannot accumulate (each backward steps), nor unscale fp16 gradients all together first (GradScaler), nor offload
the optimizer: the plan refuses those combinations (its declaration, :data:`DECLARATIONS`, below).

Example:
    >>> from memlab.plan import Plan
    >>> from torch import nn
    >>> model = nn.Linear(4, 2)
    >>> with_it = InBackwardStepping()
    >>> undo = with_it.install(model, list(model.parameters()), lambda ps: torch.optim.AdamW(ps, lr=0.1))
    >>> model(torch.ones(3, 4)).sum().backward()
    >>> model.weight.grad is None, len(with_it.optimizer.state)  # stepped and freed in backward
    (True, 2)
    >>> undo()
    >>> len(model.weight._post_accumulate_grad_hooks)
    0
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from memlab.techniques.core.fragments import Accelerate, Code, Export, Fragment, Keys, concerns_adapters_only
from memlab.techniques.core.lever import Lever, PlanLike
from memlab.techniques.core.technique import StepParts, Technique, Undo
from memlab.techniques.offload import OPTIMIZER_OFFLOADS, SHARDED_ONLY
from memlab.techniques.optimizer import OPTIMIZER_FORMS

__all__ = ["DECLARATIONS", "IN_BACKWARD", "InBackward", "InBackwardStepping", "OptimizerInBackward"]


class OptimizerInBackward(torch.optim.Optimizer):
    """One optimizer over per-parameter optimizers that step in backward (torchtune's
    ``OptimizerInBackwardWrapper``, as a ``torch.optim.Optimizer``).

    Its ``param_groups`` are the inner optimizers' own group dicts, so an LR scheduler or a hand-set ``lr`` drives
    them all; its ``state`` is the one dict they all keep their state in (the parameters are distinct keys), so
    ``state_dict()`` / ``load_state_dict()`` hold everything. ``step()`` does nothing: the parameters stepped
    already, in backward.

    Example:
        >>> layer = nn.Linear(2, 2)
        >>> optimizer = OptimizerInBackward({p: torch.optim.AdamW([p], lr=1e-3) for p in layer.parameters()})
        >>> scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.5)
        >>> [group["lr"] for inner in optimizer.optimizers.values() for group in inner.param_groups]
        [0.0005, 0.0005]
    """

    def __init__(self, optimizers: dict[nn.Parameter, torch.optim.Optimizer]) -> None:
        self.optimizers = optimizers
        first = next(iter(optimizers.values()))
        super().__init__(list(optimizers), dict(first.defaults))
        self._share_groups_and_state(loaded=False)

    def _share_groups_and_state(self, *, loaded: bool) -> None:
        if loaded:
            # load_state_dict made new group dicts, in the order of the inner optimizers': they take them over.
            groups = iter(self.param_groups)
            for inner in self.optimizers.values():
                inner.param_groups = [next(groups) for _ in inner.param_groups]
        self.param_groups = [group for inner in self.optimizers.values() for group in inner.param_groups]
        for parameter, inner in self.optimizers.items():
            self.state[parameter].update(inner.state.get(parameter, {}))
            inner.state = self.state

    def step(self, closure: Callable[[], Any] | None = None) -> None:  # type: ignore[override]
        return None

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        self._share_groups_and_state(loaded=True)


class InBackwardStepping:
    """The optimizer step in backward: one optimizer per parameter, stepped in its post-accumulate-grad hook."""

    steps_in_backward = True

    def __init__(self) -> None:
        self._optimizer: OptimizerInBackward | None = None
        self._on_grad: Callable[[nn.Parameter], None] | None = None

    @property
    def optimizer(self) -> OptimizerInBackward:
        if self._optimizer is None:
            raise RuntimeError("install() builds the optimizers first")
        return self._optimizer

    def install(
        self,
        model: nn.Module,
        parameters: Sequence[nn.Parameter],
        build: Callable[[Sequence[nn.Parameter]], torch.optim.Optimizer],
    ) -> Callable[[], None]:
        """One optimizer per parameter (``build([parameter])``), stepped in the parameter's post-accumulate-grad
        hook; returns what removes the hooks."""
        self._optimizer = OptimizerInBackward({parameter: build([parameter]) for parameter in parameters})
        handles = [parameter.register_post_accumulate_grad_hook(self._step) for parameter in parameters]

        def undo() -> None:
            for handle in handles:
                handle.remove()

        return undo

    def watch(self, on_grad: Callable[[nn.Parameter], None] | None) -> None:
        self._on_grad = on_grad

    def _step(self, parameter: torch.Tensor) -> None:
        if self._on_grad is not None:
            self._on_grad(parameter)  # type: ignore[arg-type]
        inner = self.optimizer.optimizers[parameter]  # type: ignore[index]
        inner.step()
        inner.zero_grad(set_to_none=True)


class InBackward(Technique):
    """``optimizer_in_backward``: one optimizer per parameter (the plan's, as ``parts.make_optimizer`` builds it),
    stepped in the parameter's post-accumulate-grad hook; the step then steps nothing after backward.

    Example:
        >>> from memlab.plan import Plan
        >>> from memlab.techniques.optimizer import OPTIMIZER
        >>> from memlab.techniques.core.technique import StepParts
        >>> parts = StepParts(nn.Linear(2, 2), Plan(optimizer_in_backward=True), torch.device("cpu"))
        >>> OPTIMIZER.put_on(parts); undo = IN_BACKWARD.put_on(parts)
        >>> parts.steps_in_backward, type(parts.optimizer).__name__
        (True, 'OptimizerInBackward')
        >>> undo()
    """

    def put_on(self, parts: StepParts) -> Undo | None:
        if not parts.plan.optimizer_in_backward:
            return None
        if parts.make_optimizer is None:
            raise RuntimeError("the optimizer's technique goes on before optimizer_in_backward's")
        stepping = InBackwardStepping()
        undo = stepping.install(parts.model, parts.parameters, parts.make_optimizer)
        parts.optimizer = stepping.optimizer
        parts.steps_in_backward = True
        parts.watch_grads = stepping.watch
        return undo


IN_BACKWARD = InBackward()


def _in_backward_conflicts(plan: PlanLike) -> str:
    if not plan.optimizer_in_backward:
        return ""
    if plan.accumulation > 1:
        return (
            "optimizer_in_backward steps in backward, so it cannot accumulate; write accumulation=1 (a larger "
            "micro_batch) or optimizer_in_backward=False"
        )
    if plan.offload in OPTIMIZER_OFFLOADS and plan.offload != SHARDED_ONLY:  # "params": sharded, refused alone
        return (
            "optimizer_in_backward steps each parameter on the device during backward, so it cannot offload the "
            f"optimizer (offload={plan.offload!r}); write offload='none' or 'activations', "
            "or optimizer_in_backward=False"
        )
    if plan.precision == "fp16":
        return (
            "optimizer_in_backward steps each parameter before the other gradients exist, so fp16's GradScaler "
            "cannot unscale them all first; write precision='bf16' or 'fp32', or optimizer_in_backward=False"
        )
    return ""


def _in_backward_elsewhere(target: str) -> Export:
    def refusal(plan: PlanLike) -> Fragment:
        if not plan.optimizer_in_backward:
            return Keys() if target in ("trainer", "deepspeed") else Accelerate()
        return (
            f"optimizer_in_backward=True is not expressible in {target}; use the code export (plan.to_code()), "
            "or export plan.replace(optimizer_in_backward=False)"
        )

    return refusal


def _in_backward_code(plan: PlanLike) -> Fragment:
    if not plan.optimizer_in_backward:
        return Code()
    form = OPTIMIZER_FORMS[plan.optimizer]
    extra = ', fused=device.type in ("cuda", "cpu")' if plan.optimizer == "adamw" else (
        f", {form.keywords}" if form.keywords else "")
    return Code(after_optimizer=(
        "# Optimizer in backward: each parameter has its own optimizer, stepped as soon as its gradient is",
        "# accumulated, so the gradients never all exist at once (`optimizer.step()` below finds none: a no-op)",
        f"optimizers = {{p: {form.make}([p], lr=lr{extra}) for p in params}}",
        "",
        "",
        "def step_in_backward(p):",
        "    optimizers[p].step()",
        "    optimizers[p].zero_grad(set_to_none=True)",
        "",
        "",
        "for p in params:",
        "    p.register_post_accumulate_grad_hook(step_in_backward)",
    ))


DECLARATIONS = (
    Lever(
        "optimizer_in_backward",
        False,
        short="opt-in-bwd",
        help="each weight gets its own optimizer, stepped in backward as soon as its gradient exists: the gradients "
        "never all exist at once (about the largest weight's instead of all); no accumulation, fp16 or optimizer "
        "offload with it",
        technique=IN_BACKWARD,
        conflicts=_in_backward_conflicts,
        needs_at_least=lambda mine, theirs: not mine,
        family=True,
        least_grads={True: 0.0},
        exports={
            "trainer": _in_backward_elsewhere("TrainingArguments"),
            "deepspeed": _in_backward_elsewhere("a DeepSpeed config (ZeRO steps its optimizer after backward)"),
            "code": _in_backward_code,
            "peft": concerns_adapters_only,
            "accelerate": _in_backward_elsewhere("the accelerate script (sharded optimizers step after backward)"),
        },
    ),
)
"""The ``optimizer_in_backward`` lever (:data:`memlab.techniques.core.registry.REGISTRY` gathers it)."""
