"""Watch a trainer's memory while ``trainer.train()`` runs: the peak of every step, which batch made it, a warning
before the budget is reached, and ``memory/*`` keys in the trainer's logs.

How memory is read per optimizer step:

- on CUDA: the caching allocator's ``max_memory_allocated`` over the step (reset at its start),
  through :class:`memlab.measure.cuda.CudaPeak`;
- on CPU: memlab's :class:`~memlab.measure.tracker.MemoryTracker` (a ``TorchDispatchMode``) over the step: live
  tensor bytes, exact, and a few microseconds of Python per operator (CPU training of a real model is slow anyway).
  Like the allocator on CUDA, and like a measured trial (:mod:`memlab.measure.held`), it counts everything the
  process holds: the parameters, gradients and optimizer state as such, and under ``"other"`` every other tensor
  alive when ``train()`` began (a reference model, the notebook's own tensors: one scan of the live objects, before
  ``train()``'s clock starts). One tracker follows the whole ``train()``, so what a step leaves alive for the next
  (a GRPOTrainer's generations, trained on over several steps) counts in the next step too.

How speed is read: a step's ``samples_per_s`` is its examples over its own wall time (``on_step_begin`` to
``on_step_end``: the forward, backward and optimizer step, and a GRPOTrainer's generation in the step that
generates), not what ``train()`` does between steps (logging, evaluation, saving, a live figure's redraw);
``Watch.samples_per_s`` is the examples of every step over ``train()``'s wall time, what transformers'
``train_samples_per_second`` counts.

The costliest step (the highest peak) is kept as a timeline, ``Watch.timeline``: on CPU from the tracker's changes, on
CUDA from the caching allocator's own history without stack traces, read only when a step beats the costliest so
far (:mod:`memlab.trainer.watch_timeline` says what each records and what it costs).
"""

from __future__ import annotations

import contextlib
import functools
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from memlab.errors import MemlabError, MemlabWarning, refuse_class
from memlab.live.patching import patched
from memlab.live.trainer_kinds import OldLogps, kind_of, kind_or_none
from memlab.plan import format_bytes, parse_budget
from memlab.trainer.source import is_trainer, trainer_model

if TYPE_CHECKING:
    from memlab.report.timeline import Timeline
    from memlab.trainer.watch_timeline import CostliestStep

__all__ = ["NEAR_BUDGET", "WATCH_MARK", "StepRecord", "Watch", "batch_lengths", "installed_watch", "watch"]

NEAR_BUDGET = 0.9
"""A step whose peak reaches this share of the budget triggers the (one) warning."""

WATCH_MARK = "_memlab_watch"
"""The trainer's instance attribute that holds its :class:`Watch` while one is on."""

_WRAPPED = ("training_step", "compute_loss", "train")


@dataclass(frozen=True)
class StepRecord:
    """One optimizer step as the watch saw it.

    Attributes:
        step: the trainer's ``global_step`` after the step (1 for the first).
        peak_bytes: the step's memory peak (see the module's docstring for how it is read).
        step_time_s: wall time from the step's start to its end (``on_step_begin`` to ``on_step_end``: forward,
            backward, the optimizer step, and a GRPOTrainer's generation where the step generates).
        samples_per_s: examples of the step over ``step_time_s``, as the trainer counts them
            (``per_device_train_batch_size`` counts them: a DPOTrainer's pairs, a GRPOTrainer's completions); a step
            that generates is slower than one that trains on generations made before it. The rate over a whole
            ``train()``, time between steps included, is :attr:`Watch.samples_per_s`.
        lengths: tokens of each row the step trained on (attention-mask sums; padded length without a mask; a
            GRPOTrainer's prompt and completion).
        padded_length: the longest padded sequence of the step's micro-batches.
        categories: bytes by category (params, grads, optimizer, activations, other) at the step's peak, summing
            to ``peak_bytes``: read on CPU (memlab's tracker knows what each tensor is); empty on CUDA, whose
            allocator knows only the total.
    """

    step: int
    peak_bytes: int
    step_time_s: float
    samples_per_s: float
    lengths: tuple[int, ...]
    padded_length: int
    categories: dict[str, int] = field(default_factory=dict)


