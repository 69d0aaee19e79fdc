"""The lora_targets lever (memlab.techniques.targets): which layers and fused experts get adapters.

The lora_targets lever: which layers get adapters, measured, exported, labelled and parsed.

LoRA on fused MoE experts named explicitly (issue 60): peft adapts transformers 5's fused 3-D expert weights only
through ``target_parameters``. A user's ``LoraConfig(target_modules=[...], target_parameters=[...])`` is read into
the plan (``lora_targets`` carries the parameters), the plan's exports write them back and train the same weights,
a plan can name expert parameters itself, and the estimate counts them."""

from __future__ import annotations

import copy
import math
import warnings
from typing import Any

import pytest
import torch
from models import (
    MOE_EXPERTS,
    assert_same,
    fingerprint,
    lm_batch,
    tiny_bert,
    tiny_gpt2,
    tiny_llama,
    tiny_mixtral,
    tiny_qwen3_moe,
)

import memlab
from memlab.errors import MemlabError
from memlab.plan import LEVERS, parse_grid
from memlab.techniques.adapters import adapter_targets, attach_adapter
from memlab.techniques.core.registry import REGISTRY
from memlab.techniques.targets import split_targets

peft = pytest.importorskip("peft")


@pytest.mark.slow
def test_attention_targets_are_peft_defaults_and_train_fewer_weights_than_all_linear() -> None:
    model, batch = tiny_llama(width=128), lm_batch()
    before = fingerprint(model)
    attention = adapter_targets(model, "attention")
    assert attention and all(name.endswith(("q_proj", "v_proj")) for name in attention)
    assert len(adapter_targets(model)) > len(attention)
    every, fewer, named = memlab.compare(
        model, batch,
        [memlab.Plan(adapter="lora"), memlab.Plan(adapter="lora", lora_targets="attention"),
         memlab.Plan(adapter="lora", lora_targets=["q_proj"])],
        steps=1, progress=False,
    ).trials
    assert [t.status for t in (every, fewer, named)] == ["ok"] * 3, [t.error for t in (every, fewer, named)]
    assert named.breakdown["optimizer"] < fewer.breakdown["optimizer"] < every.breakdown["optimizer"]
    assert_same(before, fingerprint(model))


def test_the_adapter_technique_uses_the_targets() -> None:
    model = tiny_llama(width=64)
    undo = attach_adapter(model, memlab.Plan(adapter="lora", lora_targets=("v_proj",)))
    assert undo is not None
    trained = [name for name, p in model.named_parameters() if p.requires_grad]
    assert trained and all("v_proj.lora_" in name for name in trained)
    undo()
    assert not any(p.requires_grad is False for p in model.parameters())


def test_targets_are_exported_labelled_parsed_and_normalised() -> None:
    plan = memlab.Plan(adapter="lora", lora_targets=["q_proj", "v_proj"])
    assert plan.lora_targets == ("q_proj", "v_proj") and hash(plan)
    assert plan.to_peft_config().target_modules == {"q_proj", "v_proj"}
    assert memlab.Plan(adapter="lora", lora_targets="attention").to_peft_config().target_modules is None
    assert "target_modules=['q_proj', 'v_proj']" in plan.to_code()
    assert plan.label() == "lora q_proj+v_proj"
    labels = [p.label() for p in parse_grid(["adapter=lora", "lora_targets=attention,all-linear,q_proj+k_proj"])]
    assert labels == ["lora attention", "lora", "lora q_proj+k_proj"]
    assert memlab.Plan(lora_targets="attention") == memlab.Plan()
    assert LEVERS["lora_targets"].choices == ("all-linear", "attention")
    with pytest.raises(MemlabError, match="write one of all-linear, attention, or a list of module names"):
        memlab.Plan(adapter="lora", lora_targets="mlp")
    with pytest.raises(memlab.UnsupportedTechnique, match="write other lora_targets"):
        attach_adapter(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)),
                       memlab.Plan(adapter="lora", lora_targets=("q_proj",)))


def test_gpt2_lora_and_qlora_measure_with_adapters_on_its_conv1d_layers() -> None:
    model, batch = tiny_gpt2(), lm_batch(rows=2)
    before = fingerprint(model)
    targets = adapter_targets(model)
    assert {name.rsplit(".", 1)[-1] for name in targets} == {"c_attn", "c_proj", "c_fc"}
    trial = memlab.measure(model, batch, memlab.Plan(adapter="lora", lora_rank=4), steps=1, noise=0)
    assert trial.status == "ok", trial.error
    # QLoRA holds the Conv1D layers in 4-bit, as transformers' bitsandbytes load does (issue 44)
    qlora = memlab.measure(model, batch, memlab.Plan(adapter="qlora", lora_rank=4), steps=1, noise=0)
    assert qlora.status == "ok", qlora.error
    assert_same(before, fingerprint(model))


