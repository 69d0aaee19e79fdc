"""A peft model built from an "all-linear" LoraConfig on a fused-MoE model, read back (issue 60): get_peft_model
rewrites the config in place for transformers 5's fused experts (the attention layers' names, the expert
parameters, ``gate_up_proj`` at twice the rank through ``rank_pattern``). memlab's plan of that model must build
exactly the adapters peft built, names and shapes, and its estimate must count them."""

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


def _wrapped(base: torch.nn.Module, **keywords: Any) -> Any:
    from peft import LoraConfig, get_peft_model

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return get_peft_model(copy.deepcopy(base), LoraConfig(r=4, lora_alpha=8, **keywords))


def _trained(model: torch.nn.Module) -> dict[str, tuple[int, ...]]:
    return {name.removeprefix("base_model.model."): tuple(p.shape)
            for name, p in model.named_parameters() if p.requires_grad}


def _plan_of(peft_model: Any) -> memlab.Plan:
    """The plan memlab reads from a peft model (each lever's ``from_peft``, as ``Plan.from_trainer`` does)."""
    config = next(iter(peft_model.peft_config.values()))
    values = {name: lever.from_peft(config) for name, lever in REGISTRY.items() if lever.from_peft is not None}
    return memlab.Plan(adapter="lora", **{name: value for name, value in values.items() if value is not None})


CONFIGS = {
    "all-linear+experts": dict(target_modules="all-linear", target_parameters=list(MOE_EXPERTS)),
    "all-linear": dict(target_modules="all-linear"),
}


@pytest.mark.parametrize("keywords", list(CONFIGS.values()), ids=list(CONFIGS))
@pytest.mark.parametrize("build", [tiny_qwen3_moe, tiny_mixtral], ids=["qwen3-moe", "mixtral"])
def test_the_plan_of_a_converted_config_builds_peft_s_adapters(build: Any, keywords: dict[str, Any]) -> None:
    base = build()
    wrapped = _wrapped(base, **keywords)
    user = _trained(wrapped)
    assert any(".mlp.experts." in name for name in user)
    plan = _plan_of(wrapped)
    undo = attach_adapter(base, plan)
    assert undo is not None
    try:
        assert _trained(base) == user  # the fused gate_up_proj at peft's 2r, not at r
    finally:
        undo()
    for config in (plan.to_peft_config(), plan.to_peft_config(model=base)):
        assert _trained(_wrapped(base, **{k: v for k, v in vars(config).items() if k in (
            "target_modules", "target_parameters", "rank_pattern", "alpha_pattern", "modules_to_save")})) == user


@pytest.mark.parametrize("build", [tiny_qwen3_moe, tiny_mixtral], ids=["qwen3-moe", "mixtral"])
def test_the_estimate_of_the_plan_read_back_counts_peft_s_adapters(build: Any) -> None:
    base = build()
    wrapped = _wrapped(base, **CONFIGS["all-linear+experts"])
    user = _trained(wrapped)
    ids = torch.randint(3, 100, (2, 16), generator=torch.Generator().manual_seed(0))
    batch = {"input_ids": ids, "labels": ids}
    plan = _plan_of(wrapped)
    # AdamW's two fp32 moments of every weight peft trains, and a 4-byte step count per tensor
    expected = 8 * sum(math.prod(shape) for shape in user.values()) + 4 * len(user)
    assert memlab.estimate(base, batch, plan).breakdown["optimizer"] == expected
    assert memlab.estimate(wrapped, batch, plan).breakdown["optimizer"] == expected


def test_plan_from_a_trainer_over_the_peft_model_builds_peft_s_adapters(tmp_path: Any) -> None:
    from datasets import Dataset
    from transformers import Trainer, TrainingArguments

    base = tiny_qwen3_moe()
    wrapped = _wrapped(base, target_modules="all-linear")
    args = TrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True, save_strategy="no", max_steps=1,
                             per_device_train_batch_size=2)
    data = Dataset.from_dict({"input_ids": [[(i + j) % 90 + 3 for j in range(8)] for i in range(4)]})
    plan = memlab.Plan.from_trainer(Trainer(model=wrapped, args=args, train_dataset=data))
    assert plan.adapter == "lora" and plan.lora_rank == 4
    undo = attach_adapter(base, plan)
    assert undo is not None
    try:
        assert _trained(base) == _trained(wrapped)
    finally:
        undo()
