"""DeepSpeed ZeRO-2 / ZeRO-3 per GPU: computed, since they cannot run without DeepSpeed's engine.

The activations (and the batch) come from the FSDP2 dry run of the same plan and per-GPU batch
(:func:`memlab.estimation.sharded.fsdp2.fsdp2_dry_run`: its largest activations, over every module-level snapshot: data
parallelism does not change them); the model states follow DeepSpeed's own formulas
(``deepspeed/runtime/zero/stage_1_and_2.py``: ``estimate_zero2_model_states_mem_needs`` and ``stage3.py``:
``estimate_zero3_model_states_mem_needs``, DeepSpeed 0.19), written per dtype so that they hold for any plan. With
``w`` bytes per 16-bit (or fp32) weight, ``K`` bytes of optimizer state per trainable parameter (8 for AdamW; from the
dry run for the others), ``P`` parameters, ``L`` the largest layer's own parameters and ``N`` GPUs:

- ZeRO-2: ``w*P`` (the weights, whole) + ``(w + 4 + 4 + K) * P / N`` (partitions of the 16-bit gradients, their
  fp32 copy, the fp32 master weights and the optimizer state). DeepSpeed's formula, for bf16/fp16 and AdamW:
  ``2*P + 18*P/N``. With the optimizer offloaded (ZeRO-Offload): ``w*P`` on the GPU (DeepSpeed: ``2*P``).
- ZeRO-3: ``2*w*L`` (one layer's gathered weights and gradients) + ``(w + 4 + 4 + K) * P / N`` (partitions of the
  16-bit weights, the fp32 gradients, the fp32 master weights and the optimizer state); DeepSpeed:
  ``4*L + 18*P/N``. Optimizer offloaded: ``2*w*L + w*P/N``; parameters too (``offload="all"``): ``2*w*L``. On one
  GPU, ``w*L + (w + 4 + 4 + K) * P``: DeepSpeed gathers nothing there (``NoGatherHandle``: each parameter is a view
  of its partition), though each layer's 16-bit gradients are still whole before they are reduced. The gathered
  layer's bytes are shown as unsharded (``unsharded_params``, ``unsharded_grads``), as FSDP's gathered unit is, and
  the partitions as sharded: a tied weight is partitioned once and gathered once, under ZeRO-3 as under FSDP2, so
  the two show the same sharded parameters where they hold the same bytes (:func:`zero3_gathered`).
- Communication buffers, which DeepSpeed's formulas leave out: the gradient reduce bucket
  (``reduce_bucket_size``, 5e8 elements by default) and, for ZeRO-2, the parameter all-gather bucket
  (``allgather_bucket_size``, 5e8) or, for ZeRO-3, the prefetch bucket (``stage3_prefetch_bucket_size``, 5e7),
  in the weights' dtype; each at most the model's size but ZeRO-3's reduce bucket, which ZeRO-3 allocates whole
  however few parameters are trained (``stage3.py``, ``_setup_for_real_optimizer``: ``torch.empty(
  reduce_bucket_size)`` when ``contiguous_gradients``, its default; DeepSpeed 0.13 to 0.19).
- ZeRO-3's persistent parameters: those of at most ``stage3_param_persistence_threshold`` elements (1e5 by default)
  stay gathered on every rank from their first use on (``partitioned_param_coordinator.py`` never releases a
  ``ds_persist`` parameter; ``stage3.py``'s ``_post_step`` gathers them again after each step), beside their
  partition, which stays in the flat partitions as every parameter's does; their gradients and optimizer state are
  partitioned as the others' are. ``w`` bytes per such element are added on every rank (none on one GPU, where the
  gathered parameter is a view of its partition), shown as ``persistent_params``.
  The gathered layer is counted at its whole size even where some of its parameters persist (it leans high).

The sizes and the threshold are the trainer's DeepSpeed config's where the estimate is of a trainer (its numbers, its
``"auto"`` as transformers fills them), else DeepSpeed's defaults (:class:`memlab.live.sharding.ZeroSettings`).

The per-GPU peak is the model states + buffers + the largest activations and the batch: it leans high, as it adds
the largest of each. The ``host_bytes`` of offload are each rank's share of what DeepSpeed keeps in CPU
memory (without its pinned-buffer factor).

No ZeRO step is traced, so the allocator's reserve of a ZeRO estimate from these formulas is not known
(``reserved_bytes`` None): its card figure is unknown and budget verdicts judge its allocated peak, and say so.
(Borrowing the FSDP2 run's reserve was tried: a 2-GPU FSDP2 run's fragmentation is not a ZeRO step's, and it made a
7B ZeRO-3 plan look 17 GiB over.) A composed ZeRO estimate (adapters, a quantized load, the chunked loss:
:mod:`memlab.estimation.sharded.composed`) carries the reserve of its own one-GPU step over that step's peak.
"""

