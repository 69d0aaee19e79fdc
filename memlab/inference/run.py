"""Measuring inference on the live model: a forward, or a generation, under ``torch.inference_mode()``.

The same core as training trials (:mod:`memlab.runner.trial`): the same probe per device (the budget, the peak, the
memory
held before), the same :class:`~memlab.measure.tracker.MemoryTracker` (here with the categories params,
activations, kv_cache and other), the same out-of-memory handling, the same timing rule
(:func:`memlab.runner.trial.timed_enough`: timed steps until the 95% interval of the median is within ``noise``, or
``time_limit``) and the same A B A B race for close contenders in :func:`compare_inference`; and the model comes
back bit-exact: the session captures the model's structure and buffers once, the plan's weights are put on
(:mod:`memlab.inference.weights`) and taken off again, and inference mode changes no parameter.

A step is one request: ``new_tokens=0``: one forward over the batch (full logits, as an evaluation computes them);
``new_tokens=N``: greedy generation as ``model.generate`` runs it: a prefill forward over the prompt (the last
token's logits only, where the model takes ``logits_to_keep``), then ``N - 1`` decode forwards of one token each
with the KV cache, or of the whole sequence so far without it. The model runs in eval mode (no dropout), as serving
and evaluation run it; its ``training`` flags come back with the rest. Under the tracker, what the cache's ``update``
allocates counts as ``"kv_cache"``, the forwards' other allocations as ``"activations"``, the weights (quantization
scales included) as ``"params"``, and the batch, the generated ids and memory held before the run as ``"other"``.
Floating-point inputs are given to the model in the weights' dtype (a bf16 model takes bf16 inputs).

Example:
    >>> from memlab.inference.plan import InferencePlan
    >>> model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
    >>> trial = measure_inference(model, torch.randn(8, 16), InferencePlan(weights="bf16"), steps=1, noise=0)
    >>> trial.status, trial.breakdown["params"] == 2 * sum(p.numel() for p in model.parameters())
    ('ok', True)
"""

from __future__ import annotations

import contextlib
import statistics
import time
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from typing_extensions import Unpack

from memlab.errors import MemlabError
from memlab.events import Callback, MemorySample, StepFinished, TrialFinished, TrialSettled, TrialStarted
from memlab.inference.kv import (
    cache_bytes,
    cache_tokens,
    is_causal_lm,
    learned_positions,
    new_cache,
    takes_logits_to_keep,
    track_cache,
)
from memlab.inference.plan import InferencePlan
from memlab.inference.weights import DTYPES, check_quantizable, prepare_weights, quantization_tensors
from memlab.measure.cuda import CudaPeak
from memlab.measure.oom import release_error, release_memory
from memlab.measure.probes import Probe, probe_for
from memlab.measure.reading import PeakReading, read_failed_peak, read_peak
from memlab.measure.remeasure import settle_close_race
from memlab.measure.tracker import INFERENCE_CATEGORIES, MemoryTracker
from memlab.options import RunKeywords, RunOptions
from memlab.report import InferenceTrial, Report, Trial
from memlab.runner.batch import Batch, count_rows, map_tensors, named_tensors, take_rows
from memlab.runner.module_state import ModelValues, ModuleStructure, unique_parameters
from memlab.runner.progress import run_progress
from memlab.runner.quiet import quiet
from memlab.runner.trial import TrialRecord, check_real_tensors, keep_on_interrupt, timed_enough, warmed_up

__all__ = ["InferenceRunner", "StepResult", "check_inference_plans", "compare_inference", "measure_inference"]

Clock = Callable[[], float]
_EXTRA_WARMUP_LIMIT = 4
_WARM_DEVICE_TYPES: set[str] = set()
_FP16_CPU_NOTE = "fp16 on CPU is slow (few CPU kernels are fast in fp16)"
_DEFAULT_OPTIONS = RunOptions()


