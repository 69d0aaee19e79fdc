"""The registry of levers (memlab.techniques.core.registry): what it declares, and the step it runs.

The registry of levers: every Plan field declared once, every facet there, and every export faithful to it.

The registry runs the step: every lever's technique is an object the training step puts on, and each lever's value
changes what the step does. Walks the registry, so a new lever is covered without an edit here."""

from __future__ import annotations

import ast
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
import torch
from models import lm_batch, tiny_llama
from torch import nn

import memlab
from memlab.errors import MemlabError, UnsupportedTechnique
from memlab.export import deepspeed_config, peft_config, pytorch_code, training_arguments
from memlab.export.accelerate import accelerate_config, accelerate_script
from memlab.live.batch import count_rows
from memlab.plan import LEVERS, Plan
from memlab.runner.step import TrainingStep
from memlab.search.space import TECHNIQUES, needs_at_least
from memlab.techniques import compile as compile_technique
from memlab.techniques import fp8
from memlab.techniques.attention import unavailable
from memlab.techniques.core.lever import TARGETS, Lever
from memlab.techniques.core.registry import REGISTRY, STEP_ORDER, step_techniques
from memlab.techniques.core.technique import StepParts, Technique


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


PACKAGE = Path(memlab.__file__).parent


def sample_values(lever: Lever) -> list[Any]:
    """Values other than the default, read from the declaration."""
    if lever.choices:
        values: list[Any] = [value for value in lever.choices if value != lever.default]
        return values + ([("q_proj",)] if lever.open_choices else [])
    if lever.type == "bool":
        return [not lever.default]
    if lever.type == "float":
        return [0.05]
    return [1 if lever.default is None else lever.default + 2]


def plan_with(name: str, value: Any) -> tuple[Plan, Plan]:
    """A plan with ``name=value`` and the same plan without it; a lever that means something only with an adapter
    (the plan drops it otherwise) is tried on a LoRA plan."""
    for base in (Plan(), Plan(adapter="lora"), Plan(precision="bf16")):  # fp8 runs beside bf16
        try:
            plan = base.replace(**{name: value})
        except MemlabError:
            continue
        if getattr(plan, name) == value:
            return plan, base
    raise AssertionError(f"no plan takes {name}={value!r}")


CASES = [(name, value) for name, lever in REGISTRY.items() for value in sample_values(lever)]


def _simple(value: Any) -> Any:
    if isinstance(value, (bool, int, float, str, type(None))):
        return value
    if isinstance(value, dict) and all(isinstance(v, (bool, int, float, str)) for v in value.values()):
        return tuple(sorted(value.items()))
    return None


def what_the_step_does(step: TrainingStep, batch: Any) -> dict[str, Any]:
    """What a step of a plan does, in a form that compares with ==: its notes, optimizer, parts, and the model it
    trains (modules, their plain settings, the trained parameters)."""
    parts = step.parts
    plain = StepParts(nn.Linear(1, 1), None, torch.device("cpu"))
    optimizer = step.optimizer
    return {
        "notes": tuple(step.notes),
        "optimizer": (type(optimizer).__name__, tuple(sorted(
            (k, str(v)) for k, v in optimizer.param_groups[0].items() if k != "params"))),
        "loss": getattr(parts.loss_fn, "__name__", None),
        "micro_batches": [count_rows(part) for part in parts.split(batch)],
        "contexts": len(parts.forward_contexts),
        "scales": [parts.scale(torch.tensor(12.0)).item()],
        "casts": len(parts.input_casts),
        "backward": parts.backward.__qualname__ != plain.backward.__qualname__,
        "optimizer_step": type(parts.optimizer_step).__name__,
        "in_backward": parts.steps_in_backward,
        "modules": tuple(
            (name, type(module).__name__,
             tuple(sorted((k, s) for k, v in vars(module).items() if (s := _simple(v)) is not None)))
            for name, module in step.model.named_modules()
        ),
        "trained": tuple(
            (name, tuple(p.shape), p.dtype) for name, p in step.model.named_parameters() if p.requires_grad
        ),
    }


@pytest.fixture(scope="module")
def llama() -> nn.Module:
    return tiny_llama()