from __future__ import annotations

import dataclasses

import torch

from memlab.errors import MemlabError
from memlab.estimation.configs import model_on_meta
from memlab.estimation.dryrun.reserved import EXPANDABLE_NOTE, RESERVED_NOTE
from memlab.estimation.dryrun.single_gpu import adamw8bit_state_bytes, estimate_plans
from memlab.estimation.sharded.fsdp2 import (
    DETAIL,
    FSDP_NOTE,
    ONE_STREAM_NOTE,
    ShardedRequest,
    ShardedTrial,
    fsdp2_dry_run,
    sharded_trial,
)
from memlab.live.sharding import ZeroSettings
from memlab.plan import Plan
from memlab.report import Trial
from memlab.techniques.offload import NO_OFFLOAD, OPTIMIZER_OFFLOADS, WEIGHT_OFFLOADS

__all__ = ["BASIS_GPUS", "zero3_gathered", "zero_basis", "zero_model_states", "zero_trial"]


def zero_model_states(
    parameters: int,
    largest_layer: int,
    gpus: int,
    stage: int,
    *,
    weight_bytes: int = 2,
    optimizer_bytes: float = 8,
    offload: str = NO_OFFLOAD,
    frozen: int = 0,
    persistent: int = 0,
) -> dict[str, int]:
    """Bytes per GPU of DeepSpeed ZeRO's model states: ``{"params", "grads", "optimizer", "host"}``.

    ``parameters`` are the trained ones; ``frozen`` parameters (a LoRA run's base) hold weights only, whole on
    every GPU under ZeRO-2 and partitioned under ZeRO-3, with no gradients, master copy or optimizer state.
    ``persistent``: elements of the parameters (trained or frozen) ZeRO-3 keeps whole on every rank beside their
    partition (:func:`memlab.estimation.configs.persistent_count`); ZeRO-2 does not read it.

    The formulas are DeepSpeed's (module docstring), per dtype: ``weight_bytes`` per 16-bit weight (4 for fp32
    training), ``optimizer_bytes`` of optimizer state per parameter (AdamW: 8), ``offload`` as in the Plan
    (``"optimizer"``: ZeRO-Offload; ``"all"``: ZeRO-3 offloads the parameters too). ``"host"`` is this rank's
    share of the CPU memory offload takes.

    Example:
        >>> states = zero_model_states(10**9, 10**7, 8, 2)  # DeepSpeed: 2*P + 18*P/N
        >>> sum(v for k, v in states.items() if k != "host") == 2 * 10**9 + 18 * 10**9 // 8
        True
        >>> states = zero_model_states(10**9, 10**7, 8, 3)  # DeepSpeed: 4*L + 18*P/N
        >>> sum(v for k, v in states.items() if k != "host") == 4 * 10**7 + 18 * 10**9 // 8
        True
        >>> zero_model_states(10**6, 10**4, 8, 3, frozen=10**9)["params"] == 2 * (10**9 + 10**6) // 8 + 2 * 10**4
        True
        >>> kept = zero_model_states(10**9, 10**7, 8, 3, persistent=10**5)  # whole on each rank, beside the partition
        >>> kept["params"] - zero_model_states(10**9, 10**7, 8, 3)["params"]
        200000
    """
    if stage not in (2, 3):
        raise MemlabError(f"ZeRO stage {stage} is not estimated; write stage=2 or stage=3")
    w, p, n, big = weight_bytes, parameters, gpus, largest_layer
    partition = int(w * (p + frozen) / n)
    # whole weights; or a partition and one gathered layer (none on one GPU, where DeepSpeed's NoGatherHandle makes
    # each parameter a view of its partition, unless the partitions live in CPU memory)
    held = zero3_gathered(big, n, weight_bytes=w, offload=offload, persistent=persistent)
    gathered, kept = held["params"], held["persistent"] if stage == 3 else 0
    params = w * (p + frozen) if stage == 2 else partition + gathered + kept
    # ZeRO-2: the 16-bit gradient partition and its fp32 copy; ZeRO-3: the fp32 partition and one gathered layer's.
    grads = int((w + 4) * p / n) if stage == 2 else int(4 * p / n) + w * big
    optimizer = int((4 + optimizer_bytes) * p / n)  # fp32 master weights and the optimizer state
    host = 0
    if offload in OPTIMIZER_OFFLOADS:  # ZeRO-Offload: gradients, master weights and state on the CPU
        host = int((4 + 4 + optimizer_bytes) * p / n)
        grads = w * big if stage == 3 else 0
        optimizer = 0
    if offload in WEIGHT_OFFLOADS and stage == 3:  # ZeRO-Infinity's parameter offload
        host += partition
        params = w * big + kept
    return {"params": params, "grads": grads, "optimizer": optimizer, "host": host}


