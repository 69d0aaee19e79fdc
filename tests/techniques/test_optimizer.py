"""optimizer="adamw_foreach": the AdamW a plain loop builds on CUDA, so that a user's own loop is estimated as it is.

Its update holds ``torch._foreach_sqrt`` of the second moments, a temporary as large as the trained weights, where
the fused AdamW (memlab's "adamw", the Trainer's default) holds none; a CPU run and a CUDA dry run both see it.

Issue 15's levers on CPU: Adafactor, paged 8-bit AdamW, fused AdamW, and the chunked cross-entropy."""

from __future__ import annotations

import pytest
import torch
from models import assert_same, fingerprint, lm_batch, tiny_bert, tiny_gpt2, tiny_llama
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

import memlab
import memlab.techniques.optimizer
from memlab import Plan
from memlab.errors import UnsupportedTechnique
from memlab.estimation.estimate import adamw8bit_state_bytes
from memlab.export import deepspeed_config, pytorch_code, training_arguments
from memlab.search.space import default_space, needs_at_least
from memlab.techniques.loss import chunked_causal_lm_loss, chunked_loss_applies
from memlab.techniques.optimizer import FOREACH_ON_CPU, PAGED_ON_CPU, build_optimizer
from memlab.techniques.registry import REGISTRY
from memlab.trainer.arguments import plan_from_training_arguments


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


def masked_lm_batch(rows: int = 2, length: int = 24) -> dict[str, torch.Tensor]:
    batch = lm_batch(rows=rows, length=length)
    batch["labels"][0, :5] = -100  # a prompt the loss ignores
    return batch


@pytest.mark.parametrize("make", [tiny_llama, tiny_gpt2], ids=["llama", "gpt2"])
def test_chunked_loss_and_gradients_equal_the_full_loss(make):
    model, batch = make(), masked_lm_batch()
    full = model(**batch).loss
    full.backward()
    full_grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    chunked = chunked_causal_lm_loss(model, batch)
    chunked.backward()
    torch.testing.assert_close(chunked, full, rtol=1e-5, atol=1e-6)
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, full_grads[name], rtol=1e-4, atol=1e-6, msg=name)


def test_a_step_with_the_chunked_loss_trains_on_the_same_loss():
    model, batch = tiny_llama(), masked_lm_batch()
    with memlab.apply(model, Plan(), lr=1e-3) as applied:
        full = applied.step(batch)
    trained = tiny_llama()  # the same start: apply trains the weights for real
    with memlab.apply(trained, Plan(loss="chunked"), lr=1e-3) as applied:
        chunked = applied.step(batch)
        assert applied.step(batch) < chunked
    assert chunked == pytest.approx(full, rel=1e-5)


def big_vocab_llama() -> tuple[nn.Module, dict[str, torch.Tensor]]:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
        vocab_size=16384, max_position_embeddings=256,
    )
    torch.manual_seed(0)
    ids = torch.randint(0, 16384, (1, 192), generator=torch.Generator().manual_seed(1))
    return LlamaForCausalLM(config), {"input_ids": ids, "labels": ids.clone()}


def test_chunked_loss_activations_are_at_most_60_percent_of_the_full_loss_and_estimate_agrees():
    model, batch = big_vocab_llama()
    full, chunked = memlab.compare(
        model, batch, [Plan(), Plan(loss="chunked")], steps=1, noise=0, progress=False
    ).trials
    assert full.status == chunked.status == "ok", (full.error, chunked.error)
    assert chunked.breakdown["activations"] <= 0.6 * full.breakdown["activations"]
    predicted = memlab.estimate(model, batch, Plan(loss="chunked"), device="cpu")
    assert predicted.status == "ok", predicted.error
    assert abs(predicted.peak_bytes - chunked.peak_bytes) <= 0.1 * chunked.peak_bytes


