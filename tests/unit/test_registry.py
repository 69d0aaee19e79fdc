"""The registry of levers: every Plan field declared once, every facet there, and every export faithful to it."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import pytest

from memlab.errors import MemlabError
from memlab.export import deepspeed_config, peft_config, pytorch_code, training_arguments
from memlab.export.accelerate import accelerate_config, accelerate_script
from memlab.plan import LEVERS, Plan
from memlab.search.space import TECHNIQUES, needs_at_least
from memlab.techniques.core.lever import TARGETS
from memlab.techniques.core.registry import REGISTRY
from memlab.techniques.core.technique import Technique


def test_every_plan_field_has_a_declaration_and_every_declaration_a_field() -> None:
    assert [f.name for f in fields(Plan)] == list(LEVERS)
    assert set(REGISTRY) == {f.name for f in fields(Plan)}
    for plan_field in fields(Plan):
        lever = REGISTRY[plan_field.name]
        assert lever.default == plan_field.default, plan_field.name
        assert lever.help and set(lever.exports) == set(TARGETS), plan_field.name
        if not isinstance(lever.technique, Technique):
            pytest.fail(f"{plan_field.name} declares no technique")
        for value in lever.choices:
            Plan(**{plan_field.name: value})


def test_the_search_reads_its_axes_from_the_registry() -> None:
    assert TECHNIQUES == tuple(name for name in LEVERS if not REGISTRY[name].split)


def test_an_undeclared_difference_is_not_comparable() -> None:
    base = Plan(adapter="lora")  # levers such as lora_targets mean something only with an adapter
    for name in TECHNIQUES:
        if REGISTRY[name].needs_at_least is None:
            for value in [v for v in REGISTRY[name].choices if v != getattr(base, name)]:
                changed = base.replace(**{name: value})
                assert not needs_at_least(changed, base, 4) and not needs_at_least(base, changed, 4), name


# --- every export x every lever value ---------------------------------------------------------------------------

VALUES = [Plan(**{name: value}) for name, lever in REGISTRY.items() for value in lever.choices[1:]] + [
    Plan(checkpointing=True), Plan(micro_batch=2, accumulation=4), Plan(adapter="lora", lora_rank=8),
    Plan(adapter="qlora", lora_rank=4, precision="bf16"), Plan(checkpointing=True, offload="activations"),
]


def _export(target: str, plan: Plan) -> Any:
    if target == "trainer":
        return training_arguments(plan, legacy_names=False)
    if target == "deepspeed":
        return deepspeed_config(plan)
    if target == "code":
        return pytorch_code(plan)
    if target == "peft":
        pytest.importorskip("peft")
        return peft_config(plan)
    return accelerate_config(plan, gpus=2), accelerate_script(plan)


def _carries(target: str, plan: Plan, made: Any) -> None:  # noqa: C901 - one check per lever and target
    text = str(made)
    if target == "peft":
        assert (made.r, made.target_modules) == (plan.lora_rank, "all-linear")
        return
    if plan.micro_batch is not None:
        assert str(plan.micro_batch) in text
    if plan.accumulation != 1:
        assert f"{plan.accumulation}" in text
    if plan.checkpointing:
        assert {"trainer": "'activation_checkpointing': True", "deepspeed": "cpu_checkpointing",
                "code": "activation_checkpointing_enable", "accelerate": "'fsdp_activation_checkpointing': True"}[
            target] in text or (target == "deepspeed" and not plan.offloads_activations)
    if plan.precision != "fp32":
        assert {"trainer": f"'{plan.precision}': True", "deepspeed": f"'{plan.precision}': {{'enabled': True",
                "code": "torch.autocast", "accelerate": f"'mixed_precision': '{plan.precision}'"}[target] in text
    if plan.weights == "bf16":
        assert {"code": "model.to(torch.bfloat16)", "accelerate": "dtype=torch.bfloat16"}[target] in text
    if plan.optimizer != "adamw":
        expected = {"adamw8bit": ("adamw_bnb_8bit", "AdamW8bit"), "paged_adamw8bit": ("paged_adamw_8bit",
                    "PagedAdamW8bit"), "adafactor": ("'adafactor'", "Adafactor"),
                    "adamw_foreach": ("'adamw_torch'", "foreach=True")}[plan.optimizer]
        assert (expected[0] if target == "trainer" else expected[1]) in text
    else:
        assert "AdamW" in text or "adamw_torch_fused" in text
    if plan.offloads_optimizer:
        assert {"trainer": "'offload_optimizer': {'device': 'cpu'", "deepspeed": "'offload_optimizer'",
                "code": "cpu_params", "accelerate": "'fsdp_offload_params': True"}[target] in text
    if plan.offloads_activations:
        assert {"trainer": "'offload': True", "deepspeed": "cpu_checkpointing", "code": "save_on_cpu",
                "accelerate": "save_on_cpu"}[target] in text
    if plan.adapter != "none":
        assert {"deepspeed": "get_peft_model", "code": "get_peft_model", "accelerate": "get_peft_model"}[target] in text
        assert target == "deepspeed" or f"r={plan.lora_rank}" in text
    if plan.adapter == "qlora":
        assert {"deepspeed": "4-bit NF4", "code": "BitsAndBytesConfig", "accelerate": "BitsAndBytesConfig("}[
            target] in text
    if plan.loss == "chunked":
        assert {"trainer": "fused_linear_cross_entropy", "deepspeed": "chunked loss", "code": "chunk_loss",
                "accelerate": "chunk_loss"}[target] in text


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("plan", VALUES, ids=lambda plan: plan.label().replace(" ", "_"))
def test_every_export_carries_each_lever_or_says_what_to_do(target: str, plan: Plan) -> None:
    if target == "peft" and plan.adapter == "none":
        with pytest.raises(MemlabError, match="needs adapter='lora' or 'qlora'"):
            _export(target, plan)
        return
    try:
        made = _export(target, plan)
    except MemlabError as error:
        assert "write" in str(error) or "use " in str(error) or "export" in str(error), error
        assert any(lever.refusal(plan, target) for lever in REGISTRY.values()) or "before 5" in str(error)
        return
    _carries(target, plan, made)


def test_refusals_the_exports_make() -> None:
    with pytest.raises(MemlabError, match="pure bf16"):
        training_arguments(Plan(weights="bf16"))
    with pytest.raises(MemlabError, match="get_peft_model"):
        training_arguments(Plan(adapter="qlora"))
    with pytest.raises(MemlabError, match="fp32 master weights"):
        deepspeed_config(Plan(weights="bf16"))
