"""Sharded estimates composed from a one-GPU dry run of the same plan: adapters (LoRA, QLoRA), quantized loads and
the chunked loss under FSDP1, FSDP2, ZeRO-2 and ZeRO-3, with the parameters or the optimizer offloaded.

``fully_shard`` cannot run on the fake 4-bit layers of a QLoRA dry run (bitsandbytes' ``Params4bit`` is not a
tensor FSDP2 can turn into a DTensor), and FSDP1's flat parameters cannot run on fake tensors at all. These plans
are estimated from the one-GPU dry run of the plan (:func:`memlab.estimation.dryrun.single_gpu.dry_run_plans`, which
runs the adapters, the load, the chunked loss and selective checkpointing as ``memlab.measure`` would), read over
its whole step (its :class:`~memlab.report.timeline.Timeline`): at every point of the step, each GPU holds

- ``(params + grads + optimizer) / N`` of the one-GPU step's bytes (the shards; under ZeRO-2 the weights whole),
- the gathered weights, in the dtype the engine gathers (the compute dtype; 4-bit weights stored in bf16,
  ``bnb_4bit_quant_storage=bf16``, gather as their packed bytes): FSDP2, the largest block or its tail (final
  norm and output head, gathered from forward to the head's backward), whichever is larger, as FSDP2's own dry run
  on fake tensors holds them at its peak (one block: the prefetch that overlaps it on CUDA streams is not seen);
  FSDP1, the root unit (embeddings, final norm, head), which stays gathered through backward, and the largest
  block, twice in a block's backward (:func:`fsdp1_blocks_gathered`: ``BACKWARD_PRE``, FSDP1's default,
  all-gathers the block below before the current one's backward computes; with the adapters' layers as units of
  their own, only as the block's backward ends); ZeRO-3, the largest layer twice (the one computing and the
  prefetch bucket's; none on one GPU, where DeepSpeed's ``NoGatherHandle`` views each partition); ZeRO-2 none (it
  holds every weight whole),
- one unit's unsharded gradients (the trained ones),
- under ZeRO, DeepSpeed's buckets (:mod:`memlab.estimation.sharded.zero`): ZeRO-3's reduce bucket whole
  (``reduce_bucket_size`` elements, however few parameters the adapters train), ZeRO-2's at most the trained
  parameters, and the gather bucket (ZeRO-2's all-gather, ZeRO-3's prefetch), each the request's DeepSpeed
  settings (a trainer's config, else DeepSpeed's defaults); under ZeRO-3 the model's parameters of at most
  ``stage3_param_persistence_threshold`` elements whole beside their partitions, in the compute dtype (adapters
  memlab adds in the dry run are not among them: their small matrices, partitioned, lean low by their whole size),
- the activations and the rest (``other``) of the one-GPU step, unchanged: data parallelism does not change them.

The per-GPU peak is the largest such sum over the step. With ``offload="params"`` (FSDP ``offload_params=True``,
DeepSpeed ``offload_param`` and ``offload_optimizer``) the shards live in CPU memory (``host_bytes``); with
``offload="optimizer"`` FSDP offloads the same (its one CPU offload is the parameters'), DeepSpeed the
gradients and the optimizer state. Two things a one-GPU step has that FSDP has not are left as they are, and said:
autocast's cache of weight casts (none for frozen weights: adapters' bases are not cast), and fp32 adapters' casts.

A CUDA estimate's reserve, under every strategy, is its allocated peak plus the one-GPU step's reserve over its own
peak (the activations are the same step's, and so are their segments); FSDP1's adds its unshard stream's pool
(:func:`fsdp1_stream_pool`). ZeRO's gathered layers live in DeepSpeed's all-gather stream's pool, which the
allocated peak already counts (two largest layers).
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from memlab.estimation.configs import model_on_meta, persistent_count
from memlab.estimation.dryrun.load import loaded_dtype, parse_load
from memlab.estimation.dryrun.single_gpu import dry_run_plans
from memlab.estimation.sharded.engine_settings import engine_settings
from memlab.estimation.sharded.fsdp2 import DETAIL, ShardedRequest, ShardedTrial, shard_units, sharded_trial
from memlab.live.sharding import ZeroSettings
from memlab.plan import Plan
from memlab.report import Trial
from memlab.techniques.offload import ACTIVATION_OFFLOADS, NO_OFFLOAD, OPTIMIZER_OFFLOADS, SHARDED_ONLY
from memlab.techniques.optimizer import EIGHT_BIT_OPTIMIZERS

__all__ = ["COMPOSED_NOTE", "DEEPSPEED_ADAPTER_CAST_NOTE", "DEEPSPEED_CAST_NOTE", "FSDP1_STREAMS_NOTE", "MIXED_NOTE",
           "RESERVE_NOTE", "ZERO_RESERVE_NOTE", "composed_estimate", "fsdp1_blocks_gathered", "fsdp1_stream_pool",
           "gathered_bytes", "needs_composition", "one_gpu_runs_kept"]

COMPOSED_NOTE = (
    "sharded from the one-GPU dry run of the same plan (memlab.estimation.sharded.composed): at each point of its step,"
    " the shards of its weights, gradients and optimizer state, the gathered units, and its activations unchanged"
)
"""The note of every composed estimate."""

RESERVE_NOTE = (
    "reserved_bytes of a composed estimate: its allocated peak plus the one-GPU step's reserve over its own peak "
    "(no sharded step is replayed through the allocator model; FSDP's communication streams may reserve more)"
)
"""The note of a composed estimate that carries a reserve."""

ZERO_RESERVE_NOTE = (
    "reserved_bytes of a composed ZeRO estimate: its allocated peak plus the one-GPU step's reserve over its own peak "
    "(the activations' segments are the same step's; no ZeRO step is replayed through the allocator model); "
    "DeepSpeed all-gathers the weights on its own stream, whose cached blocks hold the gathered layers the allocated "
    "peak counts"
)
"""The note of a composed ZeRO estimate that carries a reserve (ZeRO's formulas, :mod:`memlab.estimation.sharded.zero`,
carry none)."""

FSDP1_STREAMS_NOTE = (
    "reserved_bytes under FSDP1 adds its unshard stream's pool: FSDP1 allocates the gathered units on its own unshard "
    "stream, whose freed blocks the default stream cannot reuse, so that stream keeps its largest holding reserved: "
    "the root unit (embeddings, final norm, head; gathered from forward through backward) and two blocks (the one "
    "computing and the one prefetched: BACKWARD_PRE in backward, limit_all_gathers' second in forward), each rounded "
    "up to the allocator's 2 MiB, beyond what the allocated peak counts (the root and one block, two in a block's "
    "backward); with offload='params' also the pre-unshard stream's device copies of those units' shards; the "
    "post-backward stream's gradient buffers are not counted"
)
"""The note of a composed FSDP1 estimate whose reserve counts FSDP1's unshard stream (:func:`fsdp1_stream_pool`)."""

