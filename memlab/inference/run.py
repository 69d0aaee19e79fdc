"""Measuring inference on the live model: a forward, or a generation, under ``torch.inference_mode()``.

The one runner of training trials (:class:`~memlab.runner.core.Runner`) runs them, with the
:class:`InferenceWorkload`: the same probe per device (the budget, the peak, the memory held before), the same
:class:`~memlab.measure.tracker.MemoryTracker` (here with the categories params, activations, kv_cache and other),
the same warm-up, out-of-memory handling and timing rule (:func:`memlab.runner.core.timed_enough`) and the same
A B A B race for close contenders; and the model comes back bit-exact: the session captures the model's structure
and buffers once, the plan's weights are put on (:mod:`memlab.inference.weights`) and taken off again, and inference
mode changes no parameter. Importing this module registers :class:`InferenceRunner` for :class:`InferencePlan`, so
``memlab.measure`` and ``memlab.compare`` run inference plans here.

A step is one request (:mod:`memlab.inference.step`): one forward, or a generation with its prefill and decode
steps. The model runs in eval mode (no dropout), as serving and evaluation run it; its ``training`` flags come back
with the rest. The weights (quantization scales included) count as ``"params"``, and the batch, the generated ids
and memory held before the run as ``"other"``.

Example:
    >>> from memlab.plan import InferencePlan
    >>> model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
    >>> trial = measure_inference(model, torch.randn(8, 16), InferencePlan(weights="bf16"), steps=1, noise=0)
    >>> trial.status, trial.breakdown["params"] == 2 * sum(p.numel() for p in model.parameters())
    ('ok', True)
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import nn
from typing_extensions import Unpack

from memlab.errors import MemlabError
from memlab.inference.kv import learned_positions
from memlab.inference.step import InferenceStep, is_encoder_decoder
from memlab.inference.weights import check_quantizable, prepare_weights, quantization_tensors
from memlab.live.batch import Batch, atomic_refusal, is_atomic
from memlab.live.inputs import DECODER_KEYS
from memlab.live.quiet import quiet
from memlab.live.structure import unique_parameters
from memlab.measure.tracker import INFERENCE_CATEGORIES, MemoryTracker
from memlab.options import RunKeywords, RunOptions
from memlab.plan import InferencePlan
from memlab.report import InferenceTrial, Report
from memlab.runner.core import Runner, register_runner
from memlab.runner.trial import run_plans
from memlab.runner.workload import Attempt, RunContext, StepKind, TrialRecord, Workload

__all__ = [
    "InferenceAttempt",
    "InferenceRecord",
    "InferenceRunner",
    "InferenceWorkload",
    "check_inference_options",
    "check_inference_plans",
    "compare_inference",
    "measure_inference",
]

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
    return run_plans(InferenceRunner, model, batch, plans, RunOptions.from_keywords(options))


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


SKIPPED_DECODE_NOTE = (
    "generation estimated by its shape: the prefill, the first decode step and the last (the KV cache grown to its "
    "full length between them) instead of every decode step, so its cost does not grow with the new tokens; the "
    "allocated peak is a step-by-step dry run's, the card figure up to about 3% below it where decode holds the peak "
    "(the allocator's segments split as the cache grows one token at a time)"
)


class InferenceRecord(TrialRecord):
    """What one inference trial has found so far: what every trial records, plus the prefill and decode times and
    the KV cache at the end of the tracked step.

    Example:
        >>> InferenceRecord(InferencePlan(), 0).reading.breakdown
        {'params': 0, 'activations': 0, 'kv_cache': 0, 'other': 0}
    """

    def __init__(self, plan: InferencePlan, held_before_bytes: int) -> None:
        super().__init__(plan, held_before_bytes, INFERENCE_CATEGORIES)
        self.prefill_times: list[float] = []
        self.decode_times: list[float] = []
        self.cache_bytes = 0
        self.cache_tokens = 0


class InferenceAttempt(Attempt):
    """An inference plan's weights on the model (in eval mode): one step is one request (:class:`InferenceStep`).

    Example:
        >>> from memlab.measure.probes import probe_for
        >>> model = nn.Linear(4, 2)
        >>> context = RunContext(model, torch.randn(3, 4), RunOptions(), probe_for(model), rows=3)
        >>> record = InferenceRecord(InferencePlan(), 0)
        >>> attempt = InferenceAttempt(InferenceStep(context), InferencePlan(), record, undo=lambda: None)
        >>> attempt.step(None, "timed"), len(record.prefill_times), attempt.steady()
        (None, 0, True)
    """

    warms_state = False  # a request leaves nothing the next one starts from: a dry run tracks the first

    def __init__(self, run: InferenceStep, plan: InferencePlan, record: InferenceRecord, undo: Any) -> None:
        self.run = run
        self.plan = plan
        self.record = record
        self.undo = undo

    def step(self, tracker: MemoryTracker | None, kind: StepKind) -> None:
        result = self.run(self.plan, tracker)
        if kind == "tracked":
            self.record.cache_bytes, self.record.cache_tokens = result.cache_bytes, result.cache_tokens
            if result.skipped_decode and SKIPPED_DECODE_NOTE not in self.record.notes:
                self.record.notes.append(SKIPPED_DECODE_NOTE)
        elif kind == "timed":
            if result.prefill_s is not None:
                self.record.prefill_times.append(result.prefill_s)
            self.record.decode_times.extend(result.decode_s)
        return None

    def baseline(self) -> dict[str, list[torch.Tensor | None]]:
        model = self.run.model
        return {"params": [*unique_parameters(model), *model.buffers(), *quantization_tensors(model)]}

    def take_off(self) -> None:
        self.undo()


class InferenceWorkload(Workload[InferencePlan, InferenceRecord, InferenceTrial]):
    """Inference plans: the plan's weights put on (cast or quantized) and taken off, a step that is one request,
    and a trial with prefill and decode speeds and the KV cache.

    Example:
        >>> InferenceWorkload.categories
        ('params', 'activations', 'kv_cache', 'other')
    """

    categories = INFERENCE_CATEGORIES

    def __init__(self, context: RunContext) -> None:
        super().__init__(context)
        self.inference_step = InferenceStep(context)

    @classmethod
    def check_options(cls, options: RunOptions) -> None:
        check_inference_options(options)

    @classmethod
    def check_plans(cls, plans: Any) -> list[InferencePlan]:
        return check_inference_plans(plans)

    def check(self, plan: InferencePlan) -> None:
        """A clear error, before anything runs, for a plan this model or batch cannot run.

        Example:
            >>> InferenceRunner(nn.Linear(4, 2), torch.randn(2, 4)).check(InferencePlan(new_tokens=8))
            Traceback (most recent call last):
            ...
            memlab.errors.MemlabError: new_tokens=8 generates text, and Linear is not a causal language model \