def batch_lengths(inputs: Any) -> tuple[tuple[int, ...], int]:
    """Tokens per row of a collated batch (or of a GRPOTrainer's generated one: each prompt and its completion), and
    its padded length.

    Example:
        >>> import torch
        >>> batch_lengths({"input_ids": torch.zeros(2, 5), "attention_mask": torch.tensor([[1] * 5, [1, 1, 0, 0, 0]])})
        ((5, 2), 5)
        >>> batch_lengths({"input_ids": torch.zeros(3, 4)})
        ((4, 4, 4), 4)
        >>> batch_lengths({"input_ids": torch.zeros(1, 5), "position_ids": torch.tensor([[0, 1, 2, 0, 1]])})
        ((3, 2), 5)
        >>> generated = {"prompt_ids": torch.zeros(2, 3), "prompt_mask": torch.tensor([[0, 1, 1], [1, 1, 1]]),
        ...              "completion_ids": torch.zeros(2, 4), "completion_mask": torch.tensor([[1] * 4, [1, 0, 0, 0]])}
        >>> batch_lengths(generated)
        ((6, 4), 7)
    """
    if _is_generated(inputs):
        prompt, completion = _generated_lengths(inputs, "prompt"), _generated_lengths(inputs, "completion")
        return tuple(a + b for a, b in zip(prompt[0], completion[0], strict=True)), prompt[1] + completion[1]
    ids = inputs.get("input_ids") if isinstance(inputs, dict) or hasattr(inputs, "get") else None
    mask = inputs.get("attention_mask") if ids is not None else None
    if ids is None or getattr(ids, "ndim", 0) < 1:
        return (), 0
    padded = int(ids.shape[-1])
    starts = inputs.get("cu_seq_lens_q")
    positions = inputs.get("position_ids")
    if mask is None and getattr(starts, "ndim", 0) == 1:  # a padding-free batch: its sequences' boundaries
        return tuple(int(n) for n in (starts[1:] - starts[:-1]).tolist() if n > 0), padded
    if mask is None and getattr(positions, "ndim", 0) == 2 and positions.shape[0] == 1:
        first = [i for i, p in enumerate(positions[0].tolist()) if p == 0] or [0]
        return tuple(b - a for a, b in zip(first, [*first[1:], positions.shape[1]], strict=True)), padded
    if mask is not None and getattr(mask, "ndim", 0) == 2:
        return tuple(int(n) for n in mask.sum(-1).tolist()), padded
    rows = int(ids.shape[0]) if ids.ndim > 1 else 1
    return (padded,) * rows, padded


_LENGTH_KEYS = ("input_ids", "attention_mask", "cu_seq_lens_q", "position_ids", "prompt_ids", "prompt_mask",
                "completion_ids", "completion_mask")


def _length_inputs(inputs: Any) -> dict[str, Any] | None:
    """The entries of a micro-batch that :func:`batch_lengths` reads (references, nothing copied), or None."""
    if not (isinstance(inputs, dict) or hasattr(inputs, "get")):
        return None
    return {key: inputs.get(key) for key in _LENGTH_KEYS if inputs.get(key) is not None}


def _is_generated(inputs: Any) -> bool:
    return isinstance(inputs, dict) and "prompt_ids" in inputs and "completion_ids" in inputs


def _generated_lengths(inputs: dict[str, Any], part: str) -> tuple[tuple[int, ...], int]:
    return batch_lengths({"input_ids": inputs[f"{part}_ids"], "attention_mask": inputs.get(f"{part}_mask")})


def _rows_per_example(trainer: Any) -> int:
    try:
        return kind_of(trainer).rows_per_example
    except MemlabError:  # a trainer of no declared kind is watched too: a row is an example
        return 1


def _old_logps(trainer: Any) -> OldLogps | None:
    """The trainer's kind's :class:`~memlab.live.trainer_kinds.OldLogps` (GRPO's: whether TRL computes the old
    policy's log-probs); None for a kind that computes none, or a trainer of no declared kind."""
    try:
        return kind_of(trainer).old_logps
    except MemlabError:
        return None