def measure_inference(
    model: nn.Module, batch: Batch, plan: InferencePlan, **options: Unpack[RunKeywords]
) -> InferenceTrial:
    """Measure one inference plan on the live model (what ``memlab.measure`` does for an InferencePlan).

    Keywords are :class:`~memlab.options.RunKeywords` but ``loss_fn`` and ``lr``, which mean nothing here (given,
    they are an error).

    Example:
        >>> model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
        >>> measure_inference(model, torch.randn(4, 8), InferencePlan(batch_size=16), steps=1).rows_per_step
        16
    """
    options["progress"] = False
    trial = compare_inference(model, batch, [plan], **options).trials[0]
    assert isinstance(trial, InferenceTrial)
    return trial


def compare_inference(
    model: nn.Module, batch: Batch, plans: Sequence[InferencePlan] | InferencePlan, **options: Unpack[RunKeywords]
) -> Report:
    """Measure every inference plan in turn on the live model (what ``memlab.compare`` does for InferencePlans).

    Every plan is checked before the model is touched. A plan that runs out of memory or fails does not stop the
    rest; close contenders are timed again in turn (A B A B) unless ``noise=0``. Ctrl-C stops the run, restores the
    model and raises the KeyboardInterrupt again with the finished trials as ``.report``.

    Example:
        >>> model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 2))
        >>> report = compare_inference(model, torch.randn(4, 8), [InferencePlan(), InferencePlan(weights="bf16")],
        ...                            steps=1, noise=0, progress=False)
        >>> [t.label for t in report], report[1].breakdown["params"] * 2 == report[0].breakdown["params"]
        (['fp32', 'bf16'], True)
    """
    run_options = RunOptions.from_keywords(options)
    check_inference_options(run_options)
    plans = check_inference_plans(plans)
    trials: list[Trial] = []
    with keep_on_interrupt(trials, run_options.budget), run_progress(len(plans), run_options.progress) as progress:
        runner = InferenceRunner(model, batch, run_options, listener=progress)
        for plan in plans:
            runner.check(plan)
        with runner.session():
            for index, plan in enumerate(plans):
                trials.append(runner.run(plan, index, len(plans)))
                progress.advance(index + 1)
            if run_options.noise > 0:
                settle_close_race(
                    trials,
                    lambda plan, index: runner.run(plan, index, len(plans)),  # type: ignore[arg-type]
                    run_options.budget,
                    progress.say,
                    # a live figure shows the pooled trial in the plan's column, as for training plans
                    settled=lambda trial, index: runner._emit(TrialSettled(trial, index, len(plans))),
                )
    return Report(trials, budget=run_options.budget)


def check_inference_options(options: RunOptions) -> None:
    """A clear error for a training-only option given to an inference run (a loss function, a learning rate).

    Example:
        >>> check_inference_options(RunOptions(loss_fn=lambda m, b: m(b).sum()))
        Traceback (most recent call last):
        ...
        memlab.errors.MemlabError: loss_fn= is for training plans, and an InferencePlan runs the model's forward \
(or generation) itself; drop loss_fn
        >>> check_inference_options(RunOptions(lr=0.1))
        Traceback (most recent call last):
        ...
        memlab.errors.MemlabError: lr=0.1 is the optimizer's learning rate of training plans, and inference runs no \
optimizer; drop lr
    """
    if options.loss_fn is not None:
        raise MemlabError(
            "loss_fn= is for training plans, and an InferencePlan runs the model's forward (or generation) itself; "
            "drop loss_fn"
        )
    if options.lr != _DEFAULT_OPTIONS.lr:
        raise MemlabError(
            f"lr={options.lr!r} is the optimizer's learning rate of training plans, and inference runs no optimizer; "
            "drop lr"
        )