def zero3_gathered(largest_layer: int, gpus: int, *, weight_bytes: int = 2,
                   offload: str = NO_OFFLOAD, persistent: int = 0) -> dict[str, int]:
    """Bytes of what ZeRO-3 holds gathered inside :func:`zero_model_states`'s ``"params"`` and ``"grads"``: the
    one gathered layer's whole weights (``"params"``) and its whole 16-bit gradients before they are reduced into
    the partitions (``"grads"``), and the ``persistent`` elements' weights, gathered for good (``"persistent"``).
    The layer is what FSDP calls unsharded, and a ZeRO-3 estimate shows it as such, beside the partitions (shown as
    sharded, as FSDP's shards are) and the persistent parameters (``persistent_params``): a tied weight (GPT-2's
    embedding, which is also its head and its largest layer) is partitioned once, and gathered once while a layer
    that uses it runs. On one GPU DeepSpeed gathers nothing (its ``NoGatherHandle`` views each partition), unless the
    partitions are offloaded.

    Example:
        >>> zero3_gathered(10**7, 8, persistent=10**5)
        {'params': 20000000, 'grads': 20000000, 'persistent': 200000}
        >>> zero3_gathered(10**7, 1, persistent=10**5)
        {'params': 0, 'grads': 20000000, 'persistent': 0}
    """
    w = weight_bytes
    gathering = gpus > 1 or offload in WEIGHT_OFFLOADS
    return {"params": w * largest_layer if gathering else 0, "grads": w * largest_layer,
            "persistent": w * persistent if gathering else 0}


BASIS_GPUS = 2
"""The number of GPUs of the FSDP2 dry run that :func:`zero_basis` makes (FSDP's memory tracker books a few kilobytes
more or less of activations at other numbers)."""


def zero_basis(request: ShardedRequest, run: tuple[ShardedTrial, list[dict[str, int]]] | None = None) -> Trial:
    """What ZeRO shares with any data-parallel step: the largest activations of the per-GPU forward and backward
    (and the batch), taken from an FSDP2 dry run of the same plan (same per-GPU batch, weights gathered in the
    compute dtype, as DeepSpeed's bf16/fp16 run them), and the optimizer's state per parameter (AdamW: 8 bytes and a
    4-byte step per tensor; 8-bit AdamW: bitsandbytes' size; others: from the one-GPU dry run). Returned as a Trial
    whose breakdown holds those three numbers. ``run``: an FSDP2 dry run of that same plan already made (at any
    number of GPUs: data parallelism does not change the activations), used instead of a new one. The request's
    ``gpu``: the GPU kind whose kernels a CUDA dry run made without CUDA emulates (its GPUs, strategy and budget are
    not read).

    Example:
        >>> from torch import nn
        >>> model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1))
        >>> basis = zero_basis(ShardedRequest(model, torch.randn(4, 8), Plan(), 2, loss_fn=lambda m, b: m(b).mean()))
        >>> parameters = sum(p.numel() for p in model.parameters())
        >>> basis.breakdown["optimizer"] == 8 * parameters + 4 * 6, basis.breakdown["activations"] > 0
        (True, True)
    """
    model_or_config, plan = request.model, request.plan
    one = request.replace(plan=plan.replace(offload=NO_OFFLOAD, optimizer="adamw"), gpus=BASIS_GPUS, budget=None)
    trial, peaks = run if run is not None else fsdp2_dry_run(one)
    if trial.status != "ok":
        raise MemlabError(f"the dry run the ZeRO estimate starts from failed: {trial.error}")
    activations = max((d["activations"] for d in peaks), default=0)
    inputs = max((d["inputs"] for d in peaks), default=0)
    model = model_on_meta(model_or_config)
    trained = [p for p in {id(p): p for p in model.parameters()}.values() if p.requires_grad]
    if plan.optimizer == "adamw":
        state = sum(8 * p.numel() + 4 for p in trained)
    elif plan.optimizer in ("adamw8bit", "paged_adamw8bit"):
        state = adamw8bit_state_bytes(trained)
    else:
        single = estimate_plans(model_or_config, request.batch, [plan.replace(offload=NO_OFFLOAD)],
                                loss_fn=request.loss_fn, lr=request.lr, device=request.device, gpu=request.gpu)[0]
        if single.status != "ok":
            raise MemlabError(f"the one-GPU dry run the ZeRO estimate starts from failed: {single.error}")
        state = single.breakdown["optimizer"]
    breakdown = {"optimizer": state, "activations": activations, "other": inputs}
    return dataclasses.replace(trial, breakdown=breakdown, peak_bytes=sum(breakdown.values()),
                               notes=tuple(n for n in trial.notes if n not in (FSDP_NOTE, RESERVED_NOTE,
                                                                                ONE_STREAM_NOTE, EXPANDABLE_NOTE)),
                               reserved_bytes=None)


