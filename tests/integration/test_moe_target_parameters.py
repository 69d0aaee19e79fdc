"""LoRA on fused MoE experts named explicitly (issue 60): peft adapts transformers 5's fused 3-D expert weights only
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
from models import MOE_EXPERTS, tiny_mixtral, tiny_qwen3_moe

import memlab
from memlab.techniques.adapters import attach_adapter
from memlab.techniques.core.registry import REGISTRY
from memlab.techniques.targets import split_targets


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
