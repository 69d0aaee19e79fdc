"""What an adapter trial trains is what the peft export trains, from one computation of the targets: a sequence
classifier's new head trained whole (``modules_to_save``), a mixture-of-experts model's fused experts
(``target_parameters``); ``Applied.undo()`` after adapter training loses nothing by default and releases the
optimizer; a user's peft model is read back as it is (``target_modules``)."""

from __future__ import annotations

import copy
import warnings
from typing import Any

import pytest
import torch
import transformers
from models import mlp_batch, mlp_loss, tiny_bert, tiny_mlp

import memlab
from memlab.errors import MemlabWarning
from memlab.techniques.adapters import attach_adapter
from memlab.techniques.core.registry import REGISTRY

LORA = memlab.Plan(adapter="lora", lora_rank=2)


def _mixtral() -> torch.nn.Module:
    config = transformers.MixtralConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=2, num_local_experts=4,
                                        num_experts_per_tok=2)
    return transformers.MixtralForCausalLM(config)


def _trained_by_peft(model: torch.nn.Module, config: Any) -> dict[str, tuple[int, ...]]:
    from peft import get_peft_model

    wrapped = get_peft_model(copy.deepcopy(model), config)
    return {name.removeprefix("base_model.model."): tuple(p.shape)
            for name, p in wrapped.named_parameters() if p.requires_grad}


def _trained_by_the_trial(model: torch.nn.Module, plan: memlab.Plan) -> dict[str, tuple[int, ...]]:
    undo = attach_adapter(model, plan)
    assert undo is not None
    try:
        return {name: tuple(p.shape) for name, p in model.named_parameters() if p.requires_grad}
    finally:
        undo()


@pytest.mark.parametrize("build", [tiny_bert, _mixtral], ids=["bert classifier", "mixtral (fused experts)"])
def test_the_peft_export_trains_exactly_what_the_trial_trained(build: Any) -> None:
    model = build()
    config = LORA.to_peft_config(model=model)
    trial = _trained_by_the_trial(model, LORA)
    assert trial == _trained_by_peft(model, config)
    if isinstance(model, transformers.BertForSequenceClassification):
        assert config.modules_to_save == ["classifier"]
        assert any(name.startswith("classifier.modules_to_save.") for name in trial)  # the new head trains
    else:
        assert {"gate_up_proj", "down_proj"} <= set(config.target_parameters)
        assert any(".mlp.experts." in name for name in trial)  # peft adapts the fused experts: so does the trial


@pytest.mark.parametrize("build", [tiny_bert, _mixtral], ids=["bert classifier", "mixtral (fused experts)"])
def test_undo_after_training_merges_what_trained(build: Any) -> None:
    model = build()
    ids = torch.randint(3, 100, (4, 16), generator=torch.Generator().manual_seed(0))
    batch = {"input_ids": ids, "labels": torch.tensor([0, 1, 2, 1]) if build is tiny_bert else ids}
    head = model.classifier.weight.detach().clone() if build is tiny_bert else None
    applied = memlab.apply(model, LORA, lr=1e-2)
    for _ in range(2):
        applied.step(batch)
    model.eval()
    with torch.no_grad():
        trained = model(**batch).logits
    with pytest.warns(MemlabWarning, match="merged"):
        applied.undo()
    assert not any("lora_" in name or "modules_to_save" in name for name, _ in model.named_parameters())
    if build is tiny_bert:
        assert not torch.equal(model.classifier.weight, head)
    with torch.no_grad():
        torch.testing.assert_close(model(**batch).logits, trained, rtol=1e-4, atol=1e-4)


def test_undo_without_training_changes_nothing_and_says_nothing() -> None:
    model = tiny_bert()
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    applied = memlab.apply(model, LORA)
    with warnings.catch_warnings():
        warnings.simplefilter("error", MemlabWarning)
        applied.undo()
    assert all(torch.equal(before[name], p) for name, p in model.named_parameters())


def test_undo_releases_the_optimizer_so_a_later_trial_peaks_as_before() -> None:
    model, batch = tiny_mlp(), mlp_batch()
    options: dict[str, Any] = dict(loss_fn=mlp_loss, steps=1, warmup=0, noise=0, progress=False)
    first = memlab.compare(model, batch, [memlab.Plan()], **options)[0]
    applied = memlab.apply(model, memlab.Plan(), loss_fn=mlp_loss, lr=1e-3)
    optimizer = applied.optimizer
    applied.step(batch)
    assert optimizer.state
    applied.undo()
    assert applied.optimizer is None and not optimizer.state  # the state goes even where the user holds it
    again = memlab.compare(model, batch, [memlab.Plan()], **options)[0]
    assert again.preexisting_bytes == first.preexisting_bytes
    assert again.peak_bytes == first.peak_bytes, (again.breakdown, first.breakdown)


def test_a_users_peft_model_gives_its_targets_to_the_plan() -> None:
    from peft import LoraConfig, get_peft_model

    wrapped = get_peft_model(copy.deepcopy(tiny_bert()), LoraConfig(r=4, target_modules=["query", "value"]))
    config = wrapped.peft_config["default"]
    read = {name: lever.from_peft(config) for name, lever in REGISTRY.items() if lever.from_peft is not None}
    assert read["lora_targets"] == ("query", "value") and read["lora_rank"] == 4
    plan = memlab.Plan(adapter="lora").replace(**{k: v for k, v in read.items() if v is not None})
    assert sorted(plan.to_peft_config(model=tiny_bert()).target_modules) == sorted(
        name for name, _ in tiny_bert().named_modules() if name.endswith((".query", ".value")))
    assert LoraConfig(target_modules="all-linear").target_modules == "all-linear"
    assert REGISTRY["lora_targets"].from_peft(LoraConfig(target_modules="all-linear")) == "all-linear"
    assert REGISTRY["lora_targets"].from_peft(LoraConfig()) == "attention"