class _StepMemory:
    """The memory peak of one step on the model's device; started at the step's start, read at its end. On CPU one
    tracker follows a whole ``train()`` (:meth:`prepare`), its peak started again at each step."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer
        self.probe: Any = None
        self.tracker: Any = None  # on CPU, the MemoryTracker of the running train()
        self.breakdown: dict[str, int] = {}
        self.hooks: list[Any] = []
        self.allocated_before = 0
        self.costliest: CostliestStep | None = None  # the costliest step's record (its timeline)
        self.optimizer_phase: Any = None  # on CPU, the tracker's "optimizer" category while the optimizer steps

    def start(self) -> None:
        import torch

        model = trainer_model(self.trainer)
        device = next((p.device for p in model.parameters()), torch.device("cpu"))
        if self.costliest is None or self.costliest.device != device:
            from memlab.trainer.watch_timeline import CostliestStep

            if self.costliest is not None:
                self.costliest.close()
            self.costliest = CostliestStep(device)
        if device.type == "cuda":
            from memlab.measure.cuda import CudaPeak

            self.costliest.begin(model)  # the allocator's history cleared before the peak is reset
            self.probe = CudaPeak(device)
        else:
            parameters = list(model.parameters())
            tracker = self.tracker if self.tracker is not None else self.prepare(scan=False)
            if tracker.device != device:  # the model moved since train() began
                tracker = self.prepare(scan=False)
            # What is what now (the optimizer state the first step made, the gradients it left), and the peak from now.
            tracker.mark(parameters, "params")
            tracker.mark([p.grad for p in parameters], "grads")
            tracker.mark(self._optimizer_state(), "optimizer")
            tracker.reset_peak()
            self.probe = tracker

            def mark(param: Any) -> None:
                tracker.mark([param.grad], "grads")

            self.hooks = [p.register_post_accumulate_grad_hook(mark) for p in parameters if p.requires_grad]
            self.costliest.begin(model, tracker)
        self.probe.__enter__()

    def prepare(self, *, scan: bool = True) -> Any:
        """``train()`` begins: the tracker that follows it (None on CUDA, whose allocator counts every block), whose
        baseline is the parameters, gradients and optimizer state, and on CPU (``scan``) under ``"other"`` every other
        tensor the process holds now: one scan of the live objects (:func:`memlab.measure.held.cpu_tensors_held`), as
        a measured trial's session makes. The tracker keeps no tensor alive (it follows storages by weak reference)."""
        import torch

        from memlab.measure.held import cpu_tensors_held
        from memlab.measure.tracker import MemoryTracker

        model = trainer_model(self.trainer)
        device = next((p.device for p in model.parameters()), torch.device("cpu"))
        if device.type == "cuda":
            self.tracker = None
            return None
        parameters = list(model.parameters())
        grads = [p.grad for p in parameters]
        state = self._optimizer_state()
        held = cpu_tensors_held([*parameters, *state]) if scan and device.type == "cpu" else []
        self.tracker = MemoryTracker(
            baseline={"params": parameters, "grads": grads, "optimizer": state, "other": held}, device=device
        )
        return self.tracker

    def _optimizer_state(self) -> list[Any]:
        import torch

        optimizer = getattr(self.trainer, "optimizer", None)
        optimizer = getattr(optimizer, "optimizer", optimizer)  # accelerate's AcceleratedOptimizer wraps it
        state = getattr(optimizer, "state", {}) or {}
        return [v for s in state.values() for v in s.values() if isinstance(v, torch.Tensor)]

    def mark(self, phase: str | None) -> None:
        """The step enters ``phase`` (``"forward"``, ``"backward"``, ``"optimizer"``; None: between them)."""
        if self.probe is not None and self.costliest is not None:
            self.costliest.mark(phase)

    def before_optimizer(self) -> None:
        """The optimizer step begins: on CUDA, a step that may become the costliest notes its gradients' blocks."""
        costliest = self.costliest
        if self.probe is None or costliest is None:
            return
        costliest.mark("optimizer")
        phase = getattr(self.probe, "phase", None)
        if phase is not None and self.optimizer_phase is None:
            # What the optimizer step allocates (the first step's Adam moments, say) is optimizer state, not "other".
            self.optimizer_phase = phase("optimizer")
            self.optimizer_phase.__enter__()
        if hasattr(self.probe, "peak_allocated"):
            import torch

            if costliest.may_beat(int(torch.cuda.max_memory_allocated(self.probe.device))):
                costliest.note_gradients(trainer_model(self.trainer).parameters())

    def after_optimizer(self) -> None:
        """The optimizer's update ended: on CPU, allocations count as "other" again. The timeline's "optimizer" phase
        stays open to the step's end (the gradients released: :class:`~memlab.trainer.watch_timeline.StepMarks`)."""
        phase, self.optimizer_phase = self.optimizer_phase, None
        if phase is not None:
            phase.__exit__(None, None, None)

    def forward_and_backward(self) -> Any:
        """The context of ``training_step``: on CPU what it allocates is charged to activations (gradients move to
        grads as they are accumulated); elsewhere nothing."""
        phase = getattr(self.probe, "phase", None)
        return contextlib.nullcontext() if phase is None else phase("activations")

    def stop(self) -> int | None:
        """The step's peak, or None when no step was started (its categories, where known, in ``breakdown``)."""
        probe, self.probe = self.probe, None
        self.breakdown = {}
        for hook in self.hooks:
            hook.remove()
        self.hooks = []
        if self.optimizer_phase is not None:  # a step that ended without on_optimizer_step
            self.optimizer_phase.__exit__(None, None, None)
            self.optimizer_phase = None
        if self.costliest is not None:
            self.costliest.stop()
        if probe is None:
            return None
        probe.__exit__(None, None, None)
        self.allocated_before = int(getattr(probe, "start_allocated", 0) or 0)
        if hasattr(probe, "peak_allocated"):
            return int(probe.peak_allocated)
        self.breakdown = {name: int(size) for name, size in probe.breakdown.items()}
        return int(probe.peak_bytes)

    def keep(self, step: int, peak: int) -> None:
        """The step that just stopped with ``peak``: kept as the timeline if it is the costliest so far."""
        if self.costliest is not None:
            optimizer = getattr(self.trainer, "optimizer", None)
            self.costliest.end(step, peak, self.breakdown, model=trainer_model(self.trainer), optimizer=optimizer,
                               allocated_before=self.allocated_before)

    def close(self) -> None:
        """Training ended: nothing recorded any more (the allocator's history off again, the CPU tracker let go)."""
        self.stop()
        self.tracker = None
        if self.costliest is not None:
            self.costliest.close()