_SEGMENT = 2 << 20
"""The CUDA caching allocator rounds a large block's segment up to 2 MiB."""


def fsdp1_stream_pool(unit: int, kept: int, gpus: int, offloaded: bool = False) -> int:
    """The bytes FSDP1's own streams keep reserved apart from the default stream's: the unshard stream's gathered
    root (``kept``) and two gathered blocks (``unit`` each: the one computing and the prefetched one that
    ``limit_all_gathers`` allows), each rounded up to 2 MiB; with parameter offload, the pre-unshard stream's
    device copies of those units' CPU shards too (``/ gpus``).

    Example:
        >>> mib = 2**20
        >>> fsdp1_stream_pool(100 * mib, 500 * mib, 2) // mib
        700
        >>> fsdp1_stream_pool(101 * mib, 500 * mib, 2) // mib, fsdp1_stream_pool(100 * mib, 500 * mib, 2, True) // mib
        (704, 1050)
    """
    def rounded(nbytes: int) -> int:
        return -(-nbytes // _SEGMENT) * _SEGMENT

    pool = rounded(kept) + 2 * rounded(unit)
    if offloaded:
        pool += rounded(kept // max(gpus, 1)) + 2 * rounded(unit // max(gpus, 1))
    return pool


_BLOCK = re.compile(r"^(.*?\.\d+)(?:\.|$)")
"""The numbered block a module is in (``model.layers.3`` of ``model.layers.3.mlp``): FSDP1's wrap policy makes each
block a unit."""


def fsdp1_blocks_gathered(phases: Sequence[tuple[str, int, int]], x: Sequence[int], modules: Sequence[str],
                          nested: bool = False) -> list[int]:
    """How many blocks FSDP1 holds gathered at each point ``x`` of a one-GPU step (its timeline's ``phases`` and the
    module running at each point, :attr:`~memlab.report.timeline.Timeline.modules`), where ``nested`` says the
    adapters' layers are units of their own inside the blocks (peft's ``fsdp_auto_wrap_policy``).

    With ``backward_prefetch=BACKWARD_PRE`` (FSDP1's default, which accelerate and the recipes keep) each unit's
    pre-backward hook, after its own all-gather, all-gathers the unit before it in forward's post-forward order
    (``_pre_backward_hook`` calls ``_prefetch_handle``, ``torch/distributed/fsdp/_runtime_utils.py``;
    ``get_handle_to_backward_prefetch``, ``_exec_order_utils.py``), and a unit is freed only in its post-backward
    hook. A block's unit prefetches the block below it before its backward computes: two blocks through each
    block's backward but the last one's (block 0 has none below it). With nested adapter units, a block prefetches
    its last adapter layer instead, and the block below is all-gathered by the block's first adapter layer (in
    forward order), whose backward ends the block's: two blocks at the end of each block's backward only. The
    root's backward (head and loss) prefetches the last block beside the root, which is one block; forward holds
    one (``forward_prefetch=False``; ``limit_all_gathers`` bounds the all-gathers the CPU issues ahead, not what is
    allocated at once).

    Example:
        >>> phases = [("forward", 0, 3), ("backward", 3, 9), ("optimizer", 9, 10)]
        >>> running = ["", "layers.0", "layers.1", "lm_head", "layers.1.mlp", "", "layers.1.attn", "layers.0",
        ...            "layers.0.mlp", ""]
        >>> fsdp1_blocks_gathered(phases, range(10), running)
        [1, 1, 1, 1, 2, 2, 2, 1, 1, 1]
        >>> fsdp1_blocks_gathered(phases, range(10), running, nested=True)
        [1, 1, 1, 1, 1, 1, 2, 1, 1, 1]
    """
    counts = [1] * len(x)
    for name, start, end in phases:
        if name != "backward":
            continue
        runs: list[list[int]] = []  # [first point, last point] of each block's backward, in order
        current = None
        for index, point in enumerate(x):
            match = _BLOCK.match(modules[index]) if start < point <= end else None
            if match is None:
                continue
            if match.group(1) != current:
                runs.append([index, index])
                current = match.group(1)
            runs[-1][1] = index
        for first, last in runs[:-1]:
            for index in range(last if nested else first, last + 1):
                counts[index] = 2
    return counts


def needs_composition(plan: Plan, strategy: str, load: Mapping[str, Any] | None) -> bool:
    """Whether ``plan`` under ``strategy`` is estimated by composition (this module) rather than by the FSDP2 dry
    run or ZeRO's formulas: adapters, a 4-bit or 8-bit load, the chunked loss, or FSDP1 with any of them.

    Example:
        >>> needs_composition(Plan(loss="chunked"), "fsdp2", None), needs_composition(Plan(), "zero3", None)
        (True, False)
        >>> needs_composition(Plan(adapter="lora"), "zero3", {"quantization_config": {"load_in_4bit": True}})
        True
    """
    quantized = load is not None and parse_load(load, plan).quantize != "none"
    return plan.adapter != "none" or quantized or plan.loss != "full"


def _quantized(plan: Plan, load: Mapping[str, Any] | None) -> str:
    if plan.adapter == "qlora":
        return "nf4"
    return parse_load(load, plan).quantize if load is not None else "none"


MIXED_NOTE = (
    "FSDP's mixed precision gathers fp32 weights in the compute dtype, so the step (the residual stream and the "
    "checkpoints too) runs in it: the one-GPU step is run on the weights in that dtype, and the shards counted "
    "at fp32"
)
"""The note of a composed FSDP estimate of fp32 weights under bf16/fp16 mixed precision."""


def _mixed_precision_load(model_or_config: Any, plan: Plan, strategy: str,
                          load: Mapping[str, Any] | None) -> tuple[Mapping[str, Any] | None, float]:
    """The load of the one-GPU step a composed FSDP estimate reads, and the factor its weights' bytes take: FSDP's
    ``MixedPrecision(param_dtype=bf16)`` casts fp32 weights (frozen ones too) to bf16 for the whole step, where a
    one-GPU step under autocast keeps an fp32 residual stream; so fp32 weights are loaded in the compute dtype for
    the step and counted at twice its bytes in the shards. Anything else (a 16-bit or 4-bit load, pure bf16
    weights, ZeRO, whose bf16 mode casts the weights: :func:`_deepspeed_casts`) is read as it is."""
    compute = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(plan.precision)
    if (not strategy.startswith("fsdp") or compute is None or plan.weights != "fp32" or plan.adapter == "qlora"
            or isinstance(model_or_config, nn.Module)):  # a model is estimated as it is loaded
        return load, 1.0
    parsed = parse_load(load, plan)
    if parsed.quantize != "none" or loaded_dtype(model_or_config, parsed) != torch.float32:
        return load, 1.0
    kept = {k: v for k, v in (load or {}).items() if k not in ("dtype", "torch_dtype")}
    return {**kept, "dtype": compute}, 2.0



DEEPSPEED_CAST_NOTE = ("DeepSpeed's bf16 mode runs the whole module in bf16: it casts the weights as loaded (fp32 "
                       "here, frozen ones too) and keeps fp32 copies of the trained ones in its optimizer; the "
                       "weights are counted in bf16")
DEEPSPEED_ADAPTER_CAST_NOTE = ("DeepSpeed's bf16 mode runs the whole module in bf16: it casts the fp32 weights (here "
                               "the trained adapters only; the rest is loaded in 16 bits) and keeps fp32 copies of "
                               "the trained ones in its optimizer; the weights are counted in bf16")


_KEPT_RUNS: dict[Any, Trial] | None = None
"""The one-GPU dry runs kept inside :func:`one_gpu_runs_kept` (None outside it)."""


@contextlib.contextmanager
def one_gpu_runs_kept() -> Iterator[None]:
    """Inside the block, a composed estimate of a model (by identity) and one-GPU plan already estimated in it reuses
    that dry run: what a search over numbers of GPUs asks again and again (the same model, batch and loss at each
    number; only the composition depends on the number). Outside it, each estimate makes its own.

    Example:
        >>> with one_gpu_runs_kept():
        ...     pass
    """
    global _KEPT_RUNS
    outer = _KEPT_RUNS
    _KEPT_RUNS = {} if outer is None else outer
    try:
        yield
    finally:
        _KEPT_RUNS = outer


def _cast_note(model_or_config: Any) -> str:
    """What :func:`_deepspeed_casts` casts, said: every weight loaded in fp32, or only the trained ones (peft's fp32
    adapters on a 16-bit base)."""
    if isinstance(model_or_config, nn.Module) and all(
            parameter.requires_grad for parameter in model_or_config.parameters() if parameter.dtype == torch.float32):
        return DEEPSPEED_ADAPTER_CAST_NOTE
    return DEEPSPEED_CAST_NOTE


def _fsdp_casts_live(model_or_config: Any, plan: Plan, strategy: str) -> bool:
    """Whether FSDP's mixed precision casts a live model's fp32 weights for the step, as :func:`_mixed_precision_load`
    has a config's fp32 load cast: under FSDP with bf16/fp16 mixed precision, where every floating-point weight is
    held in fp32 (a model loaded so; a 16-bit base with fp32 adapters computes as loaded already). Two FSDP2 ranks
    of an fp32 LoRA model with bf16=True hold the step so (tests/trainer/test_trainer_fsdp2_ranks.py)."""
    if not strategy.startswith("fsdp") or plan.precision not in ("bf16", "fp16") or plan.weights != "fp32" or (
            plan.adapter == "qlora") or not isinstance(model_or_config, nn.Module):
        return False
    floating = [p for p in model_or_config.parameters() if p.is_floating_point()]
    return bool(floating) and all(p.dtype == torch.float32 for p in floating)


def _deepspeed_casts(model_or_config: Any, plan: Plan, strategy: str, load: Mapping[str, Any] | None) -> bool:
    """Whether DeepSpeed casts the plan's fp32 weights to bf16 (``"bf16": {"enabled": true}``, which a Trainer's
    ``bf16=True`` sets): under ZeRO with bf16 mixed precision, where the weights are held in fp32 (a live model
    loaded so, or a config's fp32 load). Its fp16 mode casts to fp16, which a training plan's weights cannot say;
    left as loaded."""
    if not strategy.startswith("zero") or plan.precision != "bf16" or plan.weights != "fp32" or (
            plan.adapter == "qlora"):
        return False
    if isinstance(model_or_config, nn.Module):
        return any(parameter.dtype == torch.float32 for parameter in model_or_config.parameters())
    parsed = parse_load(load, plan)
    return parsed.quantize == "none" and loaded_dtype(model_or_config, parsed) == torch.float32

def _compute_bytes(plan: Plan, load: Mapping[str, Any] | None) -> int:
    """Bytes per gathered element: the compute dtype's where the engine gathers in it (bf16/fp16 autocast, pure
    bf16 weights, a 16-bit load, a quantized load computing in bf16), else fp32's."""
    if plan.precision != "fp32" or plan.weights == "bf16" or plan.adapter == "qlora":
        return 2
    if load is not None:
        parsed = parse_load(load, plan)
        if parsed.quantize != "none" or parsed.dtype in (torch.bfloat16, torch.float16):
            return 2
    return 4


def gathered_bytes(model: nn.Module, strategy: str, element: int, quantize: str = "none") -> tuple[int, int]:
    """``(the largest unit's gathered bytes, what stays gathered)`` of ``model`` under ``strategy``: each unit of
    :func:`memlab.estimation.sharded.fsdp2.shard_units` at ``element`` bytes per parameter, its linear layers' weights
    at the packed bytes of ``quantize`` (``"nf4"``/``"fp4"``: half a byte and the double-quantized scales, about 0.516;
    ``"int8"``: one byte and a scale per row); what stays gathered is FSDP2's tail (final norm, output head) or FSDP1's
    root (embeddings too), nothing under ZeRO (whose largest layer is already the unit).

    Example:
        >>> from transformers import LlamaConfig, LlamaForCausalLM
        >>> with torch.device("meta"):
        ...     model = LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        ...                                          num_attention_heads=2, vocab_size=256))
        >>> unit, kept = gathered_bytes(model, "fsdp2", 2)
        >>> unit == 2 * sum(p.numel() for p in model.model.layers[0].parameters()), kept == 2 * (256 * 64 + 64)
        (True, True)
    """
    per_weight = {"nf4": 0.516, "fp4": 0.516, "int8": 1.0}.get(quantize)

    def nbytes(module: nn.Module) -> int:
        total = 0.0
        for sub in module.modules():
            for name, parameter in sub.named_parameters(recurse=False):
                quantized = per_weight is not None and isinstance(sub, nn.Linear) and name == "weight"
                total += parameter.numel() * (per_weight if quantized and per_weight else element)
        return int(total)

    units = shard_units(model)
    if strategy.startswith("zero"):
        largest = max((sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules()), default=0)
        return element * largest, 0
    unit = max((nbytes(m) for m in units), default=0)
    inside = {id(p) for m in units for p in m.parameters()}
    kept_modules: list[nn.Module] = []
    for getter in ("get_output_embeddings", *(("get_input_embeddings",) if strategy == "fsdp1" else ())):
        module = getattr(model, getter, lambda: None)()
        if isinstance(module, nn.Module):
            kept_modules.append(module)
    norms = [m for m in model.modules() if "Norm" in type(m).__name__]
    kept_modules += norms[-1:]
    seen: dict[int, int] = {}
    for module in kept_modules:
        for parameter in module.parameters():
            if id(parameter) not in inside:
                seen[id(parameter)] = parameter.numel() * element
    return unit, sum(seen.values())


def composed_estimate(request: ShardedRequest) -> ShardedTrial:
    """The per-GPU estimate of ``request``'s plan sharded over its ``gpus`` GPUs with its ``strategy`` (``"fsdp1"``,
    ``"fsdp2"``, ``"zero2"`` or ``"zero3"``), composed from its one-GPU dry run (the module docstring says how).

    Example:
        >>> from transformers import LlamaConfig
        >>> config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=4,
        ...                      num_attention_heads=2, vocab_size=256)
        >>> batch = {"input_ids": (1, 32), "labels": (1, 32)}
        >>> two = composed_estimate(ShardedRequest(config, batch, Plan(adapter="lora", lora_rank=4), 2, device="cpu"))
        >>> four = composed_estimate(ShardedRequest(config, batch, Plan(adapter="lora", lora_rank=4), 4, device="cpu"))
        >>> two.status, four.peak_bytes < two.peak_bytes, four.label
        ('ok', True, 'lora r4 fsdp2 x4')
    """
    model_or_config, plan, gpus, strategy = request.model, request.plan, request.gpus, request.strategy
    budget, load = request.budget, request.load
    one_gpu = plan.replace(offload=ACTIVATION_OFFLOADS[0] if plan.offloads_activations else NO_OFFLOAD)
    one_load, scale = _mixed_precision_load(model_or_config, plan, strategy, load)
    cast = _deepspeed_casts(model_or_config, plan, strategy, load)
    live = _fsdp_casts_live(model_or_config, plan, strategy)
    if cast or live:
        one_gpu = one_gpu.replace(weights="bf16")
    if live:  # the step in the compute dtype; the shards, their gradients and optimizer state held in fp32
        scale = 2.0
    key = (id(model_or_config), one_gpu, repr(one_load), str(request.device), request.gpu, request.live_layers)
    trial = _KEPT_RUNS.get(key) if _KEPT_RUNS is not None else None
    if trial is None:
        trial = dry_run_plans(model_or_config, request.batch, [one_gpu], loss_fn=request.loss_fn, lr=request.lr,
                              device=request.device, gpu=request.gpu, load=one_load,
                              live_layers=request.live_layers)[0]
        if _KEPT_RUNS is not None:
            _KEPT_RUNS[key] = trial
    if trial.status != "ok":
        return ShardedTrial(plan, "error", 0, {}, None, None, None, trial.device, error=trial.error, budget=budget,
                            estimated=True, gpus=gpus, strategy=strategy, notes=trial.notes)
    element = _compute_bytes(plan, load)
    zero = request.zero or ZeroSettings()
    unit, kept = gathered_bytes(model_on_meta(model_or_config), strategy, element, _quantized(plan, load))
    persistent = element * persistent_count(model_or_config, zero.stage3_param_persistence_threshold) if (
        strategy == "zero3" and (gpus > 1 or plan.offload == SHARDED_ONLY)) else 0
    units = max(len(shard_units(model_on_meta(model_or_config))), 1)
    series = _series(trial)
    series["params"] = [int(v * scale) for v in series["params"]]
    if live:  # the bf16 run held the trained weights' gradients and optimizer state in bf16 (8-bit state is sized)
        scaled = ("grads",) if plan.optimizer in EIGHT_BIT_OPTIMIZERS else ("grads", "optimizer")
        series.update({name: [2 * v for v in series[name]] for name in scaled})
    offloaded = plan.offload in OPTIMIZER_OFFLOADS
    n = gpus
    timeline = getattr(trial, "timeline", None)
    blocks = fsdp1_blocks_gathered(timeline.phases, timeline.x, timeline.modules, plan.adapter != "none") if (
        strategy == "fsdp1" and timeline is not None and timeline.x) else [1] * len(series["params"])
    best: dict[str, int] | None = None
    default_peak = 0  # the most the step holds beside the gathered units (FSDP1: the default stream's part)
    host = 0
    for params, grads, optimizer, activations, other, held_blocks in zip(
            *(series[k] for k in ("params", "grads", "optimizer", "activations", "other")), blocks, strict=True):
        detail = dict.fromkeys(DETAIL, 0)
        sharded_params = params if strategy == "zero2" else params // n
        moves_params = plan.offload == SHARDED_ONLY and strategy == "zero3"
        unit_grads = max(series["grads"]) // units if strategy != "zero2" else 0
        if strategy.startswith("fsdp"):
            # FSDP's one CPU offload is the parameters': shards of weights, gradients and optimizer state
            moved = offloaded
            detail["sharded_params"] = 0 if moved else sharded_params
            detail["sharded_grads"] = 0 if moved else grads // n
            detail["optimizer"] = 0 if moved else optimizer // n
            point_host = (sharded_params + grads // n + optimizer // n) if moved else 0
        else:
            detail["sharded_params" if strategy == "zero3" else "unsharded_params"] = 0 if moves_params else \
                sharded_params
            detail["persistent_params"] = persistent
            detail["sharded_grads"] = 0 if offloaded else grads // n
            detail["optimizer"] = 0 if offloaded else optimizer // n
            point_host = ((grads // n + optimizer // n) if offloaded else 0) + (sharded_params if moves_params else 0)
        # FSDP2 reshards its tail (final norm, head) after the head's backward: the tail or a block is gathered,
        # never both; FSDP1's root (embeddings, norm, head) stays gathered through backward, beside a block (two in
        # a block's backward: BACKWARD_PRE's prefetch)
        # ZeRO-2 holds every weight whole and gathers nothing; ZeRO-3 on one GPU neither (NoGatherHandle)
        gathered = (held_blocks * unit + kept) if strategy == "fsdp1" else max(unit, kept) if \
            strategy == "fsdp2" else 2 * unit if strategy == "zero3" and (n > 1 or moves_params) else 0
        detail["unsharded_params"] += gathered
        detail["unsharded_grads"] = unit_grads
        detail["activations"] = activations
        detail["inputs"] = other
        if strategy.startswith("zero"):
            trained = max(series["grads"]) // max(element, 1)
            stage = 3 if strategy == "zero3" else 2
            detail["communication"] = element * (zero.reduce_bucket(stage, trained)
                                                 + zero.gather_bucket(stage, params // max(element, 1)))
        host = max(host, point_host)
        default_peak = max(default_peak, sum(detail.values()) - gathered)
        if best is None or sum(detail.values()) > sum(best.values()):
            best = detail
    assert best is not None
    if plan.offloads_activations:  # the one-GPU run moved its saved activations off the GPU: their host copies
        host += trial.host_bytes
    held = best["sharded_params"] + best["persistent_params"] + best["sharded_grads"] + best["optimizer"] + (
        best["unsharded_params"] if strategy == "zero2" else 0)
    notes = [*trial.notes, COMPOSED_NOTE, engine_settings(plan, strategy, request.zero),
             *([MIXED_NOTE] if scale != 1 else []), *([_cast_note(model_or_config)] if cast else [])]
    if plan.offload == SHARDED_ONLY and strategy == "zero2":
        notes.append("ZeRO-2 cannot offload parameters: offload='params' offloads the gradients and the optimizer "
                     "state only; write strategy='zero3' to offload the parameters")
    result = sharded_trial(plan, best, torch.device(trial.device), budget, gpus, strategy, held, host, notes)
    reserved = None
    if trial.reserved_bytes is not None:
        # the one-GPU step's reserve over its allocated peak (the allocator's rounding and cached blocks), carried
        carried = max(trial.reserved_bytes - trial.peak_bytes, 0)
        reserved = result.peak_bytes + carried
        notes.append(ZERO_RESERVE_NOTE if strategy.startswith("zero") else RESERVE_NOTE)
        if strategy == "fsdp1":
            # the gathered root and blocks live in the unshard stream's pool, which holds two blocks (and, offloaded,
            # the shards' device copies) from the first prefetch on; the default stream reserves the most it holds
            # beside them, wherever in the step that is (not only at the allocated peak): that plus the pool
            pool = fsdp1_stream_pool(unit, kept, gpus, offloaded)
            reserved = max(reserved, default_peak + pool + carried)
            notes.append(FSDP1_STREAMS_NOTE)
        result = dataclasses.replace(result, notes=tuple(dict.fromkeys(notes)))
    return dataclasses.replace(result, reserved_bytes=reserved, composed=True)


def _series(trial: Any) -> dict[str, list[int]]:
    """The one-GPU step's bytes by category over its timeline (or its peak's breakdown when it has none)."""
    keys = ("params", "grads", "optimizer", "activations", "other")
    timeline = getattr(trial, "timeline", None)
    if timeline is None or not timeline.x:
        return {k: [int(trial.breakdown.get(k, 0))] for k in keys}
    length = len(timeline.x)
    return {k: [int(v) for v in timeline.series.get(k, [0] * length)] for k in keys}
