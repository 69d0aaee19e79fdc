"""Put a plan on the live model for real training, and take it off again."""

from __future__ import annotations

import warnings
import weakref
from typing import Any, Literal

from torch import nn

from memlab.errors import MemlabError, MemlabWarning, refuse_class
from memlab.live.batch import Batch, LossFn
from memlab.live.quiet import quiet
from memlab.live.structure import ModuleStructure
from memlab.options import check_learning_rate
from memlab.plan import Plan
from memlab.runner.step import TrainingStep
from memlab.trainer.apply import apply_to_trainer
from memlab.trainer.meta import refuse_meta
from memlab.trainer.source import is_trainer

_ACTIVE: weakref.WeakKeyDictionary[nn.Module, Applied] = weakref.WeakKeyDictionary()
"""The plan applied to each model now, so that applying another first takes it off."""


class Applied:
    """A plan put on a live model: ``optimizer``, ``step(batch)`` and ``undo()``.

    Example:
        >>> import torch
        >>> model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
        >>> applied = apply(model, Plan(checkpointing=True), loss_fn=lambda m, b: m(b).pow(2).mean())
        >>> loss = applied.step(torch.randn(8, 4))
        >>> applied.undo()
    """

    active: bool
    """True from apply until undo."""

    def __init__(self, model: nn.Module, plan: Plan, *, loss_fn: LossFn | None, lr: float) -> None:
        self.model = model
        self.plan = plan
        previous = _ACTIVE.get(model)
        if previous is not None and previous.active:
            # Re-running `a = memlab.apply(model, plan)` would otherwise stack a second plan on the first one, and
            # the first could no longer be undone (its Applied is gone with the old `a`).
            previous.undo()
            warnings.warn(
                f"memlab: {previous.plan.label()} was still applied to this model; it was undone first",
                MemlabWarning,
                stacklevel=3,
            )
        self._steps = 0
        self._before = ModuleStructure.capture(model)
        self._step: TrainingStep | None = None
        try:
            # What the libraries say as the plan goes on (bitsandbytes' "Failed to load CPU gemm_4bit_forward" as
            # memlab's first import of it loads, peft's remarks) is kept out as in a trial: it changes no result.
            with quiet():
                self._step = TrainingStep(model, plan, loss_fn=loss_fn, lr=lr)
        except BaseException:
            self._before.restore()
            raise
        self._notes = list(self._step.notes)  # what the plan said stays readable after undo() releases the step
        self.active = True
        _ACTIVE[model] = self

    @property
    def optimizer(self) -> Any:
        """The optimizer the plan trains with (torch AdamW, bitsandbytes AdamW8bit, or the CPU-offloaded one); None
        after :meth:`undo`, which releases it and its state."""
        return None if self._step is None else self._step.optimizer

    @property
    def notes(self) -> list[str]:
        """What the plan's techniques said on this model (kept after :meth:`undo`)."""
        return list(self._notes)

    def step(self, batch: Batch) -> float:
        """One optimizer step over one effective batch (``micro_batch * accumulation`` rows); the loss as a float."""
        if not self.active or self._step is None:
            raise RuntimeError("this plan was undone; call memlab.apply(model, plan) again to train with it")
        loss = self._step(batch)
        self._steps += 1
        return loss

    def undo(self, adapter: Literal["merge", "keep", "discard"] | None = None) -> None:
        """Take the plan off the model (checkpointing, training flag, hooks, adapters) and release what apply built:
        the optimizer and its state (a later trial in the same kernel does not carry them). Weights keep what
        training did.

        For an adapter plan (LoRA / QLoRA), ``adapter`` says what becomes of what the adapters trained:
        ``"merge"`` adds them into the base weights (``B @ A * scaling``; for QLoRA into the full-precision weights
        that come back; a task head trained whole keeps its trained values) and takes them off; ``"keep"`` leaves
        the peft adapters, trained and trainable, on the model (on the full-precision base for QLoRA) and takes
        every other technique off; ``"discard"`` takes them off and loses their training. None (the default)
        merges, so nothing is lost, and says so with a :class:`~memlab.errors.MemlabWarning` once they have
        trained.

        Example:
            >>> import torch
            >>> model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
            >>> applied = apply(model, Plan(adapter="lora", lora_rank=2), loss_fn=lambda m, b: m(b).pow(2).mean())
            >>> applied.undo(adapter="keep"); type(model[0]).__name__, applied.optimizer
            ('Linear', None)
        """
        if adapter not in (None, "discard", "merge", "keep"):
            raise MemlabError(
                f"undo(adapter={adapter!r}) is not a choice; write undo(adapter='merge') (into the base weights), "
                "undo(adapter='keep') (the adapters stay on) or undo(adapter='discard')"
            )
        if adapter not in (None, "discard") and self.plan.adapter == "none":
            raise MemlabError(
                f"undo(adapter={adapter!r}) is for adapter plans, and {self.plan.label()} trains no adapters; "
                "write undo()"
            )
        if not self.active or self._step is None:
            return
        # Imported here: peft is heavy, and a plan without adapters needs none of it.
        from memlab.techniques import adapters

        deltas: dict[str, Any] = {}
        heads: dict[str, Any] = {}
        kept: dict[str, Any] = {}
        if self.plan.adapter != "none" and adapter != "discard":
            if adapter == "keep":
                kept = {name: p.detach().clone() for name, p in adapters.adapter_parameters(self.model).items()}
            else:
                deltas = {name: d for name, d in adapters.adapter_deltas(self.model).items() if bool(d.any())}
                heads = self._changed_heads(adapters.trained_heads(self.model))
                if adapter is None and (deltas or heads):
                    count = sum(p.numel() for p in adapters.adapter_parameters(self.model).values())
                    warnings.warn(
                        f"memlab: undo() merged the trained {self.plan.adapter} adapters ({count:,} parameters, "
                        f"{self._steps} step{'s' if self._steps != 1 else ''} of training) into the base weights; "
                        "write undo(adapter='keep') to keep them as peft adapters, or undo(adapter='discard') to "
                        "drop their training",
                        MemlabWarning,
                        stacklevel=2,
                    )
        self._release()
        if deltas or heads:
            adapters.merge_deltas(self.model, deltas, heads)
        elif kept:
            adapters.reattach_adapters(self.model, self.plan, kept)
        if _ACTIVE.get(self.model) is self:
            del _ACTIVE[self.model]

    def _changed_heads(self, heads: dict[str, Any]) -> dict[str, Any]:
        """The trained task heads whose values differ from the model's own (only those are copied back)."""
        original = {name.replace(".original_module.", "."): p for name, p in self.model.named_parameters()
                    if ".original_module." in name}
        return {name: value for name, value in heads.items()
                if name not in original or not bool((original[name] == value).all())}

    def _release(self) -> None:
        """Take the plan off and let go of what apply built: the step, its optimizer and the optimizer's state
        (cleared too, for a user who still holds the optimizer), the structure captured before."""
        assert self._step is not None
        optimizer = self._step.optimizer
        self._step.close()
        self._before.restore()
        self.active = False
        state: Any = getattr(optimizer, "state", None)
        if isinstance(state, dict):
            state.clear()
        self._step = None

    def __enter__(self) -> Applied:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.undo()

    def __repr__(self) -> str:
        state = "active" if self.active else "undone"
        return f"<memlab.Applied {self.plan.label()} on {type(self.model).__name__} ({state})>"