def check_inference_plans(plans: Sequence[InferencePlan] | InferencePlan) -> list[InferencePlan]:
    """The plans as a non-empty list of InferencePlan; a clear error for anything else (a mix with training
    Plans included).

    Example:
        >>> check_inference_plans(InferencePlan()) == [InferencePlan()]
        True
        >>> from memlab.plan import Plan
        >>> check_inference_plans([InferencePlan(), Plan()])
        Traceback (most recent call last):
        ...
        memlab.errors.MemlabError: Plan(...) is a training plan among inference plans; compare them apart: write \
memlab.compare(model, batch, [memlab.InferencePlan(...), ...]) and a second compare for the Plans
    """
    if isinstance(plans, InferencePlan):
        return [plans]
    if isinstance(plans, str) or plans is None or not isinstance(plans, Iterable):
        raise MemlabError(
            f"plans={plans!r} is not a list of inference plans; pass e.g. [memlab.InferencePlan(), "
            "memlab.InferencePlan(weights='bf16')]"
        )
    plans = list(plans)
    if not plans:
        raise MemlabError("no plans to compare; pass a list such as [memlab.InferencePlan(), "
                          "memlab.InferencePlan(weights='bf16')]")
    for plan in plans:
        if not isinstance(plan, InferencePlan):
            name = type(plan).__name__
            raise MemlabError(
                f"{name}(...) is a training plan among inference plans; compare them apart: write memlab.compare("
                "model, batch, [memlab.InferencePlan(...), ...]) and a second compare for the Plans"
                if name == "Plan"
                else f"{plan!r} is not a memlab.InferencePlan; write memlab.InferencePlan(...) for each setting"
            )
    return plans


@dataclass
class StepResult:
    """What one inference step did: seconds of its prefill and of each decode step (generation only), and the KV
    cache it held at the end (bytes, tokens per row).

    Example:
        >>> runner = InferenceRunner(nn.Linear(4, 2), torch.randn(3, 4))
        >>> runner.step(InferencePlan())
        StepResult(prefill_s=None, decode_s=[], cache_bytes=0, cache_tokens=0)
    """

    prefill_s: float | None = None
    decode_s: list[float] = field(default_factory=list)
    cache_bytes: int = 0
    cache_tokens: int = 0


