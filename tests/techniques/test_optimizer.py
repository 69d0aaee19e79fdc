"""The optimizer lever (memlab.techniques.optimizer): foreach, fused and 8-bit AdamW, and Adafactor.

optimizer="adamw_foreach": the AdamW a plain loop builds on CUDA, so that a user's own loop is estimated as it is.

Its update holds ``torch._foreach_sqrt`` of the second moments, a temporary as large as the trained weights, where
the fused AdamW (memlab's "adamw", the Trainer's default) holds none; a CPU run and a CUDA dry run both see it.

Issue 15's optimizers on CPU: Adafactor, paged 8-bit AdamW and fused AdamW (its chunked cross-entropy:
test_loss.py)."""


from __future__ import annotations

import copy

import torch
from models import (
    assert_same,
    fingerprint,
    lm_batch,
    tiny_gpt2,
    tiny_llama,
)
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

import memlab
import memlab.techniques.optimizer
from memlab import Plan
from memlab.estimation.estimate import adamw8bit_state_bytes
from memlab.export import deepspeed_config, pytorch_code, training_arguments
from memlab.export.trainer_arguments import plan_from_training_arguments
from memlab.search.space import default_space, needs_at_least
from memlab.techniques.core.registry import REGISTRY
from memlab.techniques.optimizer import FOREACH_ON_CPU, PAGED_ON_CPU, build_optimizer, state_tensors


def _config() -> LlamaConfig:
    # Wide enough that the weights outweigh a short batch's activations: the step's update is the peak.
    return LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, vocab_size=256)


def _batch() -> dict[str, torch.Tensor]:
    ids = torch.randint(0, 256, (1, 8), generator=torch.Generator().manual_seed(0))
    return {"input_ids": ids, "labels": ids}


def _parameter_bytes(model: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def _assert_one_temporary_more(fused: memlab.Trial, foreach: memlab.Trial, weights: int) -> None:
    assert fused.status == foreach.status == "ok", (fused.error, foreach.error)
    # Same state; the foreach update's square roots (counted under "other") come on top at its peak.
    assert foreach.breakdown["optimizer"] == fused.breakdown["optimizer"]
    assert foreach.breakdown["other"] >= weights
    # The fused plan's peak sits a little above its own step (in backward), so the gap is a little under the
    # temporaries' size.
    assert 0.95 * weights <= foreach.peak_bytes - fused.peak_bytes <= weights


def test_a_cuda_estimate_counts_the_foreach_update_s_temporaries() -> None:
    config, batch = _config(), _batch()
    fused, foreach = (memlab.estimate(config, batch, plan, device="cuda")
                      for plan in (Plan(), Plan(optimizer="adamw_foreach")))
    _assert_one_temporary_more(fused, foreach, _parameter_bytes(LlamaForCausalLM(config)))
    assert foreach.estimated and foreach.device.startswith("cuda")
    assert FOREACH_ON_CPU not in foreach.notes  # the dry run answers for CUDA, where foreach is the default


def test_a_cpu_run_holds_the_same_temporaries_and_leaves_the_model_as_it_was() -> None:
    torch.manual_seed(0)
    model, batch = LlamaForCausalLM(_config()), _batch()
    before = fingerprint(model)
    fused, foreach = memlab.compare(model, batch, [Plan(), Plan(optimizer="adamw_foreach")], steps=1, noise=0,
                                    progress=False).trials
    _assert_one_temporary_more(fused, foreach, _parameter_bytes(model))
    assert FOREACH_ON_CPU in foreach.notes
    assert_same(before, fingerprint(model))


def test_fit_never_searches_or_suggests_it_and_ranks_it_above_the_fused_adamw() -> None:
    for device in ("cpu", "cuda"):
        assert "adamw_foreach" not in default_space(8, device)["optimizer"]
    assert "adamw_foreach" not in REGISTRY["optimizer"].suggest
    # Named in a space, it is ruled out wherever the fused AdamW does not fit (same state, one temporary more).
    assert needs_at_least(Plan(optimizer="adamw_foreach"), Plan(), 4)
    assert not needs_at_least(Plan(), Plan(optimizer="adamw_foreach"), 4)


def test_its_exports_build_torch_s_foreach_adamw_and_the_trainer_s_name_reads_back() -> None:
    plan = Plan(micro_batch=2, accumulation=2, optimizer="adamw_foreach")
    arguments = training_arguments(plan, legacy_names=False)
    assert arguments["optim"] == "adamw_torch"  # torch's AdamW with its defaults: foreach on CUDA
    assert plan_from_training_arguments(type("Args", (), arguments)()) == plan
    code = pytorch_code(plan)
    assert "optimizer = torch.optim.AdamW(params, lr=lr, foreach=True)" in code
    compile(code, "<plan>", "exec")
    assert "torch.optim.AdamW (foreach=True)" in deepspeed_config(plan)["_comment"]
    assert "foreach=True" in pytorch_code(plan.replace(optimizer_in_backward=True, accumulation=1))


def adafactor_state_bytes(model: nn.Module) -> int:
    """transformers' Adafactor without a first moment: a fp32 row and column per matrix, the full second moment
    of a vector, and a 0-d fp32 RMS per tensor."""
    total = 0
    for p in model.parameters():
        total += 4 * (p.shape[0] + p.shape[1]) if p.dim() == 2 else 4 * p.numel()
        total += 4
    return total


def test_adafactor_state_is_factored_and_at_most_15_percent_of_adamw():
    model, batch = tiny_llama(), lm_batch(rows=2)
    before = fingerprint(model)
    adamw, adafactor = memlab.compare(
        model, batch, [Plan(), Plan(optimizer="adafactor")], steps=1, noise=0, progress=False
    ).trials
    assert adamw.status == adafactor.status == "ok", (adamw.error, adafactor.error)
    n = sum(p.numel() for p in model.parameters())
    assert adamw.breakdown["optimizer"] == 8 * n + 4 * len(list(model.parameters()))
    assert adafactor.breakdown["optimizer"] == adafactor_state_bytes(model)
    assert adafactor.breakdown["optimizer"] <= 0.15 * adamw.breakdown["optimizer"]
    assert_same(before, fingerprint(model))


def test_paged_adamw8bit_on_cpu_is_the_unpaged_one_and_the_trial_says_so():
    model, batch = tiny_llama(), lm_batch(rows=2)
    eight, paged = memlab.compare(
        model, batch, [Plan(optimizer="adamw8bit"), Plan(optimizer="paged_adamw8bit")], steps=1, noise=0, progress=False
    ).trials
    assert paged.status == "ok", paged.error
    assert PAGED_ON_CPU in paged.notes and PAGED_ON_CPU not in eight.notes
    assert paged.breakdown["optimizer"] == eight.breakdown["optimizer"]
    assert paged.breakdown["optimizer"] == adamw8bit_state_bytes(list(model.parameters()))
    with memlab.apply(model, Plan(optimizer="paged_adamw8bit")) as applied:
        assert type(applied.optimizer).__name__ == "AdamW8bit"


def test_adamw_is_fused_where_the_trainer_fuses_it():
    layer = nn.Linear(4, 4)
    assert build_optimizer(list(layer.parameters()), Plan(), 1e-3).defaults["fused"] is True
    assert build_optimizer(list(layer.parameters()), Plan(), 1e-3, device_type="cuda").defaults["fused"] is True
    unfused = build_optimizer(list(layer.parameters()), Plan(), 1e-3, device_type="cuda", fused=False)
    assert not unfused.defaults["fused"] and unfused.defaults["foreach"] is True


def test_fused_adamw_peak_is_below_the_foreach_updates_where_the_update_is_the_peak(monkeypatch):
    # Big weights and two rows: the foreach update's temporaries (a copy of every weight at once) make its peak.
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(256, 256) for _ in range(4)])
    batch = torch.randn(2, 256)

    def loss_fn(model, rows):
        return model(rows).pow(2).mean()

    n = sum(p.numel() for p in model.parameters())
    fused = memlab.measure(model, batch, Plan(), loss_fn=loss_fn, steps=1, noise=0)

    def foreach(parameters, plan, lr, device_type=None):
        return build_optimizer(parameters, plan, lr, device_type="cuda", fused=False)

    monkeypatch.setattr(memlab.techniques.optimizer, "build_optimizer", foreach)
    unfused = memlab.measure(model, batch, Plan(), loss_fn=loss_fn, steps=1, noise=0)
    assert fused.status == unfused.status == "ok"
    # The foreach peak is inside the update: every gradient, no activations, temporaries the size of the weights.
    assert unfused.breakdown["grads"] == 4 * n and unfused.breakdown["activations"] == 0
    assert unfused.breakdown["other"] >= 4 * n
    assert fused.peak_bytes <= unfused.peak_bytes - 4 * n * 0.9