def zero_trial(basis: Trial, counts: tuple[int, int], plan: Plan, gpus: int, stage: int,
               budget: int | None, *, frozen: int = 0, persistent: int = 0,
               zero: ZeroSettings | None = None) -> ShardedTrial:
    """The ZeRO-``stage`` estimate of one GPU of ``gpus``: :func:`zero_model_states` for ``counts`` (see
    :func:`memlab.estimation.configs.layer_counts`), ``frozen`` parameters (see
    :func:`memlab.estimation.configs.frozen_count`) and ``persistent`` elements kept whole (ZeRO-3), the
    communication buckets of ``zero`` (a trainer's DeepSpeed config read; None: DeepSpeed's defaults), and the
    activations and batch of ``basis`` (:func:`zero_basis`).

    Example:
        >>> basis = Trial(Plan(), "ok", 860, {"optimizer": 800, "activations": 50, "other": 10}, None, None, None,
        ...               "cuda")
        >>> trial = zero_trial(basis, (100, 40), Plan(precision="bf16"), 4, 3, None)
        >>> trial.model_state_bytes == 2 * 100 // 4 + 2 * 40 + 4 * 100 // 4 + 2 * 40 + (4 + 8) * 100 // 4, trial.label
        (True, 'bf16 zero3 x4')
        >>> small = zero_trial(basis, (100, 40), Plan(precision="bf16"), 4, 3, None,
        ...                    zero=ZeroSettings(reduce_bucket_size=1000))
        >>> trial.detail["communication"] - small.detail["communication"] == 2 * (5 * 10**8 - 1000)
        True
    """
    parameters, largest = counts
    zero = zero if zero is not None else ZeroSettings()
    w = 2 if plan.precision != "fp32" or plan.weights == "bf16" else 4
    k = basis.breakdown["optimizer"] / max(parameters, 1)
    states = zero_model_states(parameters, largest, gpus, stage, weight_bytes=w, optimizer_bytes=k,
                               offload=plan.offload, frozen=frozen, persistent=persistent)
    buckets = zero.reduce_bucket(stage, parameters) + zero.gather_bucket(stage, parameters + frozen)
    detail = dict.fromkeys(DETAIL, 0)
    # ZeRO-3's gathered layer is unsharded, as FSDP's gathered unit: the partitions alone are sharded
    gathered = zero3_gathered(largest, gpus, weight_bytes=w, offload=plan.offload,
                              persistent=persistent) if stage == 3 else {}
    detail["unsharded_params"] = gathered.get("params", 0)
    detail["persistent_params"] = gathered.get("persistent", 0)
    detail["sharded_params" if stage == 3 else "unsharded_params"] = (
        states["params"] - gathered.get("params", 0) - gathered.get("persistent", 0))
    detail["unsharded_grads"] = gathered.get("grads", 0)
    detail["sharded_grads"] = states["grads"] - gathered.get("grads", 0)
    detail["optimizer"] = states["optimizer"]
    detail["activations"] = basis.breakdown["activations"]
    detail["inputs"] = basis.breakdown["other"]
    detail["communication"] = w * buckets
    notes = [
        *(n for n in basis.notes if not n.startswith("fp16 on CPU")),
        f"ZeRO-{stage} model states from DeepSpeed's formulas (memlab.estimation.sharded.zero); "
        "activations from the FSDP2 dry run",
    ]
    if plan.offload in WEIGHT_OFFLOADS and stage == 2:
        notes.append(f"ZeRO-2 cannot offload parameters: offload={plan.offload!r} offloads the optimizer only")
    if plan.weights == "bf16":
        notes.append("DeepSpeed keeps fp32 master weights even for bf16 weights: counted")
    if detail["persistent_params"]:
        notes.append(f"{persistent:,} elements in parameters of at most stage3_param_persistence_threshold "
                     f"{zero.stage3_param_persistence_threshold:,} elements each kept whole on every rank, beside "
                     "their partition (persistent_params)")
    held = states["params"] + states["grads"] + states["optimizer"]
    return sharded_trial(plan, detail, torch.device(basis.device), budget, gpus, f"zero{stage}", held, states["host"],
                         notes)
