"""``memlab.estimate(grpo_trainer)``: a GRPO step on fake tensors, its generation and training phases (issue 59).

Two dry runs make the step, each on the trainer's own code where fake tensors allow it:

- **training**: one optimizer step's generations (``per_device_train_batch_size x gradient_accumulation_steps``
  rows of the longest prompt + ``max_completion_length`` tokens, every completion token counted, advantages and the
  reference / old-policy log-probs the config computes) through the plan's step with the trainer's
  ``compute_loss``: the existing one-device dry run (:func:`memlab.estimation.dryrun.single_gpu.estimate_plans`).
- **generation**: the generation batch's prompts decoded to ``max_completion_length`` new tokens on the same fake
  model, prefill then one decode step per token with transformers' ``DynamicCache``
  (:func:`memlab.estimation.dryrun.single_gpu.estimate_inference`): its KV cache ends at
  ``2 x layers x kv-heads x head-dim x (prompt + completion - 1) x rows x bytes`` (:func:`memlab.inference.kv.
  kv_cache_bytes`), with the decode step's logits and activations; sampling adds ``2 x rows x vocab x 4`` bytes
  (the float32 scores its logits processors make and the probabilities ``multinomial`` draws from), which a greedy
  dry run has not. The training step's weights and optimizer state are held through it (a steady step).

The peak is the larger of the two phases, named on the timeline (``"generation"`` first, then the training
phases). A reference model the trainer holds apart (``beta != 0`` without peft) is counted under ``"other"`` in
both. The reference and old-policy log-probs are a forward without gradients over the same tokens as the training
forward, which holds at least as much, so they are not a phase of their own here (``measure`` shows them).

Example:
    >>> sampling_bytes(rows=8, vocab=32000)
    2048000
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import torch

from memlab.errors import MemlabError
from memlab.plan import Plan
from memlab.report.data import Trial
from memlab.report.timeline import Timeline, TimelinePeak
from memlab.trainer.grpo import GRPOSource, check_generations, computes_old_logps
from memlab.trainer.source import keeps_trainer_batch

__all__ = ["estimate_grpo", "grpo_plans_estimator", "sampling_bytes"]

_WEIGHTS = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


def sampling_bytes(rows: int, vocab: int) -> int:
    """What sampling adds to a decode step over greedy decoding: the float32 scores the logits processors return
    and the probabilities ``multinomial`` draws from, ``rows x vocab`` each.

    Example:
        >>> sampling_bytes(rows=1, vocab=10)
        80
    """
    return 2 * rows * vocab * 4


def grpo_plans_estimator(trainer: Any, loss_fn: Any = None) -> Callable[..., list[Trial]]:
    """``estimate(plans, *, budget, device, lr) -> trials``: each plan's GRPO step on fake tensors
    (:func:`estimate_grpo` through ``memlab.estimate``), what ``fit`` prunes a GRPOTrainer's plans with. The search
    asks for a plan's cheap twin (at most 2 micro-batches: :func:`memlab.search.strategy.cheap_twin`); a GRPO step
    generates and trains on all of the trainer's generations whatever the plan, so the twin is answered with the
    whole step's estimate (the same micro-batch, gradients held between micro-batches alike), under the twin's plan.

    Example:
        >>> callable(grpo_plans_estimator(object()))
        True
    """

    def estimate_plans(plans: Sequence[Plan], *, budget: int | None, device: Any, lr: float) -> list[Trial]:
        from memlab.estimation.estimate import estimate

        generations = trainer.args.per_device_train_batch_size * trainer.args.gradient_accumulation_steps
        trials = []
        for plan in plans:
            whole = plan
            if plan.micro_batch and plan.micro_batch * plan.accumulation != generations \
                    and generations % plan.micro_batch == 0:
                whole = plan.replace(accumulation=generations // plan.micro_batch)
            trial = estimate(trainer, whole, loss_fn=loss_fn, budget=budget, device=device, lr=lr)
            trials.append(trial if whole is plan else dataclasses.replace(trial, plan=plan))
        return trials

    return estimate_plans


def estimate_grpo(request: Any) -> Trial:
    """A GRPO trainer's step estimated on fake tensors (the module's two dry runs); ``request`` is memlab.estimate's
    :class:`~memlab.estimation.request.EstimateRequest`, its plan None (the trainer as set up) or a Plan (the
    trainer's effective batch kept). Nothing on the trainer changes.

    Raises:
        MemlabError: a batch given, several GPUs, or what :class:`~memlab.trainer.grpo.GRPOSource` refuses.
    """
    from memlab.estimation.dryrun.single_gpu import estimate_inference
    from memlab.estimation.request import route
    from memlab.inference.plan import InferencePlan
    from memlab.trainer.entry import split_plans

    trainer = request.model
    batch, plan = split_plans(request.batch, request.plan)
    if batch is not None:
        raise MemlabError(
            "a GRPOTrainer's batch is what it generates from its train dataset's prompts, so memlab takes none with "
            "it: write memlab.estimate(trainer) or memlab.estimate(trainer, memlab.Plan(...)); for the longest "
            "max_completion_length or the most generations per device that fit, memlab.limits(trainer, budget=..., "
            "vary='tokens' or 'rows')"
        )
    if request.gpus != 1 or request.strategy != "none":
        raise MemlabError("memlab estimates a GRPOTrainer's step on one device; drop gpus= and strategy=")
    if plan is not None and not isinstance(plan, Plan):
        raise MemlabError(f"{plan!r} is not a memlab.Plan; write memlab.estimate(trainer, memlab.Plan(...))")
    source = GRPOSource.from_trainer(trainer)
    plan = source.plan if plan is None else keeps_trainer_batch(plan, trainer.args)
    check_generations(plan, source)
    loss_fn = request.loss_fn if request.loss_fn is not None else source.loss_fn()
    with source.generating():
        training = route(request.replace(model=source.model, batch=_generated(source), loss_fn=loss_fn, plan=plan))
    if training.status != "ok" or training.timeline is None:
        return training
    parameter = next(iter(source.model.parameters()))
    weights = _WEIGHTS.get(parameter.dtype, "fp32")
    generation = estimate_inference(
        source.model, {"input_ids": (source.generation_batch, source.prompt_tokens)},
        InferencePlan(new_tokens=source.completion_tokens, weights=weights), device=request.device, gpu=request.gpu,
    ).trials[0]
    if generation.status != "ok" or generation.timeline is None:
        return dataclasses.replace(training, notes=(*training.notes, "the generation phase could not be estimated: "
                                                    f"{generation.error}"))
    vocab = int(getattr(source.model.config, "vocab_size", 0) or 0)
    reference = _reference_bytes(trainer)
    return _combined(training, generation, sampling_bytes(source.generation_batch, vocab), reference, source)


def _generated(source: GRPOSource) -> dict[str, torch.Tensor]:
    """One optimizer step's generations as ``_generate_and_score_completions`` returns them: every completion full
    length (its mask all ones), and the log-probs the config computes."""
    rows, prompt, completion = source.generations, source.prompt_tokens, source.completion_tokens
    vocab = int(getattr(source.model.config, "vocab_size", 2) or 2)
    generator = torch.Generator().manual_seed(0)
    batch = {
        "prompt_ids": torch.randint(vocab, (rows, prompt), generator=generator),
        "prompt_mask": torch.ones(rows, prompt, dtype=torch.long),
        "completion_ids": torch.randint(vocab, (rows, completion), generator=generator),
        "completion_mask": torch.ones(rows, completion, dtype=torch.long),
        "advantages": torch.randn(rows, generator=generator),
    }
    if computes_old_logps(source.trainer):
        batch["old_per_token_logps"] = -torch.rand(rows, completion, generator=generator)
    if source.trainer.beta != 0.0:
        batch["ref_per_token_logps"] = -torch.rand(rows, completion, generator=generator)
    return batch


def _reference_bytes(trainer: Any) -> int:
    """The bytes of a reference model held apart from the policy (none: 0)."""
    reference = getattr(trainer, "ref_model", None)
    if reference is None or getattr(trainer, "beta", 0.0) == 0.0:
        return 0
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                for t in (*reference.parameters(), *reference.buffers()) if t.device.type != "meta"}
    return sum(storages.values())


def _combined(training: Trial, generation: Trial, sampling: int, reference: int, source: GRPOSource) -> Trial:
    """The training estimate with the generation phase put before it on the timeline, the peak the larger."""
    train_line, gen_line = training.timeline, generation.timeline
    assert train_line is not None and gen_line is not None
    categories = train_line.categories
    params, optimizer = training.breakdown.get("params", 0), training.breakdown.get("optimizer", 0)
    other_before = train_line.series["other"][0] if train_line.series.get("other") else 0
    series: dict[str, list[int]] = {name: [] for name in categories}
    for index in range(len(gen_line.x)):
        point = {"params": params, "grads": 0, "optimizer": optimizer,
                 "activations": gen_line.series["activations"][index] + gen_line.series["kv_cache"][index]
                 + (sampling if index else 0),
                 "other": other_before + reference + gen_line.series["other"][index]}
        for name in categories:
            series[name].append(point.get(name, 0))
    offset = gen_line.x[-1] + 1
    for name in categories:
        series[name].extend(value + (reference if name == "other" else 0) for value in train_line.series[name])
    x = [*gen_line.x, *(value + offset for value in train_line.x)]
    phases = [("generation", 0, gen_line.x[-1]), *((name, a + offset, b + offset) for name, a, b in train_line.phases)]
    totals = [sum(series[name][i] for name in categories) for i in range(len(gen_line.x))]
    top = max(range(len(totals)), key=totals.__getitem__)
    generation_peak = totals[top]
    training_peak = training.peak_bytes + reference
    if generation_peak > training_peak:
        breakdown = {name: series[name][top] for name in categories}
        peak = TimelinePeak(generation_peak, "generation", gen_line.peak.module, breakdown, {}, at=x[top])
    else:
        breakdown = {**training.breakdown, "other": training.breakdown.get("other", 0) + reference}
        peak = dataclasses.replace(train_line.peak, bytes=training_peak, by_category=breakdown,
                                   at=train_line.peak.at + offset)
    timeline = Timeline(categories, x, series, phases, peak, events=offset + train_line.events,
                        device=train_line.device)
    held = f"; a reference model's {reference:,} bytes under other" if reference else ""
    note = (f"GRPO step: generation peak {generation_peak:,} bytes ({source.generation_batch} completions of "
            f"{source.prompt_tokens} + {source.completion_tokens} tokens, the KV cache "
            f"{max(gen_line.series['kv_cache']):,} bytes at its largest, sampling {sampling:,}), training peak "
            f"{training_peak:,} bytes; the peak is in {peak.phase}{held}")
    reserved = training.reserved_bytes
    if reserved is not None and peak.bytes > training_peak:
        reserved += peak.bytes - training_peak  # the generation's extra bytes on the training step's reserve
    return dataclasses.replace(training, peak_bytes=peak.bytes, breakdown=breakdown, timeline=timeline,
                               reserved_bytes=reserved, notes=(*training.notes, note, source.note))