class InferenceRunner:
    """Runs inference plans on one model and batch, with the model captured once per session.

    Args:
        model, batch: the live model and one batch (a dict with ``input_ids`` for a language model; ``labels`` are
            left out of the forward).
        options: how trials run (default ``RunOptions()``; ``loss_fn`` and ``lr`` are not used).
        probe: how memory is bounded and read (default: :func:`~memlab.measure.probes.probe_for` the model; a dry
            run passes a :class:`~memlab.measure.probes.FakeProbe`).
        clock: the clock timed steps read (for tests).
        listener: called with every event besides ``options.callback``.

    Example:
        >>> model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
        >>> runner = InferenceRunner(model, torch.randn(4, 4), RunOptions(steps=1, noise=0))
        >>> with runner.session():
        ...     trials = [runner.run(InferencePlan()), runner.run(InferencePlan(batch_size=32))]
        >>> [t.status for t in trials], trials[1].rows_per_step
        (['ok', 'ok'], 32)
    """

    def __init__(
        self,
        model: nn.Module,
        batch: Batch,
        options: RunOptions | None = None,
        *,
        probe: Probe | None = None,
        clock: Clock = time.perf_counter,
        listener: Callback | None = None,
    ) -> None:
        if not isinstance(model, nn.Module):
            raise MemlabError(f"model must be a torch nn.Module, not {type(model).__name__}")
        self.rows = count_rows(batch)
        if probe is None:
            check_real_tensors(model, batch)
            probe = probe_for(model)
        self.probe = probe
        self.options = options or RunOptions()
        self.model = model
        self.batch = batch
        self.inputs = _model_inputs(batch)
        self.device = probe.device
        self.clock = clock
        self.causal = is_causal_lm(model)
        self.logits_to_keep = self.causal and takes_logits_to_keep(model)
        ids = self.inputs.get("input_ids") if isinstance(self.inputs, Mapping) else None
        self.prompt_tokens = int(ids.shape[1]) if isinstance(ids, torch.Tensor) and ids.dim() == 2 else None
        self._listeners = [callback for callback in (listener, self.options.callback) if callback is not None]
        self._values: ModelValues | None = None
        self._structure: ModuleStructure | None = None
        self._held_before: list[torch.Tensor] = []
        self._held_bytes = 0

    @property
    def budget(self) -> int | None:
        """The budget in bytes every trial is held to (from the options)."""
        return self.options.budget

    def check(self, plan: InferencePlan) -> None:
        """A clear error, before anything runs, for a plan this model or batch cannot run.

        Example:
            >>> runner = InferenceRunner(nn.Linear(4, 2), torch.randn(2, 4))
            >>> runner.check(InferencePlan(new_tokens=8))
            Traceback (most recent call last):
            ...
            memlab.errors.MemlabError: new_tokens=8 generates text, and Linear is not a causal language model \
(a transformers model that can generate); write new_tokens=0 for one forward
        """
        if not isinstance(plan, InferencePlan):
            raise MemlabError(f"{plan!r} is not a memlab.InferencePlan; write memlab.InferencePlan(...)")
        if plan.generates:
            if not self.causal:
                raise MemlabError(
                    f"new_tokens={plan.new_tokens} generates text, and {type(self.model).__name__} is not a causal "
                    "language model (a transformers model that can generate); write new_tokens=0 for one forward"
                )
            if self.prompt_tokens is None:
                raise MemlabError(
                    f"new_tokens={plan.new_tokens} generates from input_ids, and the batch has none as (rows, "
                    "tokens); write batch = {'input_ids': ids} with ids of shape (rows, tokens)"
                )
        positions = learned_positions(self.model)
        if positions is not None and self.prompt_tokens is not None:
            needed = self.prompt_tokens + max(plan.new_tokens - 1, 0)
            if needed > positions:
                room = positions - self.prompt_tokens + 1
                instead = f"new_tokens <= {room}" if room >= 1 and plan.generates else "a shorter batch"
                tokens = f"{self.prompt_tokens} tokens of input_ids" + (
                    f" and {plan.new_tokens} new tokens" if plan.generates else ""
                )
                raise MemlabError(
                    f"{tokens} need {needed} positions, and {type(self.model).__name__} learned "
                    f"{positions} (config.max_position_embeddings); write {instead}"
                )
        if plan.quantize != "none":
            check_quantizable(self.model, plan.quantize)
            if self.probe.times_steps:  # a real run needs bitsandbytes (a dry run counts its layout)
                try:
                    import bitsandbytes  # noqa: F401
                except ImportError:
                    raise MemlabError(
                        f"quantize={plan.quantize!r} needs bitsandbytes; pip install bitsandbytes, or write "
                        "quantize='none'"
                    ) from None
        if plan.weights == "bf16" and self.device.type == "cuda":
            from memlab.measure.device import cuda_bf16_supported

            if not cuda_bf16_supported(self.device):
                raise MemlabError("this GPU has no bf16; write weights='fp16' (or 'fp32')")

    @contextlib.contextmanager
    def session(self) -> Iterator[None]:
        """Capture the model once; whatever happens inside, it comes back bit-exact."""
        self._structure = ModuleStructure.capture(self.model)
        own = [*self.model.parameters(), *self.model.buffers(), *(t for _, t in named_tensors(self.batch))]
        held = self.probe.held_before(own, [p.grad for p in unique_parameters(self.model)])
        self._held_before, self._held_bytes = held.tensors, held.bytes
        self._values = ModelValues.capture(self.model, parameters=False)
        self._values.detach_grads()
        try:
            yield
        finally:
            self._structure.restore()
            self._values.restore()
            self._values = self._structure = None
            self._held_before = []
            self._held_bytes = 0
            release_memory(collect=False)

    def run(self, plan: InferencePlan, index: int = 0, total: int = 1, *, capped: bool = True) -> InferenceTrial:
        """Measure one plan; the model is restored afterwards (inside ``session()``, or in one of its own).

        ``capped=False`` runs without the budget's limit and still judges the trial against it.
        """
        if self._values is None or self._structure is None:
            self.check(plan)
            with self.session():
                return self.run(plan, index, total, capped=capped)
        with quiet(self.options.verbose):
            return self._run(plan, index, total, capped=capped)

    def _run(self, plan: InferencePlan, index: int, total: int, *, capped: bool) -> InferenceTrial:
        assert self._values is not None and self._structure is not None
        limit = self.probe.bound(self.budget if capped else None)
        self._emit(TrialStarted(plan=plan, index=index, total=total))  # type: ignore[arg-type]
        record = _Record(plan, self._held_bytes)
        if plan.weights == "fp16" and self.device.type == "cpu" and self.probe.times_steps:
            record.notes.append(_FP16_CPU_NOTE)
        undo: Callable[[], None] | None = None
        try:
            self.model.eval()  # as serving and evaluation run it (no dropout); the session puts the flags back
            undo = prepare_weights(self.model, plan)
            with self.probe.cap(limit):
                self._warm_up(plan, index, limit, record)
                self._tracked_step(plan, index, limit, record)
                if self.probe.times_steps:
                    self._timed_steps(plan, index, record)
            record.status = "ok"
        except KeyboardInterrupt as interrupt:
            traceback.clear_frames(interrupt.__traceback__)
            record.error = "interrupted"
            raise
        except Exception as error:  # noqa: BLE001 - every failure of a plan is reported, never raised
            record.fail(error)
            release_error(error)
            del error
        finally:
            if undo is not None:
                undo()
            self._structure.restore()
            self._values.restore()
            self._values.detach_grads()
            release_memory(collect=record.status != "ok" or record.error is not None)
        trial = record.to_trial(
            device=self.device,
            rows=plan.rows(self.rows),
            prompt_tokens=self.prompt_tokens,
            budget=self.budget,
            rss_bytes=self.probe.rss_bytes(),
        )
        self._emit(TrialFinished(trial=trial, index=index, total=total))
        return trial

    # --- steps ---

    def _tracker(self, budget: int | None, on_sample: Callable[[int], None] | None = None) -> MemoryTracker:
        params = [*unique_parameters(self.model), *self.model.buffers(), *quantization_tensors(self.model)]
        other = [tensor for _, tensor in named_tensors(self.batch)] + self._held_before
        return MemoryTracker(
            baseline={"params": params, "other": other},
            budget=budget if self.probe.tracker_enforces_budget else None,
            device=self.device,
            on_sample=on_sample,
            categories=INFERENCE_CATEGORIES,
        )

    def _warm_up(self, plan: InferencePlan, index: int, limit: int | None, record: _Record) -> None:
        tracked = limit is not None and self.probe.tracker_enforces_budget
        cold = self.probe.times_steps and self.device.type not in _WARM_DEVICE_TYPES
        minimum = max(self.options.warmup, 1)
        seconds_taken: list[float] = []
        allocator: CudaPeak | None = None
        finished = False
        try:
            with self.probe.allocator_peak() as allocator:
                for number in range(minimum + _EXTRA_WARMUP_LIMIT):
                    if number >= minimum and (not cold or warmed_up(seconds_taken)):
                        break
                    self.probe.synchronize()
                    started = self.clock()
                    if tracked:
                        with self._tracker(limit) as tracker:
                            try:
                                self.step(plan, tracker)
                            finally:
                                record.reading = PeakReading(
                                    max(record.reading.peak_bytes, tracker.peak_bytes), dict(tracker.breakdown)
                                )
                    else:
                        self.step(plan)
                    self.probe.synchronize()
                    seconds = self.clock() - started
                    seconds_taken.append(seconds)
                    self._emit(StepFinished(plan, index, number, "warmup", seconds, None, None, None))  # type: ignore[arg-type]
            finished = True
            if self.probe.times_steps:
                _WARM_DEVICE_TYPES.add(self.device.type)
        finally:
            if not finished:
                record.reading = read_failed_peak(record.reading, allocator)

    def _tracked_step(self, plan: InferencePlan, index: int, limit: int | None, record: _Record) -> None:
        started = self.clock()

        def sample(live_bytes: int) -> None:
            self._emit(MemorySample(plan=plan, index=index, seconds=self.clock() - started,  # type: ignore[arg-type]
                                    live_bytes=live_bytes))

        tracker = self._tracker(limit, sample if self.options.callback else None)
        allocator: CudaPeak | None = None
        try:
            with self.probe.allocator_peak() as allocator, tracker:
                result = self.step(plan, tracker)
        finally:
            record.reading = read_peak(tracker, allocator)
        record.cache_bytes, record.cache_tokens = result.cache_bytes, result.cache_tokens
        self._emit(
            StepFinished(plan, index, 0, "tracked", self.clock() - started, None,  # type: ignore[arg-type]
                         tracker.live_bytes, record.reading.peak_bytes)
        )

    def _timed_steps(self, plan: InferencePlan, index: int, record: _Record) -> None:
        spent = 0.0
        while True:
            self.probe.synchronize()
            started = self.clock()
            result = self.step(plan)
            self.probe.synchronize()
            seconds = self.clock() - started
            spent += seconds
            number = len(record.step_times)
            record.step_times.append(seconds)
            if result.prefill_s is not None:
                record.prefill_times.append(result.prefill_s)
            record.decode_times.extend(result.decode_s)
            self._emit(StepFinished(plan, index, number, "timed", seconds, None, None, None))  # type: ignore[arg-type]
            if timed_enough(record.step_times, spent, self.options):
                return

    def step(self, plan: InferencePlan, tracker: MemoryTracker | None = None) -> StepResult:
        """Run one step of ``plan`` (its weights already on the model) under ``torch.inference_mode()``; with a
        tracker, allocations are charged to their categories."""
        with torch.inference_mode():
            inputs = self._sized_inputs(plan)
            if plan.generates:
                return self._generate(plan, inputs, tracker)
            cache = new_cache(self.model) if self.causal and plan.kv_cache else None
            untrack = track_cache(cache, tracker)
            try:
                with _phase(tracker, "activations"):
                    output = self._forward(inputs, cache, plan.kv_cache, last_only=False)
                del output
                return StepResult(cache_bytes=cache_bytes(cache), cache_tokens=cache_tokens(cache))
            finally:
                untrack()

    def _generate(self, plan: InferencePlan, inputs: Any, tracker: MemoryTracker | None) -> StepResult:
        ids = inputs["input_ids"]
        mask = inputs.get("attention_mask")
        cache = new_cache(self.model) if plan.kv_cache else None
        untrack = track_cache(cache, tracker)
        try:
            self.probe.synchronize()
            started = self.clock()
            prompt = {"input_ids": ids} if mask is None else {"input_ids": ids, "attention_mask": mask}
            with _phase(tracker, "activations"):
                logits = self._forward(prompt, cache, plan.kv_cache, last_only=True).logits
                next_token = logits[:, -1:].argmax(-1)
                del logits
            self.probe.synchronize()
            result = StepResult(prefill_s=self.clock() - started)
            sequence = torch.cat([ids, next_token], dim=1)
            for _ in range(plan.new_tokens - 1):
                self.probe.synchronize()
                started = self.clock()
                if mask is not None:
                    mask = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=1)
                step = {"input_ids": next_token if plan.kv_cache else sequence}
                if mask is not None:
                    step["attention_mask"] = mask
                with _phase(tracker, "activations"):
                    logits = self._forward(step, cache, plan.kv_cache, last_only=True).logits
                    next_token = logits[:, -1:].argmax(-1)
                    del logits
                sequence = torch.cat([sequence, next_token], dim=1)
                self.probe.synchronize()
                result.decode_s.append(self.clock() - started)
            result.cache_bytes, result.cache_tokens = cache_bytes(cache), cache_tokens(cache)
            return result
        finally:
            untrack()

    def _forward(self, inputs: Any, cache: Any, use_cache: bool, *, last_only: bool) -> Any:
        if self.causal:
            keywords = dict(inputs)
            keywords["use_cache"] = use_cache and cache is not None
            if cache is not None:
                keywords["past_key_values"] = cache
            if last_only and self.logits_to_keep:
                keywords["logits_to_keep"] = 1
            return self.model(**keywords)
        if isinstance(inputs, Mapping):
            return self.model(**inputs)
        if isinstance(inputs, torch.Tensor):
            return self.model(inputs)
        return self.model(*inputs)

    def _sized_inputs(self, plan: InferencePlan) -> Any:
        """The inputs with the plan's rows (repeated or cut), floating-point inputs in the weights' dtype."""
        inputs = self.inputs
        rows = plan.rows(self.rows)
        if rows != self.rows:
            inputs = take_rows(inputs, torch.arange(rows) % self.rows)
        dtype = DTYPES[plan.weights]
        return map_tensors(inputs, lambda t: t.to(dtype) if t.is_floating_point() and t.dtype != dtype else t)

    def _emit(self, event: Any) -> None:
        for listener in self._listeners:
            listener(event)