def apply(model: nn.Module, plan: Plan, *, loss_fn: LossFn | None = None, lr: float = 1e-5) -> Applied | Any:
    """Put ``plan`` on the live ``model`` and return what trains with it.

    ``model`` may be a ``transformers.Trainer``: then its arguments, model and optimizer take the plan, so that the
    next ``trainer.train()`` trains it, and ``undo()`` gives them back (:func:`memlab.trainer.apply_to_trainer`).

    A plan still applied to the same model (say, from running the cell before) is undone first, with a warning.

    Example:
        >>> import torch
        >>> model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
        >>> with apply(model, Plan(accumulation=2, micro_batch=4), loss_fn=lambda m, b: m(b).mean()) as applied:
        ...     _ = applied.step(torch.randn(8, 4))
    """
    if not isinstance(plan, Plan):
        raise MemlabError(f"plan must be a memlab.Plan, not {type(plan).__name__}; write memlab.Plan(...)")
    refuse_class(model, "apply")
    refuse_meta(model, "apply")  # a model on the meta device cannot train
    if is_trainer(model):
        if loss_fn is not None:
            raise MemlabError("a trainer trains with its own compute_loss; drop loss_fn, or apply to trainer.model")
        return apply_to_trainer(model, plan)
    if not isinstance(model, nn.Module):
        raise MemlabError(f"model must be a torch nn.Module, not {type(model).__name__}")
    return Applied(model, plan, loss_fn=loss_fn, lr=check_learning_rate(lr))
