"""A GRPOTrainer launched on several GPUs (DeepSpeed ZeRO-2/3, FSDP1/2), its step per GPU (issue 85).

Each rank generates and trains on its own share of the generation batch (``per_device_train_batch_size x
steps_per_generation`` completions, as on one GPU), so its training step is the sharded route's estimate of the
policy on one optimizer step's generations (:mod:`memlab.estimation.sharded.per_gpu`), with a reference model held
apart (``beta != 0`` without peft) sharded as TRL prepares it (:func:`memlab.trainer.reference.with_reference`).
Before it, what TRL 1.16 does on each rank (``trl/models/utils.py``, ``trl/distributed.py``,
``trl/generation/vllm_generation.py``):

- **generation with transformers** (``use_vllm=False``): ``unwrap_model_for_generation`` gathers the whole policy on
  every rank under ZeRO-3 (``ds3_gather_for_generation=True``, the default: ``GatheredParameters`` over all its
  parameters) for the whole of ``generate``; with it False, and under FSDP, the weights are gathered a unit at a time
  as the training forward gathers them; ZeRO-2 holds them whole anyway. The KV cache and decode step are the
  one-device generation's (:func:`~memlab.kinds.grpo.estimate.generation_trial`).
- **generation with vLLM**: the policy's weights are pushed to the engine first. Under ZeRO-3 a peft policy is
  gathered whole to merge its adapters (``gather_params(list(model.parameters()))``); other policies are gathered a
  parameter at a time, as FSDP2 does (``full_tensor()``); FSDP1 summons a unit at a time. A colocated engine holds its
  share on every rank (its weights and kv-heads split over ``vllm_tensor_parallel_size`` ranks, which generate
  their prompts together); a served one holds nothing here and answers for its own GPUs with every rank's prompts.

Between steps a rank holds its weights' shard (ZeRO-2: the whole weights), the optimizer state's shard, DeepSpeed's
gradient buckets (allocated at start-up under ZeRO-3, kept from the last backward under ZeRO-2:
``deepspeed/runtime/zero/stage3.py``, ``stage_1_and_2.py``) and under ZeRO-3 its flat buffer of gradient
partitions; TRL's ``zero_grad`` frees the rest. The answer's peak is the
largest of the phases (``weight sync``, ``generation``, ``training``), named in its note; its timeline has a point
for each phase, at its peak (the training step's own points are not kept by a sharded estimate).

Example:
    >>> gathered_for_generation("zero2", whole=100, unit=10, gather=True)
    (0, 'the weights are whole on every rank under ZeRO-2')
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any

from memlab.live.sharding import ENGINE_NAMES, whole_shape
from memlab.report.timeline import Timeline, TimelinePeak
from memlab.sizes import format_bytes
from memlab.trainer.reference import reference_bytes, with_reference

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from memlab.estimation.sharded.fsdp2 import ShardedTrial
    from memlab.kinds.grpo.estimate import EngineMemory
    from memlab.kinds.grpo.source import GRPOSource
    from memlab.report.data import Trial
    from memlab.techniques.vllm import VLLMSettings

__all__ = ["fsdp2_generation_gathers", "gathered_for_generation", "gathered_for_sync", "sharded_grpo_step"]

def gathered_for_generation(strategy: str, *, whole: int, unit: int, gather: bool) -> tuple[int, str]:
    """The weights a rank gathers while transformers' ``generate`` runs (bytes), and how: ``whole`` (the policy's
    weights as the engine holds them) under ZeRO-3 with ``ds3_gather_for_generation`` (``gather``), ``unit`` (the
    training forward's gathered unit) where the engine gathers as it runs, nothing under ZeRO-2.

    Example:
        >>> gathered_for_generation("zero3", whole=100, unit=10, gather=True)[0], gathered_for_generation(
        ...     "zero3", whole=100, unit=10, gather=False)[0]
        (100, 10)
    """
    if strategy == "zero2":
        return 0, "the weights are whole on every rank under ZeRO-2"
    if strategy == "zero3" and gather:
        return whole, (f"ZeRO-3 gathers the whole policy on every rank for generate ({format_bytes(whole)}; "
                       "GRPOConfig(ds3_gather_for_generation=False) gathers a module at a time, slower)")
    return unit, (f"{ENGINE_NAMES.get(strategy, strategy)} gathers the weights a unit at a time as in the training "
                  f"forward ({format_bytes(unit)})")


def fsdp2_generation_gathers(model: Any, gpus: int, element: int | None) -> tuple[int, str]:
    """The weights a rank holds gathered while transformers' ``generate`` runs under FSDP2 (bytes), and how. TRL 1.16
    gathers nothing itself (``DistributedBackend.summon_full_params`` is a no-op for FSDP2); each decode step's forward
    gathers the units accelerate made (:func:`~memlab.estimation.sharded.fsdp2.units.fsdp2_layout`) one after another.
    The tail (final norm and head, ``reshard_after_forward=False``) stays gathered from the first step on; the
    largest other unit is the most gathered at once, and while FSDP2 gathers it it holds, beside the unit's own
    gathered parameters, the all-gather's output buffer (the whole unit) until ``foreach_all_gather_copy_out`` has
    copied it out, and a shard more (torch 2.13 takes the input as a slice of the output buffer; two gloo ranks'
    generation held the shard beside it, 0.960 of their measured phase with it, 0.915 without). ``element``: the
    bytes a floating-point parameter is gathered in (the mixed-precision policy's), None for as held.

    Example:
        >>> import torch
        >>> from transformers import LlamaConfig, LlamaForCausalLM
        >>> with torch.device("meta"):
        ...     model = LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        ...                                          num_attention_heads=2, vocab_size=256))
        >>> head, block = (256 * 64 + 64) * 4, (4 * 64 * 64 + 3 * 64 * 128 + 2 * 64) * 4  # the tail; a block, fp32
        >>> fsdp2_generation_gathers(model, 2, None)[0] == head + 2 * block + block // 2
        True
    """
    from memlab.estimation.sharded.fsdp2.units import fsdp2_layout

    def size(modules: list[Any]) -> int:
        return sum(_parameter_sizes([p for module in modules for p in module.parameters()], element))

    layout = fsdp2_layout(model)
    kept = sum(size(units) for units, reshard in layout if not reshard)
    largest = max((size(units) for units, reshard in layout if reshard), default=0)
    gathering = 2 * largest + -(-largest // gpus)
    return kept + gathering, (
        f"FSDP2 gathers the weights a unit at a time as in the training forward: the head's unit stays gathered "
        f"({format_bytes(kept)}), and gathering the largest unit holds it with the all-gather's buffers "
        f"({format_bytes(gathering)})")


def gathered_for_sync(strategy: str, *, whole: int, largest: int, unit: int, peft: bool) -> tuple[int, str]:
    """The weights a rank gathers while TRL pushes the policy to vLLM (bytes), and how (the module docstring).

    Example:
        >>> gathered_for_sync("zero3", whole=100, largest=30, unit=10, peft=True)[0], gathered_for_sync(
        ...     "zero3", whole=100, largest=30, unit=10, peft=False)[0]
        (100, 30)
    """
    if strategy == "zero2":
        return 0, "the weights are whole on every rank under ZeRO-2"
    if strategy == "zero3" and peft:
        return whole, (f"ZeRO-3 gathers the whole peft policy on every rank to merge its adapters before pushing the "
                       f"weights ({format_bytes(whole)})")
    if strategy == "fsdp1":
        return unit, f"FSDP1 summons one unit at a time to push it ({format_bytes(unit)})"
    return largest, (f"{ENGINE_NAMES.get(strategy, strategy)} gathers one parameter at a time to push it (the largest, "
                     f"{format_bytes(largest)})")


def sharded_grpo_step(training: ShardedTrial, settings: VLLMSettings | None, source: GRPOSource, *,
                      generation: Callable[[], Trial], engine_of: Callable[[int], EngineMemory],
                      sampling: int) -> Trial:
    """The GRPO step per GPU from its sharded training step (``training``, the policy on one optimizer step's
    generations): the weight sync (with vLLM), the generation and the training, the peak the largest (the module
    docstring). What one rank's generation holds comes from the one-device estimate's parts
    (:mod:`memlab.kinds.grpo.estimate`): ``generation()``, the dry run of transformers' ``generate``;
    ``engine_of(ranks)``, a vLLM engine's memory on a trainer's GPU; ``sampling``, what sampling adds to the decode
    step.

    Example (``tests/kinds/grpo/test_grpo_sharded.py`` builds the trainer)::

        trial = memlab.estimate(grpo_trainer, gpus=8, strategy="zero3", gpu="H100-80GB")
    """
    trainer = source.trainer
    gpus, strategy = training.gpus, training.strategy
    plain_training = training
    training = with_reference(training, trainer)
    reference_share = training.breakdown.get("other", 0) - plain_training.breakdown.get("other", 0)
    if reference_share and strategy == "fsdp2":  # with_reference adds the gathered reference to the step as well
        reference_share = -(-reference_bytes(trainer.ref_model) // gpus)
    detail = training.detail
    unit = detail.get("unsharded_params", 0)
    # ZeRO-3's persistent parameters (under stage3_param_persistence_threshold) stay whole on every rank
    weights_held = detail.get("sharded_params", 0) + detail.get("persistent_params", 0) + (
        unit if strategy == "zero2" else 0)
    grads_held = detail.get("sharded_grads", 0) if strategy == "zero3" else 0
    buckets = detail.get("communication", 0) if strategy.startswith("zero") else 0
    held = {"params": weights_held, "grads": grads_held, "optimizer": detail.get("optimizer", 0),
            "activations": 0, "other": reference_share + buckets}
    element = 2 if training.plan.precision in ("bf16", "fp16") or training.plan.weights == "bf16" else None
    # a whole gather counted whole, the persistent parameters (whole already) too: their few bytes on a large model
    whole = sum(_parameter_sizes(source.model.parameters(), element))
    phases: list[tuple[str, dict[str, int]]] = []
    said: list[str] = []
    engine = None
    if settings is None:
        decoded = generation()
        if decoded.status != "ok" or decoded.timeline is None:
            return dataclasses.replace(training, status="error",
                                       error=f"the generation phase could not be estimated: {decoded.error}")
        line = decoded.timeline
        # as on one GPU: the decode's activations and KV cache, sampling's scores after the prefill, its other
        points = [(line.series["activations"][i] + line.series["kv_cache"][i] + (sampling if i else 0),
                   line.series["other"][i]) for i in range(len(line.x))]
        decode, other = max(points, key=sum)
        if strategy == "fsdp2":
            gathered, how = fsdp2_generation_gathers(source.model, gpus, element)
        else:
            gathered, how = gathered_for_generation(
                strategy, whole=whole, unit=unit, gather=bool(getattr(trainer.args, "ds3_gather_for_generation", True)))
        phases.append(("generation", {**held, "params": weights_held + gathered, "activations": decode,
                                      "other": held["other"] + other}))
        said.append(f"generation with transformers: {how}; the KV cache and decode step of {source.generation_batch} "
                    f"completions of {source.prompt_tokens} + {source.completion_tokens} tokens on each rank")
    else:
        engine = engine_of(gpus)
        # FSDP pushes each parameter as it stores it (full_tensor), ZeRO in the dtype it computes in
        pushed = None if strategy.startswith("fsdp") else element
        largest = max(_parameter_sizes(source.model.parameters(), pushed), default=0)
        gathered, how = gathered_for_sync(strategy, whole=whole, largest=largest, unit=unit,
                                          peft=hasattr(source.model, "peft_config"))
        awake_before = engine.awake if not settings.sleep else engine.during
        phases.append(("weight sync", {**held, "params": weights_held + gathered,
                                       "other": held["other"] + awake_before}))
        phases.append(("generation", {**held, "other": held["other"] + engine.awake}))
        said.append(f"weight sync to vLLM: {how}")
        said.append(engine.note)
    during = engine.during if engine is not None else 0
    training_breakdown = {**training.breakdown, "other": training.breakdown.get("other", 0) + during}
    phases.append(("training", training_breakdown))
    totals = {name: sum(breakdown.values()) for name, breakdown in phases}
    at = max(range(len(phases)), key=lambda index: totals[phases[index][0]])
    top = phases[at]
    summary = ", ".join(f"{name} {format_bytes(totals[name])}" for name, _ in phases)
    note = f"GRPO step per GPU of {gpus} ({strategy}): {summary}; the peak is in {top[0]}"
    reserved = training.reserved_bytes
    if reserved is not None:
        reserved += during + max(totals[top[0]] - totals["training"], 0)
    categories = tuple(training.breakdown)
    timeline = Timeline(categories, list(range(len(phases))),
                        {name: [breakdown.get(name, 0) for _, breakdown in phases] for name in categories},
                        [(name, index, index) for index, (name, _) in enumerate(phases)],
                        TimelinePeak(totals[top[0]], top[0], "", dict(top[1]), {}, at=at), events=len(phases),
                        device=training.device)
    trial = dataclasses.replace(
        training, peak_bytes=totals[top[0]], breakdown=dict(top[1]), reserved_bytes=reserved, timeline=timeline,
        plan=training.plan.replace(**(settings.plan_fields() if settings is not None else {})),
        host_bytes=training.host_bytes + (engine.host if engine is not None else 0),
        notes=(*training.notes, note, *said, source.note))
    if engine is not None and engine.refusal is not None:
        return dataclasses.replace(trial, status="error", error=engine.refusal)
    return trial


def _parameter_sizes(parameters: Iterable[Any], element: int | None) -> list[int]:
    """The bytes of each of ``parameters`` (a tied one once), whole (a ZeRO-3 partition at its whole shape),
    floating-point elements at ``element`` bytes where given (the dtype the engine holds them in)."""
    sizes = {}
    for parameter in parameters:
        per = element if element is not None and parameter.is_floating_point() else parameter.element_size()
        sizes[id(parameter)] = math.prod(whole_shape(parameter)) * per
    return list(sizes.values())