def test_every_lever_declares_a_technique_and_every_technique_goes_on_in_a_declared_order() -> None:
    for name, lever in REGISTRY.items():
        assert isinstance(lever.technique, Technique), f"{name} declares no technique"
        does_something = {"put_on", "notes"} & {k for k in type(lever.technique).__dict__}
        assert does_something, f"{name}'s technique overrides neither put_on nor notes: it does nothing"
    declared = {id(lever.technique) for lever in REGISTRY.values()}
    assert {id(technique) for technique in step_techniques()} == declared, "a technique missing from STEP_ORDER"
    assert set(STEP_ORDER) <= set(REGISTRY)


@pytest.mark.parametrize(("name", "value"), CASES, ids=[f"{n}={v}" for n, v in CASES])
def test_the_step_puts_on_each_levers_technique_and_its_value_changes_the_step(
    name: str, value: Any, llama: nn.Module, monkeypatch: pytest.MonkeyPatch
) -> None:
    if name in ("vllm_memory", "vllm_sleep"):  # a GRPOTrainer's engine, read by its estimate: a step has none
        with pytest.raises(MemlabError, match="this step has none"):
            TrainingStep(llama, Plan(**{name: value}))
        return
    if name == "precompute_ref":  # a DPOTrainer's reference log-probs: a model's own step has no reference
        with pytest.raises(MemlabError, match="this step has no DPOTrainer's reference"):
            TrainingStep(llama, Plan(**{name: value}))
        return
    plan, base = plan_with(name, value)
    technique = REGISTRY[name].technique
    assert technique is not None
    called: list[Plan] = []
    put_on = technique.put_on

    def spy(parts: StepParts) -> Any:
        called.append(parts.plan)
        return put_on(parts)

    monkeypatch.setattr(technique, "put_on", spy)
    if name == "compile":  # a compiled step without inductor's code generation (42 s for tiny Llama here): the same
        monkeypatch.setattr(compile_technique, "BACKEND", "aot_eager")  # technique, tests/techniques/test_compile.py
    batch = lm_batch(rows=2, length=8)
    if name == "attention" and (reason := unavailable(llama, value)):  # no kernel here: the step refuses it, untouched
        with pytest.raises(UnsupportedTechnique, match="write attention='sdpa'"):
            TrainingStep(llama, plan)
        assert plan in called and reason and llama.config._attn_implementation == "sdpa"
        return
    if name == "fp8" and fp8.unavailable(torch.device("cpu")):  # float8 matmuls need a GPU of sm89+: refused
        with pytest.raises(UnsupportedTechnique, match="fp8 cannot run here"):
            TrainingStep(llama, plan)
        assert plan in called and not any(type(m).__name__ == "Float8Linear" for m in llama.modules())
        return
    done = {}
    for each in (base, plan):
        step = TrainingStep(llama, each)
        try:
            done[each] = what_the_step_does(step, batch)
            assert isinstance(step(batch), float)
        finally:
            step.close()
    assert plan in called, f"the step never put on {name}'s technique for {name}={value!r}"
    assert done[plan] != done[base], f"{name}={value!r} changes nothing in the step"


def test_the_runner_names_no_lever() -> None:
    """The step reads no plan field and imports no technique by name: it runs what the registry's techniques
    leave in its parts."""
    source = (PACKAGE / "runner" / "step.py").read_text()
    tree = ast.parse(source)
    fields = set(REGISTRY) | {"offloads_optimizer", "offloads_activations"}
    def is_plan(node: ast.AST) -> bool:
        return (isinstance(node, ast.Name) and node.id == "plan") or (
            isinstance(node, ast.Attribute) and node.attr == "plan")

    read = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute) and is_plan(node.value)}
    assert read & fields == set()
    assert "getattr" not in source
    imported = {
        node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module
    }
    assert not any(module.startswith("memlab.techniques.") and module.rsplit(".", 1)[1] not in
                   ("registry", "technique") for module in imported), imported


def test_a_technique_that_fails_takes_the_others_off_again(llama: nn.Module, monkeypatch: pytest.MonkeyPatch) -> None:
    from models import assert_same, fingerprint

    before = fingerprint(llama)
    checkpointing = REGISTRY["checkpointing"].technique
    assert checkpointing is not None

    def fail(parts: StepParts) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(checkpointing, "put_on", fail)
    with pytest.raises(RuntimeError, match="boom"):
        TrainingStep(llama, Plan(adapter="lora", weights="bf16"))
    assert_same(before, fingerprint(llama))