def test_the_exported_targets_are_the_measured_ones() -> None:
    from transformers import BertConfig, BertForSequenceClassification

    bert = BertForSequenceClassification(BertConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                                    intermediate_size=32, vocab_size=64))
    plan = memlab.Plan(adapter="lora", lora_rank=4)
    exported = plan.to_peft_config(model=bert).target_modules
    assert sorted(exported) == sorted(adapter_targets(bert)) and "classifier" not in exported
    gpt2 = tiny_gpt2()
    assert sorted(plan.to_peft_config(model=gpt2).target_modules) == sorted(adapter_targets(gpt2))


def _lora_and_saved(model: torch.nn.Module) -> tuple[list[str], list[str], int]:
    """The layers peft adapted, the modules it trains whole, and the trained parameters' count."""
    from peft.tuners.lora import LoraLayer
    from peft.utils.other import ModulesToSaveWrapper

    def names(kind: type) -> list[str]:
        return sorted(n.removeprefix("base_model.model.") for n, m in model.named_modules() if isinstance(m, kind))

    return names(LoraLayer), names(ModulesToSaveWrapper), sum(p.numel() for p in model.parameters() if p.requires_grad)


def _task_models() -> dict[str, Any]:
    from transformers import (
        BertConfig,
        BertForQuestionAnswering,
        LlamaConfig,
        LlamaForSequenceClassification,
        RobertaConfig,
        RobertaForSequenceClassification,
    )

    bert = {"vocab_size": 64, "hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
            "intermediate_size": 32}
    llama = {"vocab_size": 64, "hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
             "num_key_value_heads": 2, "intermediate_size": 32, "pad_token_id": 0}
    return {
        "bert-classifier": tiny_bert, "llama-classifier": lambda: LlamaForSequenceClassification(LlamaConfig(**llama)),
        "roberta-classifier": lambda: RobertaForSequenceClassification(RobertaConfig(**bert)),
        "bert-qa": lambda: BertForQuestionAnswering(BertConfig(**bert)), "llama-lm": tiny_llama, "gpt2": tiny_gpt2,
    }


@pytest.mark.parametrize(("name", "targets"), [
    *((name, "all-linear") for name in _task_models()),
    *((name, targets) for name in ("bert-classifier", "llama-classifier")
      for targets in ("attention", ("query", "q_proj")))])
def test_the_config_exported_without_the_model_trains_what_was_measured(name: str, targets: Any) -> None:
    """issue 44: plan.to_peft_config() on a sequence classifier adapted its new head, which memlab trains whole."""
    make = _task_models()[name]
    plan = memlab.Plan(adapter="lora", lora_rank=2, lora_targets=targets)
    torch.manual_seed(0)
    measured = make()
    undo = attach_adapter(measured, plan)  # what a trial trains
    trained = sum(p.numel() for p in measured.parameters() if p.requires_grad)
    adapted = sorted(n for n, m in measured.named_modules() if hasattr(m, "lora_A"))
    assert undo is not None
    undo()
    exported = peft.get_peft_model(make(), plan.to_peft_config())
    lora, saved, count = _lora_and_saved(exported)
    assert (lora, count) == (adapted, trained)
    if "classifier" in name or name == "bert-qa":
        assert saved and not any(n.startswith(tuple(saved)) for n in lora)  # the head trained whole, not adapted
    else:
        assert not saved
    with_model = peft.get_peft_model(make(), plan.to_peft_config(model=make()))
    assert _lora_and_saved(with_model) == (lora, saved, count)


def _batch() -> dict[str, torch.Tensor]:
    ids = torch.randint(3, 100, (4, 16), generator=torch.Generator().manual_seed(0))
    return {"input_ids": ids, "labels": ids}


def _user_config(r: int = 4) -> Any:
    from peft import LoraConfig

    return LoraConfig(r=r, lora_alpha=2 * r, target_modules=["q_proj", "v_proj"], target_parameters=list(MOE_EXPERTS))


def _trained_by_peft(model: torch.nn.Module, config: Any) -> dict[str, tuple[int, ...]]:
    from peft import get_peft_model

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        wrapped = get_peft_model(copy.deepcopy(model), copy.deepcopy(config))
    return {name.removeprefix("base_model.model."): tuple(p.shape)
            for name, p in wrapped.named_parameters() if p.requires_grad}