def test_the_chunked_loss_is_refused_where_it_cannot_apply():
    llama, batch = tiny_llama(), lm_batch(rows=2)
    before = fingerprint(llama)

    def own_loss(model, micro):
        return model(**micro).loss

    with pytest.raises(UnsupportedTechnique, match="drop loss_fn"):
        memlab.apply(llama, Plan(loss="chunked"), loss_fn=own_loss)
    trial = memlab.measure(llama, batch, Plan(loss="chunked"), loss_fn=own_loss, steps=1, noise=0)
    assert trial.status == "error" and "loss='full'" in (trial.error or "")
    assert_same(before, fingerprint(llama))

    for model in (tiny_bert(), nn.Linear(4, 4)):
        assert not chunked_loss_applies(model)
        with pytest.raises(UnsupportedTechnique, match="causal LM with an LM head"):
            memlab.apply(model, Plan(loss="chunked"))
    with pytest.raises(UnsupportedTechnique, match="dict batch"):
        chunked_causal_lm_loss(llama, (batch["input_ids"],))  # type: ignore[arg-type]
    with pytest.raises(UnsupportedTechnique, match="labels"):
        chunked_causal_lm_loss(llama, {"input_ids": batch["input_ids"]})
    assert chunked_loss_applies(llama) and chunked_loss_applies(tiny_gpt2())


def tiny_moe(family: str, router_logits: bool = True) -> nn.Module:
    import transformers

    config_class, model_class, experts = {
        "mixtral": ("MixtralConfig", "MixtralForCausalLM", {"num_local_experts": 4}),
        "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM", {"num_experts": 4, "moe_intermediate_size": 16,
                                                                 "shared_expert_intermediate_size": 16}),
        "olmoe": ("OlmoeConfig", "OlmoeForCausalLM", {"num_experts": 4}),
    }[family]
    config = getattr(transformers, config_class)(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        num_experts_per_tok=2, vocab_size=128, output_router_logits=router_logits, router_aux_loss_coef=0.5,
        **experts,
    )
    torch.manual_seed(0)
    return getattr(transformers, model_class)(config)


@pytest.mark.parametrize("family", ["mixtral", "qwen2_moe", "olmoe"])
def test_chunked_loss_keeps_an_moe_router_aux_loss_and_its_gradients(family):
    model, batch = tiny_moe(family), masked_lm_batch()
    batch["input_ids"] = batch["input_ids"] % 128
    batch["labels"] = torch.where(batch["labels"] == -100, -100, batch["labels"] % 128)
    full = model(**batch)
    assert full.aux_loss is not None and full.aux_loss.item() > 0
    full.loss.backward()
    full_grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    assert chunked_loss_applies(model)
    chunked = chunked_causal_lm_loss(model, batch)
    chunked.backward()
    torch.testing.assert_close(chunked, full.loss, rtol=1e-5, atol=1e-6)
    for name, p in model.named_parameters():
        if name in full_grads:
            torch.testing.assert_close(p.grad, full_grads[name], rtol=1e-4, atol=1e-6, msg=name)


def test_chunked_loss_of_an_moe_without_router_logits_is_the_plain_loss():
    model, batch = tiny_moe("mixtral", router_logits=False), lm_batch(rows=2)
    batch["input_ids"] = batch["input_ids"] % 128
    batch["labels"] = batch["labels"] % 128
    torch.testing.assert_close(chunked_causal_lm_loss(model, batch), model(**batch).loss, rtol=1e-5, atol=1e-6)


def test_chunked_loss_refuses_a_model_that_adds_an_aux_loss_it_cannot_reproduce():
    model = tiny_moe("mixtral")
    del model.router_aux_loss_coef  # a forward whose aux-loss form memlab does not know
    before = fingerprint(model)
    assert not chunked_loss_applies(model)
    with pytest.raises(UnsupportedTechnique, match="loss='full'"):
        memlab.apply(model, Plan(loss="chunked"))
    assert_same(before, fingerprint(model))
