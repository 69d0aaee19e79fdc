"""The facts of sharded training that exports and front ends share, without torch: the strategies, how many GPUs,
and DeepSpeed's bucket sizes.

This module imports nothing heavy (only :mod:`memlab.errors`), so that :mod:`memlab.export.accelerate` and the
command line can check ``gpus=``/``strategy=`` without the dry-run machinery of
:mod:`memlab.estimation.sharded.per_gpu`.
"""

from __future__ import annotations

from typing import Any

from memlab.errors import MemlabError

__all__ = [
    "DS_ALLGATHER_BUCKET",
    "DS_PREFETCH_BUCKET",
    "DS_REDUCE_BUCKET",
    "STRATEGIES",
    "check_sharding",
    "ds_reduce_bucket",
    "engine_settings",
    "parse_gpus",
    "sharding_from_accelerate",
]

STRATEGIES = ("none", "fsdp1", "fsdp2", "zero2", "zero3")
"""How training is spread over GPUs: ``"none"`` (one GPU), FSDP1 (accelerate's ``fsdp_version: 1``), FSDP2,
DeepSpeed ZeRO stage 2 or 3."""

# DeepSpeed's defaults (deepspeed/runtime/zero/config.py), in elements.
DS_REDUCE_BUCKET = 500_000_000
"""``reduce_bucket_size``: elements of the gradient reduce bucket."""
DS_ALLGATHER_BUCKET = 500_000_000
"""``allgather_bucket_size``: elements of ZeRO-2's parameter all-gather bucket."""
DS_PREFETCH_BUCKET = 50_000_000
"""``stage3_prefetch_bucket_size``: elements of ZeRO-3's parameter prefetch bucket."""


def ds_reduce_bucket(stage: int, trained: int) -> int:
    """Elements of the gradient reduce bucket DeepSpeed holds at ZeRO ``stage`` with ``trained`` parameters: ZeRO-3
    allocates it whole however few are trained (``stage3.py``: ``torch.empty(reduce_bucket_size)`` where
    ``contiguous_gradients``, its default), ZeRO-2 is counted at most the trained parameters.

    Example:
        >>> ds_reduce_bucket(3, 1000), ds_reduce_bucket(2, 1000)
        (500000000, 1000)
    """
    return DS_REDUCE_BUCKET if stage == 3 else min(DS_REDUCE_BUCKET, trained)


def check_sharding(gpus: Any, strategy: Any) -> tuple[int, str]:
    """``(gpus, strategy)`` checked: a MemlabError saying what to write when they do not go together.

    Example:
        >>> check_sharding(8, "FSDP2")
        (8, 'fsdp2')
        >>> check_sharding(8, "none")
        Traceback (most recent call last):
        ...
        memlab.errors.MemlabError: gpus=8 needs a strategy; write strategy="fsdp2", "zero2" or "zero3"
    """
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
        raise MemlabError(f"gpus={gpus!r} is not a number of GPUs; write an int >= 1, such as gpus=8")
    name = str(strategy).lower() if isinstance(strategy, str) else strategy
    if name not in STRATEGIES:
        raise MemlabError(f"strategy={strategy!r} is unknown; write one of {', '.join(map(repr, STRATEGIES))}")
    if gpus > 1 and name == "none":
        raise MemlabError(f'gpus={gpus} needs a strategy; write strategy="fsdp2", "zero2" or "zero3"')
    return gpus, name


def engine_settings(plan: Any, strategy: str) -> str:
    """The engine settings a sharded estimate of ``plan`` assumed, as one note: the sharding, the mixed precision,
    what is offloaded, checkpointing, and the adapters (a QLoRA plan's 4-bit weights stored in bf16, which is what
    lets FSDP and ZeRO-3 shard them).

    Example:
        >>> class P:
        ...     precision, weights, offload, checkpointing, adapter, lora_rank, loss = ("bf16", "fp32", "params", 2,
        ...                                                                             "qlora", 8, "full")
        >>> print(engine_settings(P(), "fsdp1"))  # doctest: +NORMALIZE_WHITESPACE
        engine settings assumed: accelerate fsdp_version 1, FULL_SHARD, TRANSFORMER_BASED_WRAP (peft's
        fsdp_auto_wrap_policy for the adapters), use_orig_params, limit_all_gathers (two units gathered at most),
        BACKWARD_PRE prefetch; mixed precision bf16; offload_params=True (weights, gradients and optimizer state in
        CPU memory); 2 blocks checkpointed; QLoRA r8: NF4 double-quant base, bnb_4bit_quant_storage=bf16 (4-bit weights
        stored in the compute dtype, so that they shard)
    """
    parts: list[str] = []
    if strategy == "fsdp1":
        parts.append("accelerate fsdp_version 1, FULL_SHARD, TRANSFORMER_BASED_WRAP"
                     + (" (peft's fsdp_auto_wrap_policy for the adapters)" if plan.adapter != "none" else "")
                     + ", use_orig_params, limit_all_gathers (two units gathered at most), BACKWARD_PRE prefetch")
    elif strategy == "fsdp2":
        parts.append("accelerate fsdp_version 2, fully_shard per block (TRANSFORMER_BASED_WRAP), "
                     "reshard_after_forward, one unit prefetched")
    elif strategy in ("zero2", "zero3"):
        parts.append(f"DeepSpeed ZeRO stage {strategy[-1]}, reduce_bucket_size 5e8, "
                     + ("allgather_bucket_size 5e8" if strategy == "zero2" else "stage3_prefetch_bucket_size 5e7"))
    sixteen = "bf16" if "bf16" in (plan.precision, plan.weights) else plan.precision
    parts.append(f"mixed precision {sixteen}" if sixteen != "fp32" else "fp32 (no mixed precision)")
    offload = plan.offload
    if offload in ("params", "optimizer", "all") and strategy.startswith("fsdp"):
        parts.append("offload_params=True (weights, gradients and optimizer state in CPU memory)")
    elif offload == "params" and strategy == "zero3":
        parts.append("offload_param and offload_optimizer to the CPU")
    elif offload in ("params", "optimizer", "all"):
        parts.append("offload_optimizer to the CPU")
    if plan.checkpointing is True:
        parts.append("activation checkpointing on every block")
    elif plan.checkpointing:
        parts.append(f"{plan.checkpointing} blocks checkpointed")
    if plan.loss != "full":
        parts.append("chunked cross-entropy")
    if plan.adapter == "qlora":
        parts.append(f"QLoRA r{plan.lora_rank}: NF4 double-quant base, bnb_4bit_quant_storage=bf16 (4-bit weights "
                     "stored in the compute dtype, so that they shard)")
    elif plan.adapter == "lora":
        parts.append(f"LoRA r{plan.lora_rank} (peft)")
    return "engine settings assumed: " + "; ".join(parts)


