"""One optimizer step of a plan on a live model: the levers' techniques put together.

``TrainingStep`` is what ``apply`` hands the user and what every trial runs, so the measured step and the applied
step are the same code. It names no lever: it makes the plain step's
:class:`~memlab.techniques.core.technique.StepParts`, puts on every technique of the registry in its declared order
(:func:`memlab.techniques.core.registry.step_techniques`), and runs the parts they leave.
"""

from __future__ import annotations

import contextlib
from typing import Any, Protocol

import torch
from torch import nn

from memlab.live.batch import (
    Batch,
    LossFn,
    batch_device,
    check_loss,
    map_tensors,
    repeats_left_out,
    repeats_note,
    resolve_loss_fn,
)
from memlab.live.compat import tensor_use_counts
from memlab.live.device import model_device
from memlab.plan import Plan
from memlab.techniques.core.registry import step_techniques
from memlab.techniques.core.technique import StepParts, Undo


class Phases(Protocol):
    """What a memory tracker offers the step: a category for new allocations, and re-labelling of tensors."""

    def phase(self, category: str) -> contextlib.AbstractContextManager[None]: ...

    def mark(self, tensors: Any, category: str) -> None: ...

    def section(self, name: str) -> contextlib.AbstractContextManager[Any]: ...


class _NoPhases:
    def phase(self, category: str) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def mark(self, tensors: Any, category: str) -> None:
        return None

    def section(self, name: str) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()


NO_PHASES = _NoPhases()


