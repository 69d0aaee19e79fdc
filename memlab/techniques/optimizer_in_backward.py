"""The optimizer in backward: each trainable parameter has its own optimizer, stepped (and its gradient freed) in the
parameter's post-accumulate-grad hook, so the gradients never all exist at once (as torchtune's
``optimizer_in_bwd``). Peak gradients drop from all of them to about the largest parameter's.

It cannot accumulate (each backward steps), nor unscale fp16 gradients all together first (GradScaler), nor offload
the optimizer: the plan refuses those combinations (:mod:`memlab.techniques.levers.step`).

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
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from memlab.techniques.technique import StepParts, Technique, Undo

if TYPE_CHECKING:
    pass


__all__ = ["IN_BACKWARD", "InBackward", "InBackwardStepping", "OptimizerInBackward"]


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
        >>> from memlab.techniques.technique import StepParts
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