def parse_gpus(value: Any) -> int | str:
    """A number of GPUs as a front end reads it: an int >= 1, or ``"auto"`` (the smallest number that fits a budget,
    which ``auto`` needs).

    Example:
        >>> parse_gpus("8"), parse_gpus(" AUTO "), parse_gpus(2)
        (8, 'auto', 2)
        >>> parse_gpus("eight")
        Traceback (most recent call last):
        ...
        memlab.errors.MemlabError: gpus='eight' is not a number of GPUs; write an int >= 1 such as 8, or auto
    """
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    try:
        number = int(value) if not isinstance(value, bool) else 0
    except (TypeError, ValueError):
        number = 0
    if number < 1 or (isinstance(value, float) and value != number):
        raise MemlabError(f"gpus={value!r} is not a number of GPUs; write an int >= 1 such as 8, or auto")
    return number


def sharding_from_accelerate(config: Any) -> dict[str, Any]:
    """The ``gpus``, ``strategy`` and ``offload`` of a user's accelerate config (the dict of the YAML file
    ``accelerate launch --config_file`` reads, or the path of that file), for ``memlab.estimate(...,
    gpus=..., strategy=...)`` and ``Plan(offload=...)``: ``distributed_type: FSDP`` with ``fsdp_version`` 1 (or none:
    accelerate's default) or 2, ``DEEPSPEED`` with ``zero_stage`` 2 or 3; FSDP's ``fsdp_offload_params`` and
    DeepSpeed's ``offload_param_device`` are ``offload="params"``, ``offload_optimizer_device`` alone
    ``"optimizer"``. What it cannot map is a MemlabError saying what to write.

    Example:
        >>> sharding_from_accelerate({"distributed_type": "FSDP", "num_processes": 8,
        ...                           "fsdp_config": {"fsdp_sharding_strategy": "FULL_SHARD",
        ...                                           "fsdp_offload_params": True}})
        {'gpus': 8, 'strategy': 'fsdp1', 'offload': 'params'}
        >>> sharding_from_accelerate({"distributed_type": "DEEPSPEED", "num_processes": 2,
        ...                           "deepspeed_config": {"zero_stage": 3, "offload_optimizer_device": "cpu"}})
        {'gpus': 2, 'strategy': 'zero3', 'offload': 'optimizer'}
    """
    if isinstance(config, (str, bytes)) or hasattr(config, "__fspath__"):
        import yaml

        with open(config, encoding="utf-8") as file:  # noqa: PTH123 - a path as accelerate takes it
            config = yaml.safe_load(file)
    if not isinstance(config, dict):
        raise MemlabError("the accelerate config is not a mapping; pass the dict of its YAML file or the file's path")
    gpus = int(config.get("num_processes") or 1) * int(config.get("num_machines") or 1)
    kind = str(config.get("distributed_type", "NO")).upper()
    if kind == "FSDP":
        section = config.get("fsdp_config") or {}
        version = int(section.get("fsdp_version", 1))
        sharding = str(section.get("fsdp_sharding_strategy", "FULL_SHARD")).upper()
        if version == 1 and sharding not in ("FULL_SHARD", "1"):
            raise MemlabError(f"fsdp_sharding_strategy {sharding} is not estimated; memlab estimates FULL_SHARD: "
                              "write fsdp_sharding_strategy: FULL_SHARD (or estimate with strategy='zero2' for "
                              "SHARD_GRAD_OP, which shards gradients and optimizer state only)")
        offload = "params" if section.get("fsdp_offload_params") else "none"
        return {"gpus": gpus, "strategy": "fsdp2" if version == 2 else "fsdp1", "offload": offload}
    if kind == "DEEPSPEED":
        section = config.get("deepspeed_config") or {}
        stage = int(section.get("zero_stage", 0))
        if stage not in (2, 3):
            raise MemlabError(f"zero_stage {stage} is not estimated; write zero_stage: 2 or 3")
        offload = ("params" if str(section.get("offload_param_device", "none")).lower() == "cpu" and stage == 3
                   else "optimizer" if str(section.get("offload_optimizer_device", "none")).lower() == "cpu"
                   else "none")
        return {"gpus": gpus, "strategy": f"zero{stage}", "offload": offload}
    raise MemlabError(f"distributed_type {kind} does not shard; memlab estimates FSDP and DEEPSPEED configs (write "
                      "distributed_type: FSDP or DEEPSPEED), or one GPU with gpus=1")
