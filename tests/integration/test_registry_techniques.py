"""The registry runs the step: every lever's technique is an object the training step puts on, and each lever's value
changes what the step does. Walks the registry, so a new lever is covered without an edit here."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest
import torch
from models import lm_batch, tiny_llama
from torch import nn

import memlab
from memlab.errors import MemlabError, UnsupportedTechnique
from memlab.live.batch import count_rows
from memlab.plan import Plan
from memlab.runner.step import TrainingStep
from memlab.techniques import compile as compile_technique
from memlab.techniques import fp8
from memlab.techniques.attention import unavailable
from memlab.techniques.core.lever import Lever
from memlab.techniques.core.registry import REGISTRY, STEP_ORDER, step_techniques
from memlab.techniques.core.technique import StepParts, Technique

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
        monkeypatch.setattr(compile_technique, "BACKEND", "aot_eager")  # technique, tests/integration/test_compile.py
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
