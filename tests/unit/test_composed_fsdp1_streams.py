"""The reserve of a composed FSDP1 estimate counts FSDP1's unshard stream's pool (memlab.estimation.composed)."""

from __future__ import annotations

from transformers import LlamaConfig

from memlab.estimation.composed import (
    FSDP1_STREAMS_NOTE,
    RESERVE_NOTE,
    composed_estimate,
    fsdp1_stream_pool,
    gathered_bytes,
)
from memlab.estimation.configs import model_on_meta
from memlab.estimation.single_gpu import estimate_plans
from memlab.plan import Plan

CONFIG = LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                     vocab_size=1024)
BATCH = {"input_ids": (1, 64), "labels": (1, 64)}
MIB = 2**20


def test_the_pool_is_the_root_and_two_blocks_rounded_to_segments_and_the_offloaded_shards_copies() -> None:
    assert fsdp1_stream_pool(3 * MIB, 5 * MIB, 2) == (6 + 2 * 4) * MIB
    assert fsdp1_stream_pool(0, 0, 2) == 0
    # offloaded: the pre-unshard stream's device copies of the same units' shards, one per GPU's share
    assert fsdp1_stream_pool(4 * MIB, 8 * MIB, 4, offloaded=True) == (8 + 2 * 4 + 2 + 2 * 2) * MIB


def test_fsdp1_reserve_adds_the_unshard_streams_second_block_to_the_carried_reserve() -> None:
    plan = Plan(adapter="lora", lora_rank=4, weights="bf16")
    one_gpu = estimate_plans(CONFIG, BATCH, [plan], gpu="H100-80GB")[0]
    assert one_gpu.reserved_bytes is not None
    excess = one_gpu.reserved_bytes - one_gpu.peak_bytes
    unit, kept = gathered_bytes(model_on_meta(CONFIG), "fsdp1", 2)
    fsdp1 = composed_estimate(CONFIG, BATCH, plan, gpus=2, strategy="fsdp1", gpu="H100-80GB")
    assert fsdp1.reserved_bytes == fsdp1.peak_bytes + excess + fsdp1_stream_pool(unit, kept, 2) - unit - kept
    assert fsdp1.reserved_bytes > fsdp1.peak_bytes + excess + unit  # the second block, and the segments' rounding
    assert FSDP1_STREAMS_NOTE in fsdp1.notes and RESERVE_NOTE in fsdp1.notes
    fsdp2 = composed_estimate(CONFIG, BATCH, plan, gpus=2, strategy="fsdp2", gpu="H100-80GB")
    assert fsdp2.reserved_bytes == fsdp2.peak_bytes + excess and FSDP1_STREAMS_NOTE not in fsdp2.notes