(a transformers model that can generate); write new_tokens=0 for one forward
        """
        if not isinstance(plan, InferencePlan):
            raise MemlabError(f"{plan!r} is not a memlab.InferencePlan; write memlab.InferencePlan(...)")
        model, step, probe = self.context.model, self.inference_step, self.context.probe
        if is_atomic(self.context.batch) and plan.rows(self.context.rows) != self.context.rows:
            raise atomic_refusal(self.context.rows, f"batch_size={plan.batch_size}", (
                f"write batch_size=None (or batch_size={self.context.rows}); or make a batch of the rows you want "
                "with the processor and pass that"))
        if plan.generates:
            if not step.causal:
                raise MemlabError(
                    f"new_tokens={plan.new_tokens} generates text, and {type(model).__name__} is not a causal "
                    "language model (a transformers model that can generate); write new_tokens=0 for one forward"
                )
            if step.prompt_tokens is None:
                raise MemlabError(
                    f"new_tokens={plan.new_tokens} generates from input_ids, and the batch has none as (rows, "
                    "tokens); write batch = {'input_ids': ids} with ids of shape (rows, tokens)"
                )
        if is_encoder_decoder(model) and not (
            isinstance(step.inputs, Mapping) and any(key in step.inputs for key in DECODER_KEYS)
        ):
            raise MemlabError(
                f"{type(model).__name__} is an encoder-decoder: its forward needs the decoder's tokens as well as "
                "input_ids; add the target token ids to the batch as labels (as training takes them) or as "
                "decoder_input_ids, e.g. batch = {'input_ids': ids, 'labels': target_ids}"
            )
        positions = learned_positions(model)
        if positions is not None and step.prompt_tokens is not None:
            needed = step.prompt_tokens + max(plan.new_tokens - 1, 0)
            if needed > positions:
                room = positions - step.prompt_tokens + 1
                instead = f"new_tokens <= {room}" if room >= 1 and plan.generates else "a shorter batch"
                tokens = f"{step.prompt_tokens} tokens of input_ids" + (
                    f" and {plan.new_tokens} new tokens" if plan.generates else ""
                )
                raise MemlabError(
                    f"{tokens} need {needed} positions, and {type(model).__name__} learned "
                    f"{positions} (config.max_position_embeddings); write {instead}"
                )
        if plan.quantize != "none":
            check_quantizable(model, plan.quantize)
            if probe.times_steps:  # a real run needs bitsandbytes (a dry run counts its layout)
                try:
                    with quiet():  # what it logs as memlab's check loads it changes no result: kept out
                        import bitsandbytes  # noqa: F401
                except ImportError:
                    raise MemlabError(
                        f"quantize={plan.quantize!r} needs bitsandbytes; pip install bitsandbytes, or write "
                        "quantize='none'"
                    ) from None

    def new_record(self, plan: InferencePlan, held_before_bytes: int) -> InferenceRecord:
        return InferenceRecord(plan, held_before_bytes)

    def put_on(self, plan: InferencePlan, record: InferenceRecord) -> InferenceAttempt:
        if plan.weights == "fp16" and self.context.device.type == "cpu" and self.context.probe.times_steps:
            record.notes.append(_FP16_CPU_NOTE)
        if self.inference_step.decoder_note:
            record.notes.append(self.inference_step.decoder_note)
        probe = self.context.probe
        if plan.weights == "bf16" and probe.device.type == "cuda" and probe.real:  # a dry run reads no device
            from memlab.live.device import cuda_bf16_supported
            from memlab.techniques.precision import bf16_emulated

            if not cuda_bf16_supported(probe.device):
                record.notes.append(bf16_emulated(torch.cuda.get_device_capability(probe.device),
                                                  torch.cuda.get_device_name(probe.device), weights=plan.weights))
        self.context.model.eval()  # as serving and evaluation run it (no dropout); the session puts the flags back
        undo = prepare_weights(self.context.model, plan)
        return InferenceAttempt(self.inference_step, plan, record, undo)

    def to_trial(self, record: InferenceRecord, *, budget: int | None, rss_bytes: int | None) -> InferenceTrial:
        plan: InferencePlan = record.plan
        rows, prompt_tokens, ok = plan.rows(self.context.rows), self.inference_step.prompt_tokens, record.ok
        step_time = record.step_time
        if not step_time:
            tokens_per_s = None
        elif plan.generates:
            tokens_per_s = rows * plan.new_tokens / step_time
        else:
            tokens_per_s = rows * prompt_tokens / step_time if prompt_tokens else None
        prefill = statistics.median(record.prefill_times) if ok and record.prefill_times else None
        decode = statistics.median(record.decode_times) if ok and record.decode_times else None
        return InferenceTrial(
            **record.trial_fields(device=self.context.device, budget=budget, rss_bytes=rss_bytes),
            samples_per_s=rows / step_time if step_time else None,
            tokens_per_s=tokens_per_s,
            rows_per_step=rows,
            prefill_tokens_per_s=rows * prompt_tokens / prefill if prefill and prompt_tokens else None,
            decode_tokens_per_s=rows / decode if decode else None,
            kv_cache_end_bytes=record.cache_bytes if ok else 0,
            context_tokens=record.cache_tokens if ok and record.cache_tokens else None,
        )


class InferenceRunner(Runner[InferencePlan, InferenceTrial]):
    """Runs inference plans on one model and batch: the :class:`~memlab.runner.core.Runner` with the
    :class:`InferenceWorkload` (its keywords: ``options``, where ``loss_fn`` and ``lr`` are not used, ``probe``: a
    dry run passes a :class:`~memlab.measure.probes.FakeProbe`, ``clock``, ``listener``).

    Example:
        >>> model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
        >>> runner = InferenceRunner(model, torch.randn(4, 4), RunOptions(steps=1, noise=0))
        >>> with runner.session():
        ...     trials = [runner.run(InferencePlan()), runner.run(InferencePlan(batch_size=32))]
        >>> [t.status for t in trials], trials[1].rows_per_step
        (['ok', 'ok'], 32)
    """

    workload_type = InferenceWorkload


register_runner(InferencePlan, InferenceRunner)
