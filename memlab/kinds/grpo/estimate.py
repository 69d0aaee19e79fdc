"""``memlab.estimate(grpo_trainer)``: a GRPO step on fake tensors, its generation and training phases (issue 59).

Two dry runs make the step, each on the trainer's own code where fake tensors allow it:

- **training**: one optimizer step's generations (``per_device_train_batch_size x gradient_accumulation_steps``
  rows of the longest prompt + ``max_completion_length`` tokens, every completion token counted, advantages and the
  reference / old-policy log-probs the config computes) through the plan's step with the trainer's
  ``compute_loss``: the existing one-device dry run (:func:`memlab.estimation.dryrun.single_gpu.estimate_plans`).
- **generation**: the generation batch's prompts decoded to ``max_completion_length`` new tokens on the same fake
  model with transformers' ``DynamicCache`` (:func:`memlab.estimation.dryrun.single_gpu.estimate_inference`), costed
  by its shape: the prefill, the first decode step and the last, the cache grown between them as the steps in
  between leave it (:func:`memlab.inference.kv.grow_cache`), so the estimate takes about as long at 4,096 tokens as at
  64: its KV cache ends at
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
from typing import TYPE_CHECKING, Any, cast

import torch

from memlab.errors import MemlabError
from memlab.kinds.grpo.server import server_memory
from memlab.kinds.grpo.source import GRPOSource, check_generations, check_processes, computes_old_logps
from memlab.kinds.grpo.vllm import SLEEP_LEVEL, VLLMSettings, engine_device, utilization_candidates, vllm_share
from memlab.live.patching import patched
from memlab.plan import InferencePlan, Plan
from memlab.report.data import Trial
from memlab.report.timeline import Timeline, TimelinePeak
from memlab.sizes import format_bytes
from memlab.techniques.vllm import FIELDS, VLLMServer, sets_vllm, without_vllm
from memlab.trainer.reference import reference_bytes
from memlab.trainer.sharding import engine_plan
from memlab.trainer.source import keeps_trainer_batch

if TYPE_CHECKING:
    from memlab.estimation.cuda.gpus import GpuKind

__all__ = ["EngineMemory", "engine_memory", "estimate_grpo", "estimate_grpo_vllm", "fitted_vllm", "generation_trial",
           "grpo_plans_estimator", "sampling_bytes", "source_sampling_bytes"]

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
    """``estimate(plans, *, budget, device, lr, gpu=None) -> trials``: each plan's GRPO step on fake tensors
    (:func:`estimate_grpo` through ``memlab.estimate``), what ``fit`` prunes a GRPOTrainer's plans with. The search
    asks for a plan's cheap twin (at most 2 micro-batches: :func:`memlab.search.strategy.cheap_twin`); a GRPO step
    generates and trains on all of the trainer's generations whatever the plan, so the twin is answered with the
    whole step's estimate (the same micro-batch, gradients held between micro-batches alike), under the twin's plan.

    Example:
        >>> callable(grpo_plans_estimator(object()))
        True
    """

    def estimate_plans(plans: Sequence[Plan], *, budget: int | None, device: Any, lr: float,
                       gpu: GpuKind | None = None) -> list[Trial]:
        from memlab.estimation.estimate import estimate
        from memlab.estimation.request import EstimateRequest

        generations = trainer.args.per_device_train_batch_size * trainer.args.gradient_accumulation_steps
        settings = VLLMSettings.of(trainer)
        colocated = settings is not None and settings.colocated
        device = engine_device(trainer, device)
        trials = []
        for plan in plans:
            whole = plan
            if plan.micro_batch and plan.micro_batch * plan.accumulation != generations \
                    and generations % plan.micro_batch == 0:
                whole = plan.replace(accumulation=generations // plan.micro_batch)
            if colocated:
                request = EstimateRequest(trainer, None, whole, loss_fn=loss_fn, budget=budget, lr=lr, device=device,
                                          gpu=gpu)
                trial = fitted_vllm(request.checked())
            else:
                trial = estimate(trainer, whole, loss_fn=loss_fn, budget=budget, device=device, lr=lr, gpu=gpu)
            # the asked plan, with the engine's settings the dry run chose (fitted_vllm's search)
            engine = {name: getattr(trial.plan, name) for name in FIELDS} if colocated else {}
            trials.append(dataclasses.replace(trial, plan=plan.replace(**engine)))
        return trials

    return estimate_plans


def estimate_grpo(request: Any) -> Trial:
    """A GRPO trainer's step estimated on fake tensors (the module's two dry runs); ``request`` is memlab.estimate's
    :class:`~memlab.estimation.request.EstimateRequest`, its plan None (the trainer as set up) or a Plan (the
    trainer's effective batch kept). Nothing on the trainer changes.

    Raises:
        MemlabError: a batch given, or what :class:`~memlab.kinds.grpo.source.GRPOSource` refuses. With ``gpus=`` and
            ``strategy=`` (or a trainer set up for DeepSpeed or FSDP), the step per GPU
            (:func:`~memlab.kinds.grpo.sharded.sharded_grpo_step`).
    """
    from memlab.estimation.sharded.fsdp2 import ShardedTrial
    from memlab.kinds.grpo.sharded import sharded_grpo_step

    settings = VLLMSettings.for_plan(request.model, _asked(request), gpus=request.gpus)
    training, source, request = _training_step(request, settings)
    if training.status != "ok":
        return training
    if isinstance(training, ShardedTrial) and training.gpus > 1:
        return sharded_grpo_step(
            training, settings, source, generation=lambda: generation_trial(source, request),
            engine_of=lambda ranks: engine_memory(cast(VLLMSettings, settings), source, request, ranks=ranks),
            sampling=source_sampling_bytes(source))
    if training.timeline is None:
        return training
    if settings is not None:
        return _with_vllm(training, settings, source, request)
    generation = generation_trial(source, request)
    if generation.status != "ok" or generation.timeline is None:
        return dataclasses.replace(training, notes=(*training.notes, "the generation phase could not be estimated: "
                                                    f"{generation.error}"))
    reference = _reference_bytes(source.trainer)
    return _combined(training, generation, source_sampling_bytes(source), reference, source)


def generation_trial(source: GRPOSource, request: Any) -> Trial:
    """The generation phase's dry run: the generation batch's prompts decoded to ``max_completion_length`` new tokens
    with transformers' ``generate`` on the policy as it is (the module docstring)."""
    from memlab.estimation.dryrun.liger import liger_kernels
    from memlab.estimation.dryrun.single_gpu import dry_run_inference
    from memlab.inference.weights import HELD_AS_LOADED

    parameter = next(iter(source.model.parameters()))
    weights = _WEIGHTS.get(parameter.dtype, "fp32")
    # TRL generates with the policy's weights as they are: a peft model's adapters stay in fp32 beside bf16 weights,
    # which the inference plan's one dtype would cast.
    with patched(source.model, **{HELD_AS_LOADED: True}), liger_kernels(source.trainer):  # as train() generates
        # Without cuBLAS's workspace: the training step's, under the other its timeline starts with, holds them.
        return dry_run_inference(
            source.model, {"input_ids": (source.generation_batch, source.prompt_tokens)},
            InferencePlan(new_tokens=source.completion_tokens, weights=weights), device=request.device,
            gpu=request.gpu,
        ).trials[0]


def source_sampling_bytes(source: GRPOSource) -> int:
    """What sampling adds to the generation batch's decode step (:func:`sampling_bytes` of the policy's vocabulary)."""
    return sampling_bytes(source.generation_batch, int(getattr(source.model.config, "vocab_size", 0) or 0))


def estimate_grpo_vllm(request: Any, variants: Sequence[VLLMSettings]) -> list[Trial]:
    """The step of a GRPOTrainer that generates with vLLM, estimated once per vLLM setting in ``variants`` (the
    policy's training dry run made once: the engine's settings do not change it); what ``fit`` searches the engine's
    share and sleep mode with. ``request`` as for :func:`estimate_grpo`.

    Example (``tests/kinds/grpo/test_grpo_vllm.py`` builds such a trainer)::

        low, asleep = estimate_grpo_vllm(EstimateRequest(trainer, gpu=GPUS["L4-24GB"]),
                                         [VLLMSettings("colocate", 0.1, False), VLLMSettings("colocate", 0.3, True)])
    """
    first = VLLMSettings.of(request.model)
    if first is None:
        raise MemlabError("this GRPOTrainer generates with transformers (use_vllm=False): it has no vLLM settings to "
                          "vary; estimate it with memlab.estimate(trainer)")
    training, source, request = _training_step(request, variants[0] if variants else first)
    if training.status != "ok" or training.timeline is None:
        return [training for _ in variants]
    return [_with_vllm(training, settings, source, request) for settings in variants]


def fitted_vllm(request: Any) -> Trial:
    """A vLLM-generating GRPOTrainer's step with the engine's settings searched within ``request.budget``, the
    training kept the same, where the plan leaves them to the trainer (``vllm_memory`` and ``vllm_sleep`` None; a
    plan that sets either is estimated as it is): the trainer's own settings first; where they do not fit, sleep
    mode off with the smaller shares (:func:`~memlab.kinds.grpo.vllm.utilization_candidates`, largest first: each
    still holds the generation batch at once), then sleep mode on with each of them. The first that fits, its plan
    holding them (``vllm_memory``, ``vllm_sleep``: what ``plan.to_training_arguments(trl=trl.GRPOConfig)`` writes)
    and its first note naming the ``GRPOConfig`` keywords; the trainer's own estimate where none does. The training
    dry run is made once.

    Example (``tests/kinds/grpo/test_grpo_vllm.py`` builds such a trainer)::

        trial = fitted_vllm(EstimateRequest(trainer, budget="12GiB", gpu=GPUS["L4-24GB"]).checked())
    """
    from memlab.estimation.cuda.gpus import kind_or_default

    asked = _asked(request)
    own = VLLMSettings.of(request.model)
    if own is None or not own.colocated or (asked is not None and sets_vllm(asked)):
        return estimate_grpo(request)
    training, source, request = _training_step(request, own)
    if training.status != "ok" or training.timeline is None:
        return training
    first = _with_vllm(training, own, source, request)
    if first.fits or first.status != "ok":
        return first
    share = vllm_share(own, source.model, card=kind_or_default(request.gpu).memory_bytes, prompt=source.prompt_tokens,
                       completion=source.completion_tokens, sequences=source.generation_batch)
    shares = sorted(utilization_candidates(share), reverse=True)
    variants = [dataclasses.replace(own, utilization=value, sleep=sleep) for sleep in sorted({own.sleep, True})
                for value in shares]
    for settings in variants:
        if settings == own:
            continue
        trial = _with_vllm(training, settings, source, request)
        if trial.status == "ok" and trial.fits:
            costs = ("the engine's weights pushed again from the policy before each generation (it slept at level "
                     f"{SLEEP_LEVEL}), no other change") if settings.sleep and not own.sleep else \
                "a smaller share that still holds the generation batch's KV cache at once"
            note = (f"searched: GRPOConfig(vllm_gpu_memory_utilization={settings.utilization}, vllm_enable_sleep_mode="
                    f"{settings.sleep}) (the trainer has {own.utilization}, {own.sleep}) keeps the training the "
                    f"same; it costs {costs}")
            return dataclasses.replace(trial, notes=(note, *trial.notes))
    return first


def _asked(request: Any) -> Any:
    """The plan memlab.estimate was asked for (None: the trainer as set up)."""
    from memlab.trainer.entry import split_plans

    return split_plans(request.batch, request.plan)[1]


def _training_step(request: Any, settings: VLLMSettings | None) -> tuple[Trial, GRPOSource, Any]:
    """The policy's training step on one optimizer step's generations, estimated (with the source read and the
    request as answered: on the card where a vLLM engine shares it)."""
    from memlab.estimation.dryrun.liger import liger_kernels
    from memlab.estimation.routes import route
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
    if plan is not None and not isinstance(plan, Plan):
        raise MemlabError(f"{plan!r} is not a memlab.Plan; write memlab.estimate(trainer, memlab.Plan(...))")
    sharded = request.gpus != 1 or request.strategy != "none"
    if sharded:  # TRL checked its batches for the processes the trainer was built in, not for those asked
        check_processes(trainer.args, request.gpus)
    source = GRPOSource.from_trainer(trainer, vllm=True, sharded=sharded)
    # the engine's levers do not change the policy's step: its dry run runs without them (_with_vllm puts them back)
    plan = without_vllm(source.plan if plan is None else keeps_trainer_batch(plan, trainer.args))
    check_generations(plan, source)
    if sharded:
        plan = engine_plan(trainer, plan, request.gpus)
    loss_fn = request.loss_fn if request.loss_fn is not None else source.loss_fn()
    if settings is not None and settings.colocated:
        request = _on_the_card(request)
    with source.generating(), liger_kernels(trainer):  # Liger's kernels as train() puts them on
        training = route(request.replace(model=source.model, batch=_generated(source), loss_fn=loss_fn, plan=plan))
    return training, source, request


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
    if getattr(source.trainer, "use_vllm", False):  # vLLM's own log-probs of the tokens it sampled
        batch["sampling_per_token_logps"] = -torch.rand(rows, completion, generator=generator)
        if getattr(source.trainer, "vllm_importance_sampling_correction", False):
            sequence = str(getattr(source.trainer, "vllm_importance_sampling_mode", "")).startswith("sequence")
            batch["importance_sampling_ratio"] = torch.ones(rows, 1 if sequence else completion)
    return batch


def _reference_bytes(trainer: Any) -> int:
    """The bytes of a reference model held apart from the policy (none: 0)."""
    reference = getattr(trainer, "ref_model", None)
    if reference is None or getattr(trainer, "beta", 0.0) == 0.0:
        return 0
    return reference_bytes(reference)


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
        peak = TimelinePeak(generation_peak, "generation", gen_line.peak.module, breakdown, {}, at=x[top],
                            model=gen_line.peak.model)
    else:
        breakdown = {**training.breakdown, "other": training.breakdown.get("other", 0) + reference}
        peak = dataclasses.replace(train_line.peak, bytes=training_peak, by_category=breakdown,
                                   at=train_line.peak.at + offset)
    timeline = Timeline(categories, x, series, phases, peak, events=offset + train_line.events,
                        device=train_line.device)
    held = f"; a reference model's {format_bytes(reference)} under other" if reference else ""
    note = (f"GRPO step: generation peak {format_bytes(generation_peak)} ({source.generation_batch} completions of "
            f"{source.prompt_tokens} + {source.completion_tokens} tokens, the KV cache "
            f"{format_bytes(max(gen_line.series['kv_cache']))} at its largest, sampling {format_bytes(sampling)}), "
            f"training peak {format_bytes(training_peak)}; the peak is in {peak.phase}{held}")
    # The reference model's weights are allocated beside the training step's, so they are on the card too (the
    # training dry run did not hold them: its reserve is the policy's alone).
    reserved = None if training.reserved_bytes is None else training.reserved_bytes + reference
    if reserved is not None and peak.bytes > training_peak:
        reserved += peak.bytes - training_peak  # the generation's extra bytes on the training step's reserve
    from memlab.inference.run import SKIPPED_DECODE_NOTE

    shape = tuple(said for said in generation.notes if said == SKIPPED_DECODE_NOTE)
    return dataclasses.replace(training, peak_bytes=peak.bytes, breakdown=breakdown, timeline=timeline,
                               reserved_bytes=reserved, notes=(*training.notes, note, *shape, source.note))


def _on_the_card(request: Any) -> Any:
    """The request for a trainer whose vLLM engine shares the card: answered for CUDA (vLLM runs on a GPU, and so
    does the training beside it) unless the device was given; a CPU device refused."""
    if request.device is None:
        return request.replace(device="cuda")
    if torch.device(request.device).type != "cuda":
        raise MemlabError(
            "this GRPOTrainer's vLLM engine shares a CUDA card (vllm_mode='colocate'), and "
            f"device={str(request.device)!r} has none; write memlab.estimate(trainer, gpu='H100-80GB') (or another "
            "gpu=), or estimate GRPOConfig(use_vllm=False) for a CPU"
        )
    return request


@dataclasses.dataclass(frozen=True)
class EngineMemory:
    """What a GRPOTrainer's vLLM engine holds on one of the trainer's GPUs (bytes): ``awake`` while it generates,
    ``during`` while the policy trains (a sleeping or served engine: 0), ``host`` kept in CPU memory; the note that
    says how, and why vLLM would not start (None where it starts)."""

    awake: int
    during: int
    host: int
    note: str
    refusal: str | None


def engine_memory(settings: VLLMSettings, source: GRPOSource, request: Any, *, ranks: int = 1) -> EngineMemory:
    """The engine's memory on a trainer's GPU: a colocated engine's share (:func:`~memlab.kinds.grpo.vllm.vllm_share`,
    its tensor-parallel part), or nothing for a served one, whose own GPUs the note answers
    (:func:`~memlab.kinds.grpo.server.server_memory`: the generation batches of all ``ranks`` training processes,
    which TRL gathers and sends to it).

    Example (``tests/kinds/grpo/test_grpo_vllm.py`` builds such a trainer)::

        engine = engine_memory(VLLMSettings.of(trainer), GRPOSource.from_trainer(trainer, vllm=True), request)
    """
    from memlab.estimation.cuda.gpus import kind_or_default

    tokens = source.prompt_tokens + source.completion_tokens
    if settings.colocated:
        kind = kind_or_default(request.gpu)
        share = vllm_share(settings, source.model, card=kind.memory_bytes, prompt=source.prompt_tokens,
                           completion=source.completion_tokens, sequences=source.generation_batch)
        return EngineMemory(share.share, share.during_training, share.host, share.note(kind.name), share.refusal())
    served = server_memory(request.vllm_server or VLLMServer(), source.model, trainer_gpu=request.gpu,
                           sequence_tokens=tokens, sequences=source.generation_batch * ranks)
    return EngineMemory(0, 0, 0, served.note() + "; the generation phase here is the policy's state while it waits",
                        served.refusal())


def _with_vllm(training: Trial, settings: VLLMSettings, source: GRPOSource, request: Any) -> Trial:
    """The training estimate with vLLM's generation put before it: a colocated engine's share (resident, or awake
    only while it generates with sleep mode) over the policy's training state, under ``"other"``; a served engine
    adds nothing to this card. An error trial where the share cannot hold the weights and one sequence."""
    line = training.timeline
    assert line is not None
    categories = line.categories
    reference = _reference_bytes(source.trainer)
    held = {"params": training.breakdown.get("params", 0), "optimizer": training.breakdown.get("optimizer", 0),
            "other": (line.series["other"][0] if line.series.get("other") else 0) + reference}
    engine = engine_memory(settings, source, request)
    awake, during, host, note, refusal = engine.awake, engine.during, engine.host, engine.note, engine.refusal
    before = awake if not settings.sleep else during
    series: dict[str, list[int]] = {name: [] for name in categories}
    for extra in (before, awake):
        for name in categories:
            series[name].append(held.get(name, 0) + (extra if name == "other" else 0))
    for name in categories:
        series[name].extend(value + ((reference + during) if name == "other" else 0) for value in line.series[name])
    offset = 2
    x = [0, 1, *(value + offset for value in line.x)]
    phases = [("generation", 0, 1), *((name, a + offset, b + offset) for name, a, b in line.phases)]
    generation_peak = sum(series[name][1] for name in categories)
    training_peak = training.peak_bytes + reference + during
    if generation_peak > training_peak:
        breakdown = {name: series[name][1] for name in categories}
        peak = TimelinePeak(generation_peak, "generation", "vLLM" if settings.colocated else "", breakdown, {}, at=1)
    else:
        breakdown = {**training.breakdown, "other": training.breakdown.get("other", 0) + reference + during}
        peak = dataclasses.replace(line.peak, bytes=training_peak, by_category=breakdown, at=line.peak.at + offset)
    timeline = Timeline(categories, x, series, phases, peak, events=offset + line.events, device=line.device)
    reserved = training.reserved_bytes
    if reserved is not None:
        reserved += during + max(peak.bytes - training_peak, 0)
    said = (f"GRPO step with vLLM: generation peak {format_bytes(generation_peak)}, training peak "
            f"{format_bytes(training_peak)}; the peak is in {peak.phase}")
    trial = dataclasses.replace(training, peak_bytes=peak.bytes, breakdown=breakdown, timeline=timeline,
                                plan=training.plan.replace(**settings.plan_fields()),
                                reserved_bytes=reserved, host_bytes=training.host_bytes + host,
                                notes=(*training.notes, said, note, source.note))
    if refusal is not None:
        return dataclasses.replace(trial, status="error", error=refusal)
    return trial