def _plan_of(peft_model: torch.nn.Module) -> memlab.Plan:
    """The plan memlab reads from a peft model (each lever's ``from_peft``, as ``Plan.from_trainer`` does)."""
    config = next(iter(peft_model.peft_config.values()))
    values = {name: lever.from_peft(config) for name, lever in REGISTRY.items() if lever.from_peft is not None}
    return memlab.Plan(adapter="lora", **{name: value for name, value in values.items() if value is not None})


@pytest.mark.parametrize("build", [tiny_qwen3_moe, tiny_mixtral], ids=["qwen3-moe", "mixtral"])
def test_a_users_target_parameters_survive_the_round_trip(build: Any) -> None:
    from peft import get_peft_model

    base = build()
    user = _trained_by_peft(base, _user_config())
    assert any(".mlp.experts." in name for name in user)
    plan = _plan_of(get_peft_model(copy.deepcopy(base), _user_config()))
    assert set(MOE_EXPERTS) <= set(plan.lora_targets)
    for config in (plan.to_peft_config(), plan.to_peft_config(model=base)):
        assert _trained_by_peft(base, config) == user  # the same weights, shapes and ranks as the user's config
    assert sorted(plan.to_peft_config().target_parameters) == sorted(MOE_EXPERTS)
    assert "target_parameters=" in plan.to_code()


def test_a_plan_names_expert_parameters_itself() -> None:
    model = tiny_qwen3_moe()
    plan = memlab.Plan(adapter="lora", lora_rank=4, lora_targets=("q_proj", "v_proj", "gate_up_proj"))
    config = plan.to_peft_config(model=model)
    assert config.target_parameters == ["gate_up_proj"]
    undo = attach_adapter(model, plan)
    assert undo is not None
    try:
        trained = {name: tuple(p.shape) for name, p in model.named_parameters() if p.requires_grad}
    finally:
        undo()
    assert any(".mlp.experts." in name for name in trained)  # the fused experts get adapters, not only q and v
    assert trained == _trained_by_peft(model, config)


def test_without_a_model_expert_names_become_target_parameters() -> None:
    assert split_targets(("q_proj", "mlp.experts.gate_up_proj")) == (["q_proj"], ["mlp.experts.gate_up_proj"])
    assert split_targets(("all-linear", "experts.down_proj")) == ("all-linear", ["experts.down_proj"])
    # parameters only: an empty list, since None would add peft's default layers for the model's type
    assert split_targets(("mlp.experts.down_proj",)) == ([], ["mlp.experts.down_proj"])


@pytest.mark.parametrize("build", [tiny_qwen3_moe, tiny_mixtral], ids=["qwen3-moe", "mixtral"])
def test_the_estimate_counts_the_adapted_experts(build: Any) -> None:
    base, batch = build(), _batch()
    plan = memlab.Plan(adapter="lora", lora_rank=4, lora_targets=("q_proj", "v_proj", *MOE_EXPERTS))
    measured, estimated = memlab.measure(base, batch, plan), memlab.estimate(base, batch, plan)
    # AdamW's two fp32 moments of every weight the user's config trains (the experts' adapters among them), and a
    # 4-byte step count per tensor
    user = _trained_by_peft(base, _user_config())
    assert estimated.breakdown["optimizer"] == 8 * sum(math.prod(shape) for shape in user.values()) + 4 * len(user)
    assert abs(estimated.peak_bytes / measured.peak_bytes - 1) < 0.01


@pytest.mark.parametrize("build", [tiny_qwen3_moe, tiny_mixtral], ids=["qwen3-moe", "mixtral"])
def test_all_linear_beside_expert_parameters_trains_what_the_recipe_trains(build: Any) -> None:
    from peft import LoraConfig

    base = build()  # HF's gpt-oss recipe: target_modules="all-linear" with explicit target_parameters
    recipe = _trained_by_peft(base, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear",
                                               target_parameters=list(MOE_EXPERTS)))
    plan = memlab.Plan(adapter="lora", lora_rank=4, lora_targets=("all-linear", *MOE_EXPERTS))
    for config in (plan.to_peft_config(), plan.to_peft_config(model=base)):
        assert _trained_by_peft(base, config) == recipe
    undo = attach_adapter(base, plan)
    assert undo is not None
    try:
        assert {name: tuple(p.shape) for name, p in base.named_parameters() if p.requires_grad} == recipe
    finally:
        undo()
