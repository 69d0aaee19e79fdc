"""Composed sharded estimates (memlab.estimation.sharded.composed): FSDP1's streams and ZeRO's reserve.

A composed FSDP1 estimate: two blocks gathered in a block's backward (BACKWARD_PRE), and its reserve counts FSDP1's
unshard stream's pool beside the default stream's own peak (memlab.estimation.sharded.composed).

A composed ZeRO estimate (adapters, a quantized load, the chunked loss) carries a reserve, as a composed FSDP
estimate does: its allocated peak plus the one-GPU step's reserve over its own peak, and so a card figure
(memlab.estimation.sharded.composed); and ZeRO-3 counts its reduce bucket whole, as DeepSpeed allocates it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from transformers import LlamaConfig

import memlab
from memlab.estimation.configs import model_on_meta
from memlab.estimation.cuda.gpus import GPUS
from memlab.estimation.dryrun.single_gpu import dry_run_plans
from memlab.estimation.sharded import composed
from memlab.estimation.sharded.composed import (
    FSDP1_STREAMS_NOTE,
    RESERVE_NOTE,
    ZERO_RESERVE_NOTE,
    composed_estimate,
    fsdp1_blocks_gathered,
    fsdp1_stream_pool,
    gathered_bytes,
)
from memlab.estimation.sharded.fsdp2 import ShardedRequest
from memlab.estimation.sharded.per_gpu import DS_PREFETCH_BUCKET, DS_REDUCE_BUCKET
from memlab.estimation.sharded.zero import zero_trial
from memlab.plan import Plan
from memlab.report import Trial

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
    one_gpu = dry_run_plans(CONFIG, BATCH, [plan], gpu=GPUS["H100-80GB"])[0]  # the composed route's basis
    assert one_gpu.reserved_bytes is not None
    excess = one_gpu.reserved_bytes - one_gpu.peak_bytes
    unit, kept = gathered_bytes(model_on_meta(CONFIG), "fsdp1", 2)
    fsdp1 = composed_estimate(ShardedRequest(CONFIG, BATCH, plan, gpus=2, strategy="fsdp1", gpu=GPUS["H100-80GB"]))
    # the allocated peak counts the root and one or two blocks (BACKWARD_PRE); the pool holds two rounded to the
    # allocator's 2 MiB segments, beside the default stream's own peak, which is at least its part of the allocated
    # peak and at most the allocated peak less the root and one block
    gathered = fsdp1.detail["unsharded_params"]
    assert gathered in (unit + kept, 2 * unit + kept)
    pool = fsdp1_stream_pool(unit, kept, 2)
    assert fsdp1.peak_bytes + excess + pool - gathered <= fsdp1.reserved_bytes
    assert fsdp1.reserved_bytes <= fsdp1.peak_bytes + excess + pool - unit - kept
    assert fsdp1.reserved_bytes > fsdp1.peak_bytes + excess  # the segments' rounding
    assert FSDP1_STREAMS_NOTE in fsdp1.notes and RESERVE_NOTE in fsdp1.notes
    fsdp2 = composed_estimate(ShardedRequest(CONFIG, BATCH, plan, gpus=2, strategy="fsdp2", gpu=GPUS["H100-80GB"]))
    assert fsdp2.reserved_bytes == fsdp2.peak_bytes + excess and FSDP1_STREAMS_NOTE not in fsdp2.notes


def test_fsdp1_holds_two_blocks_through_a_blocks_backward_or_only_as_it_ends_with_nested_adapter_units() -> None:
    # BACKWARD_PRE: a block's unit all-gathers the block below before its own backward computes; with the adapters'
    # layers as units inside the blocks, the block's first adapter layer does, as the block's backward ends. The
    # root's backward (head, loss) holds one block; the last block's backward (block 0) prefetches none
    phases = [("forward", 0, 2), ("backward", 2, 7), ("forward", 7, 8), ("backward", 8, 10), ("optimizer", 10, 11)]
    running = ["", "model.layers.0", "lm_head", "lm_head", "model.layers.1.mlp", "", "model.layers.1.self_attn",
               "model.layers.0.mlp", "", "model.layers.1", "model.layers.0", ""]
    assert fsdp1_blocks_gathered(phases, range(12), running) == [1, 1, 1, 1, 2, 2, 2, 1, 1, 2, 1, 1]
    assert fsdp1_blocks_gathered(phases, range(12), running, nested=True) == [1, 1, 1, 1, 1, 1, 2, 1, 1, 2, 1, 1]


def test_fsdp1s_allocated_peak_counts_the_prefetched_block_in_backward_and_fsdp2s_does_not() -> None:
    plan = Plan(loss="chunked", weights="bf16")  # the blocks are FSDP1's only units below the root
    unit, kept = gathered_bytes(model_on_meta(CONFIG), "fsdp1", 2)
    fsdp1 = composed_estimate(ShardedRequest(CONFIG, BATCH, plan, gpus=2, strategy="fsdp1", gpu=GPUS["H100-80GB"]))
    one_gpu = dry_run_plans(CONFIG, BATCH, [plan], gpu=GPUS["H100-80GB"])[0]
    assert one_gpu.timeline is not None and one_gpu.timeline.peak.phase == "backward"
    assert fsdp1.detail["unsharded_params"] == 2 * unit + kept
    fsdp2_unit, tail = gathered_bytes(model_on_meta(CONFIG), "fsdp2", 2)
    fsdp2 = composed_estimate(ShardedRequest(CONFIG, BATCH, plan, gpus=2, strategy="fsdp2", gpu=GPUS["H100-80GB"]))
    assert fsdp2.detail["unsharded_params"] == max(fsdp2_unit, tail)


def test_fsdp1s_reserve_is_the_default_streams_own_peak_beside_the_unshard_streams_pool(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # a one-GPU step whose activations peak in the head's backward (one block gathered beside the root) and fall by
    # half a block in the next block's backward, where FSDP1 holds two: the allocated peak is there, the default
    # stream's own peak (everything but the gathered units) at the head
    unit, kept = gathered_bytes(model_on_meta(CONFIG), "fsdp1", 2)
    weights, high = 8 * MIB, 64 * MIB
    timeline = SimpleNamespace(
        x=[0, 1, 2, 3, 4], phases=[("forward", 0, 1), ("backward", 1, 4)],
        modules=["", "model.layers.0", "lm_head", "model.layers.1", "model.layers.0"],
        series={"params": [weights] * 5, "grads": [0] * 5, "optimizer": [0] * 5,
                "activations": [0, high // 2, high, high - unit // 2, high // 4], "other": [0] * 5})
    one_gpu = SimpleNamespace(status="ok", notes=(), device="cuda", timeline=timeline, peak_bytes=weights + high,
                              reserved_bytes=weights + high)
    monkeypatch.setattr(composed, "dry_run_plans", lambda *args, **kwargs: [one_gpu])
    fsdp1 = composed_estimate(ShardedRequest(CONFIG, BATCH, Plan(weights="bf16"), gpus=2, strategy="fsdp1",
                                             gpu=GPUS["H100-80GB"]))
    assert fsdp1.peak_bytes == weights // 2 + high - unit // 2 + 2 * unit + kept
    assert fsdp1.reserved_bytes == weights // 2 + high + fsdp1_stream_pool(unit, kept, 2)


@pytest.mark.parametrize("strategy", ("zero2", "zero3"))
def test_a_composed_zero_estimate_carries_the_one_gpu_steps_reserve_over_its_peak(
        strategy: str, monkeypatch: pytest.MonkeyPatch) -> None:
    weights, high, excess = 8 * MIB, 64 * MIB, 24 * MIB
    timeline = SimpleNamespace(
        x=[0, 1, 2], phases=[("forward", 0, 1), ("backward", 1, 2)], modules=["", "model.layers.0", "lm_head"],
        series={"params": [weights] * 3, "grads": [0] * 3, "optimizer": [0] * 3,
                "activations": [0, high, high // 2], "other": [0] * 3})
    one_gpu = SimpleNamespace(status="ok", notes=(), device="cuda", timeline=timeline, peak_bytes=weights + high,
                              reserved_bytes=weights + high + excess)
    monkeypatch.setattr(composed, "dry_run_plans", lambda *args, **kwargs: [one_gpu])
    request = ShardedRequest(CONFIG, BATCH, Plan(adapter="lora", weights="bf16"), gpus=2, strategy=strategy,
                             gpu=GPUS["H100-80GB"])
    zero = composed_estimate(request)
    assert zero.reserved_bytes == zero.peak_bytes + excess
    assert ZERO_RESERVE_NOTE in zero.notes and RESERVE_NOTE not in zero.notes
    # a one-GPU step without a reserve (a CPU dry run) gives none
    monkeypatch.setattr(composed, "dry_run_plans",
                        lambda *args, **kwargs: [SimpleNamespace(**{**vars(one_gpu), "reserved_bytes": None})])
    assert composed_estimate(request).reserved_bytes is None


def test_a_composed_zero3_estimate_has_a_card_figure_and_zero3s_formulas_still_have_none() -> None:
    plan = Plan(adapter="lora", lora_rank=4, weights="bf16")
    trial = memlab.estimate(CONFIG, BATCH, plan, gpus=2, strategy="zero3", gpu=GPUS["H100-80GB"])
    assert trial.status == "ok", trial.error
    assert trial.reserved_bytes is not None and trial.reserved_bytes >= trial.peak_bytes
    assert trial.context_bytes and trial.card_bytes == trial.reserved_bytes + trial.context_bytes
    assert trial.verdict_figure == "card"
    full = memlab.estimate(CONFIG, BATCH, Plan(weights="bf16"), gpus=2, strategy="zero3", gpu=GPUS["H100-80GB"])
    assert full.status == "ok" and full.reserved_bytes is None and full.card_bytes is None


def test_zero3_counts_its_reduce_bucket_whole_however_few_the_trained_parameters() -> None:
    # stage3.py (_setup_for_real_optimizer) allocates reduce_bucket_size elements in the weights' dtype when
    # contiguous_gradients is on (its default), whatever the trained parameters' count; ZeRO-2 allocates it in
    # backward, at most the trained parameters' count as memlab counts it
    basis = Trial(Plan(), "ok", 860, {"optimizer": 800, "activations": 50, "other": 10}, None, None, None, "cuda")
    zero3 = zero_trial(basis, (100, 40), Plan(precision="bf16"), 4, 3, None, frozen=10**6)
    assert zero3.detail["communication"] == 2 * (DS_REDUCE_BUCKET + min(DS_PREFETCH_BUCKET, 100 + 10**6))
    zero2 = zero_trial(basis, (100, 40), Plan(precision="bf16"), 4, 2, None)
    assert zero2.detail["communication"] < 2 * DS_REDUCE_BUCKET
    lora = composed_estimate(ShardedRequest(CONFIG, BATCH, Plan(adapter="lora", lora_rank=4, weights="bf16"), gpus=2,
                                            strategy="zero3", gpu=GPUS["H100-80GB"]))
    assert lora.detail["communication"] >= 2 * DS_REDUCE_BUCKET


def test_deepspeeds_bf16_mode_counts_fp32_loaded_weights_in_bf16_as_it_casts_them() -> None:
    # Issue 85: a trainer whose model was loaded in fp32 (PEFT's Llama 2 70B LoRA ZeRO-3 script loads with no dtype)
    # under bf16: DeepSpeed's bf16 mode casts the whole module, frozen base included. The composed estimate counted the
    # base in fp32 (1.81 of the published per-GPU figure for that run, asked as its trainer; 0.88 now).
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=2,
                         vocab_size=256)
    batch = {"input_ids": (2, 32), "labels": (2, 32)}
    plan = Plan(adapter="lora", lora_rank=4, precision="bf16", checkpointing=True)

    def sharded(strategy: str, dtype: torch.dtype) -> memlab.Trial:
        return memlab.estimate(config, batch, plan, gpus=2, strategy=strategy, device="cpu", load={"dtype": dtype})

    fp32, bf16 = sharded("zero3", torch.float32), sharded("zero3", torch.bfloat16)
    assert fp32.status == bf16.status == "ok", (fp32.error, bf16.error)
    assert composed.DEEPSPEED_CAST_NOTE in fp32.notes and composed.DEEPSPEED_CAST_NOTE not in bf16.notes
    base = sum(p.numel() for p in model_on_meta(config).parameters())
    # each GPU's partition of the base in bf16 (2 bytes a parameter, over 2 GPUs) and of the adapters, cast too
    assert base <= fp32.detail["sharded_params"] < 1.1 * base <= 2 * base
    assert fp32.detail["sharded_params"] <= bf16.detail["sharded_params"]  # a bf16 load leaves peft's adapters fp32
    assert abs(fp32.peak_bytes / bf16.peak_bytes - 1) < 0.05
    fsdp = sharded("fsdp2", torch.float32)  # FSDP keeps fp32 shards and gathers in bf16: its own rule, unchanged
    assert fsdp.status == "ok" and composed.DEEPSPEED_CAST_NOTE not in fsdp.notes and composed.MIXED_NOTE in fsdp.notes


def test_the_cast_note_says_which_weights_deepspeed_casts() -> None:
    # A 16-bit base with peft's fp32 adapters: DeepSpeed's bf16 mode casts the adapters only, and the note says so.
    model = torch.nn.Sequential(torch.nn.Linear(4, 4).to(torch.bfloat16), torch.nn.Linear(4, 4))
    model[0].requires_grad_(False)
    assert composed._cast_note(model) == composed.DEEPSPEED_ADAPTER_CAST_NOTE
    model[0].float()  # the frozen base loaded in fp32 too
    assert composed._cast_note(model) == composed.DEEPSPEED_CAST_NOTE
