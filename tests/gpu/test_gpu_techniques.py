"""Issue 3 on CUDA: the probe against a hand-made reference, fp16 with GradScaler, 8-bit Adam and offload.

Skipped without CUDA. Models are tiny-but-not-trivial Llamas built from config.
"""

from __future__ import annotations

import pytest
import torch
from models import lm_batch, tiny_llama

import memlab
from memlab.techniques.precision import ScaledStep

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def cuda_model(width: int = 256, layers: int = 4):
    return tiny_llama(layers=layers, width=width).cuda()


def cuda_batch(rows: int = 8, length: int = 128):
    return {k: v.cuda() for k, v in lm_batch(rows=rows, length=length).items()}


def hand_made_peak(model, batch) -> int:
    """Peak of a plain AdamW step measured by hand, with the optimizer state already there (fused AdamW, as the
    Trainer builds it by default and memlab's "adamw" is)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
    model.train()
    for _ in range(2):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        model(**batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    del optimizer
    torch.cuda.empty_cache()
    return peak


def test_cuda_peak_matches_a_hand_made_reference_within_2_percent():
    model, batch = cuda_model(), cuda_batch()
    trial = memlab.measure(model, batch, memlab.Plan(), steps=2)
    reference = hand_made_peak(model, batch)
    assert trial.status == "ok", trial.error
    assert abs(trial.peak_bytes - reference) <= 0.02 * reference, (trial.peak_bytes, reference)
    assert trial.reserved_bytes >= trial.peak_bytes


def test_cuda_categories_match_independent_figures():
    # "other" is what the allocator saw beyond the tracked categories, so the sum says nothing; the categories
    # that can be counted independently are checked against those counts instead.
    model, batch = cuda_model(), cuda_batch()
    trial = memlab.measure(model, batch, memlab.Plan(), steps=1)
    assert trial.status == "ok", trial.error
    weights = {id(p): p for p in model.parameters()}.values()
    parameter_bytes = sum(p.numel() * p.element_size() for p in [*weights, *model.buffers()])
    assert trial.breakdown["params"] == parameter_bytes
    trainable = sum(p.numel() * p.element_size() for p in weights if p.requires_grad)
    # Two fp32 moments per weight; AdamW keeps its step counters on the CPU unless capturable, so they count only
    # when it puts them on the GPU.
    assert trial.breakdown["optimizer"] in (2 * trainable, 2 * trainable + 4 * len(list(weights)))


def test_fp16_with_grad_scaler_trains_and_saves_activation_memory():
    model, batch = cuda_model(), cuda_batch()
    fp32, fp16 = memlab.compare(model, batch, [memlab.Plan(), memlab.Plan(precision="fp16")], progress=False).trials
    assert fp16.status == "ok", fp16.error
    assert fp16.breakdown["activations"] < fp32.breakdown["activations"]
    with memlab.apply(model, memlab.Plan(precision="fp16"), lr=1e-3) as applied:
        assert isinstance(applied._step.parts.optimizer_step, ScaledStep)
        losses = [applied.step(batch) for _ in range(10)]
    assert losses[-1] < losses[0]


def test_8bit_adam_on_cuda_keeps_under_30_percent_of_adamw_state():
    model, batch = cuda_model(), cuda_batch(rows=2)
    adamw, adam8 = memlab.compare(
        model, batch, [memlab.Plan(), memlab.Plan(optimizer="adamw8bit")], progress=False
    ).trials
    assert adam8.status == "ok", adam8.error
    assert adam8.breakdown["optimizer"] <= 0.30 * adamw.breakdown["optimizer"]


def test_offloading_the_optimizer_takes_its_state_off_the_gpu():
    model, batch = cuda_model(), cuda_batch(rows=2)
    plain, offloaded = memlab.compare(
        model, batch, [memlab.Plan(), memlab.Plan(offload="optimizer")], progress=False
    ).trials
    assert offloaded.status == "ok", offloaded.error
    assert offloaded.breakdown["optimizer"] == 0
    assert offloaded.peak_bytes < plain.peak_bytes


def test_offloading_activations_lowers_activation_memory():
    model, batch = cuda_model(), cuda_batch(rows=8, length=256)
    plain, offloaded = memlab.compare(
        model, batch, [memlab.Plan(), memlab.Plan(offload="activations")], progress=False
    ).trials
    assert offloaded.status == "ok", offloaded.error
    assert offloaded.breakdown["activations"] < plain.breakdown["activations"]


def test_a_cuda_budget_is_a_real_cap_and_is_lifted_afterwards():
    model, batch = cuda_model(), cuda_batch()
    plain = memlab.measure(model, batch, memlab.Plan(), steps=1)
    capped = memlab.measure(model, batch, memlab.Plan(), budget=int(plain.peak_bytes * 0.6), steps=1)
    assert capped.status == "oom"
    again = memlab.measure(model, batch, memlab.Plan(), steps=1)
    assert again.status == "ok"
    assert torch.cuda.memory_allocated() <= plain.breakdown["params"] + plain.breakdown["other"]
