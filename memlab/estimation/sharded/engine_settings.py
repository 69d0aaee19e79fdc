"""The engine settings a sharded estimate assumed, said as one note beside its figures: the sharding, the mixed
precision, what is offloaded (asked of the offload lever), checkpointing and the adapters.
"""

from __future__ import annotations

from typing import Any

from memlab.live.sharding import ZeroSettings
from memlab.techniques.offload import engine_offload

__all__ = ["engine_settings"]


def engine_settings(plan: Any, strategy: str, zero: ZeroSettings | None = None) -> str:
    """The engine settings a sharded estimate of ``plan`` assumed, as one note: the sharding (under ZeRO, the bucket
    sizes and persistence threshold of ``zero``, each with where it came from; None: DeepSpeed's defaults), the mixed
    precision, what is offloaded, checkpointing, and the adapters (a QLoRA plan's 4-bit weights stored in bf16, which
    is what lets FSDP and ZeRO-3 shard them).

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
        stage = int(strategy[-1])
        parts.append(f"DeepSpeed ZeRO stage {stage}, {(zero or ZeroSettings()).describe(stage)}")
    sixteen = "bf16" if "bf16" in (plan.precision, plan.weights) else plan.precision
    parts.append(f"mixed precision {sixteen}" if sixteen != "fp32" else "fp32 (no mixed precision)")
    parts += [offload] if (offload := engine_offload(plan.offload, strategy)) else []
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