class Watch:
    """What :func:`watch` records; ``remove()`` takes it off the trainer.

    Attributes:
        steps: a :class:`StepRecord` per optimizer step, in order.
        budget: bytes (None: no warning).
        train_time_s: the wall time of the watched ``train()`` calls, from the Trainer's ``on_train_begin`` to its
            ``on_train_end`` (what its ``train_runtime`` measures: the time between steps and before the first
            included), summed over the calls.
    """

    def __init__(self, trainer: Any, budget: int | None) -> None:
        self.trainer = trainer
        self.budget = budget
        self.steps: list[StepRecord] = []
        self.warned = False
        self._listeners: list[Callable[[StepRecord], None]] = []
        self._end_listeners: list[Callable[[], None]] = []
        self._memory = _StepMemory(trainer)
        self._started = 0.0
        self.train_time_s = 0.0
        self._train_started: float | None = None
        self._inputs: list[dict[str, Any] | None] = []  # what each micro-batch's lengths are read from
        self._rows_per_example = _rows_per_example(trainer)
        self._trained: Any = None  # the micro-batch the running training_step trains on
        self._callback: Any = None
        self._saved: dict[str, Any] = {}
        self.removed = False

    @property
    def peak(self) -> StepRecord | None:
        """The step with the highest peak (the first of equals), or None before any step."""
        return max(self.steps, key=lambda record: record.peak_bytes, default=None)

    @property
    def peak_bytes(self) -> int | None:
        return None if self.peak is None else self.peak.peak_bytes

    @property
    def peak_step(self) -> int | None:
        return None if self.peak is None else self.peak.step

    @property
    def samples(self) -> float:
        """The examples every watched step trained on, as the trainer counts them (see :class:`StepRecord`)."""
        return sum(len(record.lengths) for record in self.steps) / self._rows_per_example

    @property
    def samples_per_s(self) -> float | None:
        """The examples of every watched step over :attr:`train_time_s`: the rate a whole ``train()`` ran at, time
        between steps included, what transformers' ``train_samples_per_second`` (and TRL's) counts; None before a
        ``train()`` ended. A step's own rate (:attr:`StepRecord.samples_per_s`) leaves out the time between steps.

        Example (a tiny trainer: ``tests/trainer/test_watch.py`` builds one)::

            watched = memlab.watch(trainer)
            output = trainer.train()
            watched.samples_per_s, output.metrics["train_samples_per_second"]  # the same rate, each timed by its own
        """
        return self.samples / self.train_time_s if self.train_time_s > 0 and self.steps else None

    @property
    def peak_lengths(self) -> tuple[int, ...]:
        return () if self.peak is None else self.peak.lengths

    @property
    def timeline(self) -> Timeline | None:
        """The costliest step's memory over time (a :class:`memlab.report.timeline.Timeline` labelled ``"step N"``,
        its peak that step's ``peak_bytes``): categories, phases (each micro-batch's forward and backward, the
        optimizer step), the peak named; ``.plot()``, ``.save(path)`` for PyTorch's memory_viz. None before a step
        ended. See :mod:`memlab.trainer.watch_timeline` for what each device records.

        Example (a tiny trainer: ``tests/trainer/test_trainer.py`` builds one)::

            watched = memlab.watch(trainer)
            trainer.train()
            watched.timeline.label == f"step {watched.peak_step}", watched.timeline.peak.bytes == watched.peak_bytes
        """
        costliest = self._memory.costliest
        return None if costliest is None else costliest.timeline

    def on_step(self, listener: Callable[[StepRecord], None]) -> None:
        """Call ``listener(record)`` after each step (a front end's live figure)."""
        self._listeners.append(listener)

    def on_end(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` when ``trainer.train()`` ends (a front end's live figure becomes a static one)."""
        self._end_listeners.append(listener)

    def to_dataframe(self) -> Any:
        """A pandas DataFrame with a row per step (pandas is imported here)."""
        import pandas as pd

        return pd.DataFrame([asdict(record) for record in self.steps], columns=list(StepRecord.__dataclass_fields__))

    def remove(self) -> None:
        """Take the callback and the ``training_step`` and ``train`` wrappers off the trainer (a step being watched
        is ended). Calling it again does nothing."""
        self._memory.close()
        self._inputs = []
        self.removed = True
        self.take_off()

    def take_off(self) -> None:
        """Take this watch's callback, wrappers and mark off the trainer where they are (an ``apply``'s
        ``undo()`` may put back a trainer's attributes from before a ``remove()``)."""
        trainer = self.trainer
        callbacks = trainer.callback_handler.callbacks
        if self._callback is not None and any(callback is self._callback for callback in callbacks):
            callbacks[:] = [callback for callback in callbacks if callback is not self._callback]
        if installed_watch(trainer) is self:
            for name in _WRAPPED:
                vars(trainer).pop(name, None)
                saved = self._saved.get(name)
                if saved is not None:
                    setattr(trainer, name, saved)
            vars(trainer).pop(WATCH_MARK, None)

    def instance_attributes(self) -> dict[str, Any]:
        """The trainer's instance attributes this watch put there (its wrappers and mark), to keep through an
        ``apply``'s ``undo()``."""
        names = (*_WRAPPED, WATCH_MARK)
        return {name: vars(self.trainer)[name] for name in names if name in vars(self.trainer)}

    def reinstall_callback(self) -> None:
        """Put the callback back first in the trainer's list where it is missing (after an ``undo()``)."""
        callbacks = self.trainer.callback_handler.callbacks
        missing = not any(callback is self._callback for callback in callbacks)
        if not self.removed and self._callback is not None and missing:
            callbacks.insert(0, self._callback)

    def __repr__(self) -> str:
        return f"Watch({len(self.steps)} steps, peak {format_bytes(self.peak_bytes)} at step {self.peak_step})"

    # ---------------------------------------------------------------------------------- what the callback calls
    def step_begin(self) -> None:
        self._memory.stop()  # a step that never ended (an interrupted train()) is not counted
        self._inputs = []
        self._memory.start()
        self._started = time.perf_counter()  # the step's own time: memlab's set-up of its reading left out

    def saw_inputs(self, inputs: Any) -> None:
        # Only the tensors are kept here; their lengths are read at the step's end, after the probe's synchronize:
        # read here, a CUDA batch's tolist() held the host until the backward it had just queued ended.
        self._inputs.append(_length_inputs(inputs))

    def step_end(self, step: int) -> None:
        peak = self._memory.stop()
        if peak is None:
            return
        elapsed = time.perf_counter() - self._started
        rows, self._inputs = [batch_lengths(inputs) for inputs in self._inputs], []
        lengths = tuple(n for row, _ in rows for n in row)
        examples = len(lengths) / self._rows_per_example
        record = StepRecord(step, peak, elapsed, examples / elapsed if elapsed > 0 else 0.0, lengths,
                            max((padded for _, padded in rows), default=0), self._memory.breakdown)
        self.steps.append(record)
        self._memory.keep(step, peak)
        if self.budget is not None and not self.warned and peak >= NEAR_BUDGET * self.budget:
            self.warned = True
            warnings.warn(
                f"memlab: step {step} peaked at {format_bytes(peak)}, "
                f"{'over' if peak > self.budget else f'within {1 - NEAR_BUDGET:.0%} of'} the "
                f"{format_bytes(self.budget)} budget (rows of {', '.join(map(str, lengths))} tokens); "
                "longer batches may not fit: memlab.fit(trainer, budget=...) finds a plan that does",
                MemlabWarning,
                stacklevel=2,
            )
        for listener in self._listeners:
            listener(record)

    def train_begin(self) -> None:
        self._train_started = time.perf_counter()

    def train_end(self) -> None:
        if self._train_started is not None:  # before the listeners: a figure's last drawing is not training time
            self.train_time_s += time.perf_counter() - self._train_started
            self._train_started = None
        self._memory.close()
        self._inputs = []
        for listener in self._end_listeners:
            listener()

    def log_keys(self) -> dict[str, int]:
        # Whole numbers: the Trainer's progress line prints a float as 1.235e+09, an int as the bytes themselves
        # (every reporter takes either).
        if not self.steps:
            return {}
        return {
            "memory/peak_bytes": int(self.peak_bytes or 0),
            "memory/peak_step": int(self.peak_step or 0),
            "memory/step_peak_bytes": int(self.steps[-1].peak_bytes),
        }


@functools.lru_cache(maxsize=1)
def _callback_class() -> type:
    """A ``TrainerCallback`` subclass, built on first use so that importing memlab imports no transformers."""
    from transformers import TrainerCallback

    class MemlabWatchCallback(TrainerCallback):  # type: ignore[misc]
        def __init__(self, watch: Watch) -> None:
            self.watch = watch

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.watch.train_begin()

        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.watch.step_begin()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.watch.step_end(state.global_step)

        def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.watch._memory.before_optimizer()

        def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.watch._memory.after_optimizer()

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.watch.train_end()

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
            keys = self.watch.log_keys()
            if logs is None or not keys:
                return
            history = state.log_history
            if history and all(history[-1].get(k) == v for k, v in logs.items()):
                history[-1].update(keys)  # the trainer recorded its copy of these logs before calling us
            logs.update(keys)

    return MemlabWatchCallback


def watch(trainer: Any, budget: int | str | None = None) -> Watch:
    """Record the memory of every step of ``trainer.train()``: the peak, its step and that step's lengths.

    Adds a callback (first in the trainer's list, so the reporters after it log ``memory/peak_bytes``,
    ``memory/peak_step`` and ``memory/step_peak_bytes``) and wraps the trainer's ``training_step`` on the
    instance, to see each micro-batch. With a ``budget`` (bytes or a string such as ``"8GiB"``), the first step
    whose peak comes within 10% of it raises one :class:`~memlab.errors.MemlabWarning`. ``Watch.remove()`` undoes
    both. On TRL's GRPOTrainer each ``train()`` also marks ``"generation"``, ``"old-policy"`` and ``"reference"`` on
    the timeline (its kind's ``generation_methods`` wrapped for that ``train()`` only, then put back exactly).

    Example (a tiny trainer: ``tests/trainer/test_trainer.py`` builds one)::

        w = memlab.trainer.watch(trainer, budget="8GiB")
        trainer.train()
        w.peak_bytes, w.peak_step, w.peak_lengths
        w.to_dataframe()
        w.remove()
    """
    refuse_class(trainer, "watch", trainer_only=True)
    if not is_trainer(trainer):
        raise MemlabError(f"watch takes a transformers Trainer, not a {type(trainer).__name__}; pass your trainer")
    if installed_watch(trainer) is not None:
        raise MemlabError(
            "this trainer is already watched; read that watch, or call its remove() first and then "
            "memlab.watch(trainer, ...) again"
        )
    result = Watch(trainer, parse_budget(budget))
    callback = _callback_class()(result)
    result._callback = callback
    result._saved = {name: vars(trainer)[name] for name in _WRAPPED if name in vars(trainer)}
    original = trainer.training_step
    original_loss = trainer.compute_loss
    original_train = trainer.train

    @functools.wraps(original)
    def training_step(model: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        # What the step trains on is what its compute_loss is given (a GRPOTrainer's training_step is given prompts
        # and generates the rows it trains on); the inputs themselves where no compute_loss runs.
        result._trained = inputs
        try:
            with result._memory.forward_and_backward():
                output = original(model, inputs, *args, **kwargs)
            result.saw_inputs(result._trained)
            return output
        except BaseException:
            result._memory.stop()  # never leave the CPU tracker's dispatch mode on after an error
            raise
        finally:
            result._trained = None
            result._memory.mark(None)

    @functools.wraps(original_loss)
    def compute_loss(*args: Any, **kwargs: Any) -> Any:
        if result._trained is not None:
            result._trained = kwargs["inputs"] if "inputs" in kwargs else args[1] if len(args) > 1 else result._trained
        # The timeline's phases: the loss is the forward, the rest of training_step its backward.
        result._memory.mark("forward")
        try:
            return original_loss(*args, **kwargs)
        finally:
            result._memory.mark("backward")

    @functools.wraps(original_train)
    def train(*args: Any, **kwargs: Any) -> Any:
        try:
            result._memory.prepare()  # before the Trainer's clock starts: what the process holds, scanned once
            with _generation_phases(trainer, result._memory):
                return original_train(*args, **kwargs)
        finally:
            result._memory.close()  # an interrupt anywhere in train() leaves no tracker or history behind
            result._inputs = []  # nor a micro-batch's tensors held for a step that did not end

    trainer.callback_handler.callbacks.insert(0, callback)
    trainer.training_step = training_step
    trainer.compute_loss = compute_loss
    trainer.train = train
    vars(trainer)[WATCH_MARK] = result
    return result


@contextlib.contextmanager
def _generation_phases(trainer: Any, memory: _StepMemory) -> Iterator[None]:
    """For the length of one ``train()``, a trainer that generates (TRL's GRPOTrainer) marks its generation and its
    no-grad log-prob passes on the step's timeline: ``"old-policy"`` first where TRL computes it (the generation
    reused past one optimizer step), then ``"reference"`` (``beta != 0``). The trainer's own attributes are put back
    exactly after, also on an error; a trainer without these methods is left alone. The methods are its kind's
    (:attr:`memlab.live.trainer_kinds.TrainerKind.generation_methods`: TRL's GRPOTrainer's)."""
    kind = kind_or_none(trainer)
    methods = kind.generation_methods if kind is not None else ()
    if not methods or not all(callable(getattr(trainer, name, None)) for name in methods):
        yield
        return
    import torch

    old_logps = _old_logps(trainer)
    passes = [0]  # the no-grad log-prob passes of the current generation round

    def new_round() -> bool:
        passes[0] = 0
        return True

    def generation() -> bool:
        memory.mark("generation")
        return True

    def no_grad_pass() -> bool:
        if torch.is_grad_enabled():  # the policy's forward in compute_loss: already "forward"
            return False
        first, passes[0] = passes[0] == 0, passes[0] + 1
        memory.mark("old-policy" if first and old_logps is not None and old_logps(trainer) else "reference")
        return True

    def unmarked_after(method: Callable[..., Any], enter: Callable[[], bool]) -> Callable[..., Any]:
        """``method`` that calls ``enter()`` first and, where it says so, leaves the timeline between phases after
        (also on an error)."""

        @functools.wraps(method)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if not enter():
                return method(*args, **kwargs)
            try:
                return method(*args, **kwargs)
            finally:
                memory.mark(None)

        return wrapper

    enters = (new_round, generation, no_grad_pass)
    with patched(trainer, **{name: unmarked_after(getattr(trainer, name), enter)
                             for name, enter in zip(methods, enters, strict=True)}):
        yield


def installed_watch(trainer: Any) -> Watch | None:
    """The :class:`Watch` on the trainer, or None.

    Example:
        >>> installed_watch(object()) is None
        True
    """
    found = vars(trainer).get(WATCH_MARK) if hasattr(trainer, "__dict__") else None
    return found if isinstance(found, Watch) else None