def test_8bit_adam_state_is_uint8_and_under_30_percent_of_adamw():
    model, batch = tiny_gpt2(width=128), lm_batch(rows=2)
    sizes = {}
    for optimizer in ("adamw", "adamw8bit"):
        with memlab.apply(copy.deepcopy(model), memlab.Plan(optimizer=optimizer)) as applied:
            applied.step(batch)
            tensors = state_tensors(applied.optimizer)
            sizes[optimizer] = sum(t.numel() * t.element_size() for t in tensors)
            if optimizer == "adamw8bit":
                moments = [t for t in tensors if t.numel() >= 4096]
                assert moments and all(t.dtype == torch.uint8 for t in moments)
    assert sizes["adamw8bit"] <= 0.30 * sizes["adamw"], sizes


def test_8bit_adam_ignores_overrides_left_on_bitsandbytes_singleton_for_other_models():
    """The Trainer registers 32-bit embeddings on bitsandbytes' global manager, keyed by position and never
    cleared; memlab's 8-bit optimizer must not inherit that for a different model."""
    import bitsandbytes

    shared = bitsandbytes.optim.GlobalOptimManager.get_instance()
    saved = (dict(shared.index2config), dict(shared.pid2config), list(shared.module_weight_config_triple))
    other = tiny_gpt2(width=128)
    try:
        shared.register_module_override(other.transformer.wte, "weight", {"optim_bits": 32})
        stale = bitsandbytes.optim.AdamW8bit(other.parameters())
        stale.check_overrides()  # what the Trainer's optimizer does at its first step
        model = tiny_gpt2(width=128)
        with memlab.apply(model, memlab.Plan(optimizer="adamw8bit")) as applied:
            applied.step(lm_batch(rows=2))
            moments = [t for t in state_tensors(applied.optimizer) if t.numel() >= 4096]
        assert all(t.dtype == torch.uint8 for t in moments)
        # An override the user set for this very model is kept.
        shared.register_module_override(model.transformer.wte, "weight", {"optim_bits": 32})
        with memlab.apply(model, memlab.Plan(optimizer="adamw8bit")) as applied:
            applied.step(lm_batch(rows=2))
            embedding_state = applied.optimizer.state[model.transformer.wte.weight]
        assert embedding_state["state1"].dtype == torch.float32
    finally:
        shared.index2config, shared.pid2config = saved[0], saved[1]
        shared.module_weight_config_triple = saved[2]
