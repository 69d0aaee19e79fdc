"""A composed ZeRO estimate (adapters, a quantized load, the chunked loss) carries a reserve, as a composed FSDP
estimate does: its allocated peak plus the one-GPU step's reserve over its own peak, and so a card figure
(memlab.estimation.sharded.composed); and ZeRO-3 counts its reduce bucket whole, as DeepSpeed allocates it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from transformers import LlamaConfig

import memlab
from memlab.estimation.sharded import composed
from memlab.estimation.sharded.composed import RESERVE_NOTE, ZERO_RESERVE_NOTE, composed_estimate
from memlab.estimation.sharded.fsdp2 import ShardedRequest
from memlab.estimation.sharded.per_gpu import DS_PREFETCH_BUCKET, DS_REDUCE_BUCKET
from memlab.estimation.sharded.zero import zero_trial
from memlab.plan import Plan
from memlab.report import Trial

CONFIG = LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                     vocab_size=1024)
BATCH = {"input_ids": (1, 64), "labels": (1, 64)}
MIB = 2**20


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
    monkeypatch.setattr(composed, "estimate_plans", lambda *args, **kwargs: [one_gpu])
    request = ShardedRequest(CONFIG, BATCH, Plan(adapter="lora", weights="bf16"), gpus=2, strategy=strategy,
                             gpu="H100-80GB")
    zero = composed_estimate(request)
    assert zero.reserved_bytes == zero.peak_bytes + excess
    assert ZERO_RESERVE_NOTE in zero.notes and RESERVE_NOTE not in zero.notes
    # a one-GPU step without a reserve (a CPU dry run) gives none
    monkeypatch.setattr(composed, "estimate_plans",
                        lambda *args, **kwargs: [SimpleNamespace(**{**vars(one_gpu), "reserved_bytes": None})])
    assert composed_estimate(request).reserved_bytes is None


def test_a_composed_zero3_estimate_has_a_card_figure_and_zero3s_formulas_still_have_none() -> None:
    plan = Plan(adapter="lora", lora_rank=4, weights="bf16")
    trial = memlab.estimate(CONFIG, BATCH, plan, gpus=2, strategy="zero3", gpu="H100-80GB")
    assert trial.status == "ok", trial.error
    assert trial.reserved_bytes is not None and trial.reserved_bytes >= trial.peak_bytes
    assert trial.context_bytes and trial.card_bytes == trial.reserved_bytes + trial.context_bytes
    assert trial.verdict_figure == "card"
    full = memlab.estimate(CONFIG, BATCH, Plan(weights="bf16"), gpus=2, strategy="zero3", gpu="H100-80GB")
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
                                            strategy="zero3", gpu="H100-80GB"))
    assert lora.detail["communication"] >= 2 * DS_REDUCE_BUCKET