class TrainingStep:
    """A model prepared for a plan: checkpointing on, its optimizer built, ready to run optimizer steps.

    Call ``close()`` to take the plan off again (weights keep what training did). ``optimizer_device_type``
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
        self.parts = StepParts(
            model, plan, self.device, optimizer_device_type=optimizer_device_type or "", lr=lr, loss_fn=loss_fn
        )
        self._undo_model: list[Undo] = []
        techniques = step_techniques()
        try:
            for technique in techniques:
                undo = technique.put_on(self.parts)
                if undo is not None:
                    self._undo_model.append(undo)
            self.parameters = self.parts.parameters
            fake = self.parts.fake
            self.notes = [
                note
                for technique in techniques
                for note in (*technique.notes(self.parts), *(technique.dry_run(self.parts) if fake else ()))
            ]
            if self.parts.optimizer is None:
                if self.parts.make_optimizer is None:
                    raise RuntimeError("no technique said how to build the optimizer (the optimizer lever's does)")
                self.parts.optimizer = self.parts.make_optimizer(self.parameters)
        except BaseException:
            self._take_off_model_changes()
            raise
        self.loss_fn = self.parts.loss_fn
        self.optimizer = self.parts.optimizer
        # Set once, not every step: a user who puts a submodule in eval mode between steps (a frozen
        # BatchNorm, say) keeps it that way.
        model.train()

    def __call__(self, batch: Batch, tracker: Phases = NO_PHASES) -> float:
        """One optimizer step over one effective batch; returns the mean micro-batch loss as a float."""
        loss_fn = self.loss_fn or resolve_loss_fn(batch, None)
        # Gradients left by the user's own backward, or by a step that failed half-way, must not leak in.
        self.optimizer.zero_grad(set_to_none=True)
        with torch.enable_grad():
            return self._step(batch, loss_fn, tracker)

    def _step(self, batch: Batch, loss_fn: LossFn, tracker: Phases) -> float:
        parts = self.parts
        with tracker.phase("other"):
            micro = parts.split(_on_device(batch, self.device))
            for cast in parts.input_casts:
                micro = [map_tensors(part, cast) for part in micro]
        total = torch.zeros((), device=self.device)
        # While tracking, a gradient is labelled the moment it is accumulated, so that a peak inside backward
        # counts it as a gradient rather than as an activation.
        hooks = self._mark_grads(tracker)
        try:
            self._accumulate(micro, loss_fn, total, tracker)
        except BaseException:
            self.optimizer.zero_grad(set_to_none=True)
            raise
        finally:
            for hook in hooks:
                hook.remove()
            if parts.watch_grads is not None:
                parts.watch_grads(None)
        del micro
        if parts.steps_in_backward:
            return float(total.item())
        with tracker.phase("other"), tracker.section("optimizer"):
            parts.optimizer_step(self.optimizer)
            self.optimizer.zero_grad(set_to_none=True)
        return float(total.item())

    def _mark_grads(self, tracker: Phases) -> list[Any]:
        if tracker is NO_PHASES:
            return []

        def mark(param: torch.Tensor) -> None:
            tracker.mark([param.grad], "grads")

        if self.parts.watch_grads is not None:
            # Its own hooks may step and free a gradient at once: it marks them first.
            self.parts.watch_grads(mark)
            return []
        return [p.register_post_accumulate_grad_hook(mark) for p in self.parameters]

    def _accumulate(self, micro: list[Batch], loss_fn: LossFn, total: torch.Tensor, tracker: Phases) -> None:
        parts = self.parts
        # Under a dispatch mode (memlab's tracker, a dry run's fake mode) the autograd engine sums the gradients
        # that meet at a leaf out of place; a user's own loop sums them in place (see SharedGrads).
        emulate = torch._C._len_torch_dispatch_stack() > 0 or parts.fake
        run = repeats_left_out(micro) if parts.fake else micro
        note = repeats_note(len(micro), len(run))
        if len(run) < len(micro) and note not in parts.late_notes:
            parts.late_notes.append(note)
        for part in run:
            with tracker.phase("activations"):
                with tracker.section("forward"), parts.forward_context():
                    loss = check_loss(loss_fn(self.model, part))
                scaled = parts.scale(loss.float())
                shared = SharedGrads(scaled) if emulate else None
                try:
                    with tracker.section("backward"):
                        parts.backward(scaled)
                finally:
                    if shared is not None:
                        shared.close()
                total += scaled.detach()
                del loss, scaled, shared

    def close(self) -> None:
        """Take the plan off the model, last technique first: checkpointing's previous setting, adapters and weight
        dtypes come back exactly (trained weights keep what training did).

        The step's gradients and optimizer state are let go first (the step is over): taking pure bf16 off casts
        the trained weights back to their own dtype, and copies twice the size allocated beside the state would
        take the card past the step's own peak (on CUDA the step's cached blocks cannot hold them)."""
        self.optimizer.zero_grad(set_to_none=True)
        self.optimizer.state.clear()  # a CPU-offloaded optimizer's inner state holds no device memory
        self._take_off_model_changes()

    def _take_off_model_changes(self) -> None:
        while self._undo_model:
            self._undo_model.pop()()


class SharedGrads:
    """The gradients that meet at a leaf used more than once (a tied embedding and output layer, a shared layer's
    weights), summed in place under a dispatch mode as the autograd engine sums them without one.

    The engine keeps the first gradient to reach a leaf in its input buffer and adds each later one into it in place
    where it holds the buffer's only reference (``can_accumulate_inplace`` in ``torch/csrc/autograd/
    input_buffer.cpp``). Under any ``TorchDispatchMode`` (memlab's tracker, a dry run's fake mode) every tensor counts
    as a subclass there, and each sum is made out of place: one more buffer of the leaf's size while both live, 1 GB
    on a tied 128k x 2048 fp32 embedding, a step a user's own loop never takes. Made on a loss before its backward,
    this adds those later gradients into the first where the engine would (the first a fresh, dense tensor held by
    no one else; a view of another gradient is summed out of place, as the engine does) and hands the engine nothing
    more for that leaf. A first gradient the engine would not reuse leaves every sum to the engine.

    Example:
        >>> weight = torch.ones(3, requires_grad=True)
        >>> loss = (weight * 2).sum() + (weight * 3).sum()
        >>> shared = SharedGrads(loss); loss.backward(); shared.close()
        >>> weight.grad.tolist(), shared.leaves
        ([5.0, 5.0, 5.0], 1)
    """

    def __init__(self, root: torch.Tensor) -> None:
        self._state: dict[int, list[Any]] = {}  # leaf -> [edges left, first gradient kept, still open]
        edges: dict[int, list[tuple[Any, int]]] = {}
        leaves: list[Any] = []  # every leaf's node, alive while ids stand for them
        seen: set[Any] = set()
        stack = [root.grad_fn]
        while stack:
            node = stack.pop()
            if node is None or node in seen:
                continue
            seen.add(node)
            for slot, (following, _) in enumerate(node.next_functions):
                if following is None:
                    continue
                if type(following).__name__ == "AccumulateGrad":
                    leaves.append(following)
                    edges.setdefault(id(following), []).append((node, slot))
                else:
                    stack.append(following)
        by_node: dict[Any, list[tuple[int, int]]] = {}
        for leaf, into in edges.items():
            if len(into) > 1:
                self._state[leaf] = [len(into), None, True]
                for node, slot in into:
                    by_node.setdefault(node, []).append((slot, leaf))
        self.leaves = len(self._state)
        """How many leaves more than one gradient reaches."""
        for node, slots in by_node.items():
            node.register_hook(self._hook(slots))

    def _hook(self, slots: list[tuple[int, int]]) -> Any:
        state = self._state

        def summed(grad_inputs: tuple[Any, ...], grad_outputs: tuple[Any, ...]) -> tuple[Any, ...] | None:
            grads = list(grad_inputs)
            changed = False
            for slot, leaf in slots:
                entry = state.get(leaf)
                if entry is None:
                    continue
                grad = grads[slot]
                if grad is not None and entry[2]:
                    if entry[1] is None:
                        if _sole(grad) and not torch.is_grad_enabled():
                            entry[1] = grad
                        else:
                            entry[2] = False  # the engine sums this leaf's gradients itself, as it would
                    else:
                        entry[1].add_(grad)
                        grads[slot] = None
                        changed = True
                entry[0] -= 1
                if entry[0] == 0:  # every gradient is in: the engine's buffer holds the sum alone again
                    del state[leaf]
                grad = None
            return tuple(grads) if changed else None

        return summed

    def close(self) -> None:
        """Let go of every gradient kept (a backward that failed half-way)."""
        self._state.clear()


def _sole(grad: torch.Tensor) -> bool:
    """Whether the engine's buffer would hold ``grad``'s only reference and its storage's: not a view, dense, and
    referenced (inside a node's post-hook) by the node's outputs and this call's Python object alone."""
    if grad._base is not None or grad.is_sparse or not grad.is_contiguous():
        return False
    counts = tensor_use_counts(grad)
    if counts is None:  # a torch without them: the engine's sums, as before
        return False
    return counts[0] <= 2 and counts[1] <= 2


def _on_device(batch: Batch, device: torch.device) -> Batch:
    source = batch_device(batch)
    if source is None or source == device:
        return batch
    return map_tensors(batch, lambda tensor: tensor.to(device, non_blocking=True))