def _phase(tracker: MemoryTracker | None, category: str) -> contextlib.AbstractContextManager[Any]:
    return tracker.phase(category) if tracker is not None else contextlib.nullcontext()


def _model_inputs(batch: Batch) -> Any:
    """The batch as the forward takes it: ``labels`` left out (inference computes no loss)."""
    if isinstance(batch, Mapping):
        return {key: value for key, value in batch.items() if key != "labels"}
    return batch


class _Record(TrialRecord):
    """What one inference trial has found so far (a training trial's record, with its failure rule, plus the
    prefill and decode times and the KV cache); becomes an InferenceTrial at the end, whatever stopped it."""

    def __init__(self, plan: InferencePlan, held_before_bytes: int) -> None:
        super().__init__(plan, held_before_bytes)  # type: ignore[arg-type]
        self.inference_plan = plan
        self.reading = PeakReading(breakdown=dict.fromkeys(INFERENCE_CATEGORIES, 0))
        self.prefill_times: list[float] = []
        self.decode_times: list[float] = []
        self.cache_bytes = 0
        self.cache_tokens = 0

    def to_trial(  # type: ignore[override]
        self, *, device: torch.device, rows: int, prompt_tokens: int | None, budget: int | None, rss_bytes: int | None
    ) -> InferenceTrial:
        ok = self.status == "ok"
        step_time = statistics.median(self.step_times) if ok and self.step_times else None
        plan = self.inference_plan
        if not step_time:
            tokens_per_s = None
        elif plan.generates:
            tokens_per_s = rows * plan.new_tokens / step_time
        else:
            tokens_per_s = rows * prompt_tokens / step_time if prompt_tokens else None
        prefill = statistics.median(self.prefill_times) if ok and self.prefill_times else None
        decode = statistics.median(self.decode_times) if ok and self.decode_times else None
        return InferenceTrial(
            plan=plan,  # type: ignore[arg-type]
            status=self.status,
            peak_bytes=int(self.reading.peak_bytes),
            breakdown={k: v for k, v in self.reading.breakdown.items() if k in INFERENCE_CATEGORIES},
            step_time_s=step_time,
            samples_per_s=rows / step_time if step_time else None,
            tokens_per_s=tokens_per_s,
            device=str(device),
            error=self.error,
            rows_per_step=rows,
            budget=budget,
            reserved_bytes=self.reading.reserved_bytes,
            rss_bytes=rss_bytes,
            preexisting_bytes=self.held_before_bytes,
            notes=tuple(dict.fromkeys(self.notes)),
            step_times=tuple(self.step_times) if ok else (),
            prefill_tokens_per_s=rows * prompt_tokens / prefill if prefill and prompt_tokens else None,
            decode_tokens_per_s=rows / decode if decode else None,
            kv_cache_end_bytes=self.cache_bytes if ok else 0,
            context_tokens=self.cache_tokens if ok and self.cache_tokens else None,
        )
