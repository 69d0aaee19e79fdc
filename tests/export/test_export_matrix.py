"""Every lever x value x export, generated from the registry: the export's parsed output holds the lever's effect,
or the export raises MemlabError with the lever's refusal. A new lever is picked up here without editing this file:
its values come from its declaration, and its fragments are checked to be in the output, and to change it.

The code export runs, once per lever value, on a tiny Llama for a few steps on CPU; its effects are read off the
model, the optimizer and hooks, not off the text. It runs again for lever combinations, generated from the registry:
a set of plans in which every three levers' values that the Plan allows together (its conflicts, and the settings
that mean nothing without an adapter, pruned) meet in at least one plan (a greedy 3-way covering array, about 80
plans where all combinations are thousands), each run with every lever's effect checked.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import itertools
import random
import re
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from models import lm_batch, tiny_llama
from torch.optim.optimizer import register_optimizer_step_post_hook

from memlab.errors import MemlabError
from memlab.export import deepspeed_config, peft_config, pytorch_code, training_arguments
from memlab.export.accelerate import accelerate_config, accelerate_script
from memlab.plan import Plan
from memlab.techniques.adapters import lora_settings
from memlab.techniques.attention import unavailable
from memlab.techniques.checkpointing import checkpoint_blocks, checkpointed_blocks, chosen_blocks
from memlab.techniques.core.fragments import (
    STRATEGIES,
    TARGETS,
    Accelerate,
    Code,
    Elsewhere,
    InLoraConfig,
    Keys,
    Lora,
)
from memlab.techniques.core.registry import REGISTRY, refusals

transformers = pytest.importorskip("transformers")
pytest.importorskip("peft")


def _values(name: str) -> list[Any]:
    lever = REGISTRY[name]
    if lever.type == "choice":
        return [*lever.choices, *([("q_proj", "v_proj")] if lever.open_choices else [])]
    if lever.type == "bool":
        return [False, True]
    if lever.type == "blocks":  # a switch that takes a count of blocks too
        return [False, True, 1]
    if lever.type == "float":
        return [lever.default, 0.05]
    return [lever.default, 2] if lever.default is None else [lever.default, lever.default + 1]


def _with_adapter_only(name: str) -> bool:
    """Whether the Plan normalises the lever away without an adapter (a setting of the adapter's LoraConfig)."""
    return any(getattr(Plan(**{name: value}), name) != value for value in _values(name) if _plan(name, value, {}))


def _plan(name: str, value: Any, base: dict[str, Any] | None = None) -> Plan | None:
    """The plain plan with the lever at ``value``; with an adapter where the lever means something only with one."""
    try:
        return Plan(**(base if base is not None else {"adapter": "lora"} if _with_adapter_only(name) else {}),
                    **{name: value})
    except MemlabError:  # a combination the Plan refuses
        return None


CASES = [(name, value, plan) for name in REGISTRY for value in _values(name) if (plan := _plan(name, value))]


def _id(case: tuple[str, Any, Plan]) -> str:
    name, value, _ = case
    return f"{name}={'+'.join(value) if isinstance(value, tuple) else value}"


def _default(name: str, plan: Plan) -> Plan:
    return plan.replace(**{name: REGISTRY[name].default})


def _subset(part: Mapping[str, Any], whole: Mapping[str, Any]) -> None:
    for key, value in part.items():
        if key == "_comment":
            assert value in whole[key]
        elif isinstance(value, Mapping):
            _subset(value, whole[key])
        else:
            assert whole[key] == value, key


def _lora_keyword(config: Any, keyword: str) -> Any:
    value = config[keyword] if isinstance(config, Mapping) else getattr(config, keyword)
    return sorted(value) if isinstance(value, set | list | tuple) else value


# --- the dict exports: TrainingArguments, DeepSpeed ------------------------------------------------------------------


def _expect_refusal(plan: Plan, target: str, export: Callable[[Plan], Any]) -> bool:
    problems = refusals(plan, target)
    if problems:
        with pytest.raises(MemlabError) as raised:
            export(plan)
        assert any(problem in str(raised.value) for problem in problems)
    return bool(problems)


def _trainer_case(case: tuple[str, Any, Plan]) -> Any:
    """The case, marked as needing deepspeed where its Trainer arguments carry a DeepSpeed config (transformers
    builds TrainingArguments(deepspeed=...) only where deepspeed is installed)."""
    try:
        exported = training_arguments(case[2], legacy_names=False)
    except MemlabError:
        exported = {}
    return pytest.param(case, id=_id(case), marks=[pytest.mark.needs("deepspeed")] if "deepspeed" in exported else [])


# transformers 5.17 (memlab's floor) names checkpointing gradient_checkpointing*; later 5.x activation_checkpointing*.
LEGACY = "activation_checkpointing" not in {f.name for f in dataclasses.fields(transformers.TrainingArguments)}


@pytest.mark.parametrize("case", [_trainer_case(case) for case in CASES])
def test_trainer_arguments(case: tuple[str, Any, Plan], tmp_path: Path) -> None:
    name, value, plan = case
    if _expect_refusal(plan, "trainer", training_arguments):
        return
    fragment = REGISTRY[name].fragment(plan, "trainer")
    kwargs = training_arguments(plan, legacy_names=LEGACY)
    args = transformers.TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[], **kwargs)
    if isinstance(fragment, Keys):
        keys = fragment.legacy if LEGACY and isinstance(fragment.legacy, Mapping) else fragment.keys
        assert isinstance(keys, Mapping)
        for key, made in keys.items():
            read = getattr(args, key)
            if isinstance(made, Mapping):
                _subset(made, read)
            elif key == "deepspeed":
                assert read == deepspeed_config(plan)
            else:
                assert getattr(read, "value", read) == made, key
    if "deepspeed" not in kwargs:  # the Trainer's settings read back as the plan (the whole batch: its own rows)
        back = Plan.from_training_arguments(args)
        if isinstance(fragment, Elsewhere):  # travels elsewhere (attention: from_pretrained), not in the arguments
            plan = _default(name, plan)
        assert back == plan.replace(micro_batch=back.micro_batch if plan.micro_batch is None else plan.micro_batch)
    if value != REGISTRY[name].default and not isinstance(fragment, Elsewhere | InLoraConfig):
        assert kwargs != training_arguments(_default(name, plan), legacy_names=LEGACY), "the lever changed nothing"


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_deepspeed_config(case: tuple[str, Any, Plan]) -> None:
    name, value, plan = case
    if _expect_refusal(plan, "deepspeed", deepspeed_config):
        return
    fragment = REGISTRY[name].fragment(plan, "deepspeed")
    config = deepspeed_config(plan)
    if isinstance(fragment, Keys):
        _subset(fragment.keys, config)
        if value != REGISTRY[name].default:
            assert config != deepspeed_config(_default(name, plan)), "the lever changed nothing"
    elif isinstance(fragment, Elsewhere) and fragment.note:
        assert fragment.note in config["_comment"]  # where the lever goes instead, in the config itself


@pytest.mark.needs("deepspeed")
def test_deepspeeds_parser_takes_every_deepspeed_config() -> None:
    from deepspeed.runtime.config import DeepSpeedConfig

    for name, value, plan in CASES:
        if refusals(plan, "deepspeed"):
            continue
        config = deepspeed_config(plan)
        parsed = DeepSpeedConfig({**config, "train_micro_batch_size_per_gpu": plan.micro_batch or 1})
        assert parsed.zero_optimization_stage == 2, (name, value)
        assert parsed.gradient_accumulation_steps == plan.accumulation, (name, value)
        assert parsed.bfloat16_config.enabled is ("bf16" in config), (name, value)
        assert parsed.float16_config.enabled is ("fp16" in config), (name, value)
        assert str(parsed.zero_config.offload_optimizer.device if parsed.zero_config.offload_optimizer else "none"
                   ).endswith("cpu" if plan.offloads_optimizer else "none"), (name, value)


# --- peft -------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_peft_config(case: tuple[str, Any, Plan]) -> None:
    name, value, plan = case
    if _expect_refusal(plan, "peft", peft_config):
        return
    fragment = REGISTRY[name].fragment(plan, "peft")
    if not any(isinstance(lever.fragment(plan, "peft"), Lora) for lever in REGISTRY.values()):
        with pytest.raises(MemlabError, match="a peft config needs"):  # nothing to write: no adapter
            peft_config(plan)
        return
    config = peft_config(plan)
    if isinstance(fragment, Lora | InLoraConfig):
        for keyword, setting in lora_settings(plan).items():
            assert _lora_keyword(config, keyword) == _lora_keyword({keyword: setting}, keyword), keyword
    if isinstance(fragment, InLoraConfig):
        assert _lora_keyword(config, fragment.keyword) == _lora_keyword({"v": value}, "v") or (
            fragment.keyword == "target_modules"  # lora_targets' names are peft's own words ("all-linear", None)
            or value is None)  # None (auto) is what lora_settings makes of the plan's other settings, checked above
        if value != REGISTRY[name].default:
            assert config != peft_config(_default(name, plan))


# --- accelerate: the YAML of each strategy and its script ---------------------------------------------------------


def _lines(code: Code) -> list[str]:
    written = [line for slot in ("imports", "settings", "model", "loss", "before_optimizer", "after_optimizer",
                                 "contexts", "before_step", "step", "after_step") for line in getattr(code, slot)]
    written += [f"{key}={setting}" for slot in ("load", "data", "accelerator") for key, setting in
                getattr(code, slot).items()]
    return [line.strip() for line in written if line.strip()]


def _lora_call(script: str) -> dict[str, Any]:
    for node in ast.walk(ast.parse(script)):
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "LoraConfig":
            return {keyword.arg: ast.literal_eval(keyword.value) for keyword in node.keywords if keyword.arg}
    raise AssertionError("no LoraConfig in the script")


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("case", CASES, ids=_id)
def test_accelerate_config_and_script(case: tuple[str, Any, Plan], strategy: str) -> None:
    name, value, plan = case

    def export(plan: Plan) -> tuple[dict[str, Any], str]:
        config = accelerate_config(plan, gpus=2, strategy=strategy)
        return yaml.safe_load(yaml.safe_dump(config)), accelerate_script(plan, strategy=strategy)

    if _expect_refusal(plan, "accelerate", export):
        return
    if strategy == "zero2" and plan.offload == "params":  # the one refusal that depends on the strategy
        with pytest.raises(MemlabError, match="ZeRO-2 cannot offload the parameters"):
            export(plan)
        return
    fragment = REGISTRY[name].fragment(plan, "accelerate")
    config, script = export(plan)
    compile(script, "train.py", "exec")
    if isinstance(fragment, Accelerate):
        _subset(fragment.config, config)
        _subset(fragment.section(strategy), config["fsdp_config" if strategy == "fsdp2" else "deepspeed_config"])
        code = fragment.lines(strategy)
        text = {line.strip() for line in script.splitlines()}
        joined = " ".join(script.split())
        for line in _lines(code):
            assert line in text or line in joined, line
        if code.optimizer:
            assert code.optimizer.format(params="params", device="device") in script
        if value != REGISTRY[name].default:
            assert (config, script) != export(_default(name, plan)), "the lever changed nothing"
    if isinstance(fragment, InLoraConfig) or name == "adapter" and value != "none":
        made = _lora_call(script)
        for keyword, setting in lora_settings(plan).items():
            assert made[keyword] == setting, keyword


# --- the plain PyTorch code, run -------------------------------------------------------------------------------------


class _Seen:
    """What a run of the code did, read off hooks on the model and torch."""

    def __init__(self, model: torch.nn.Module, monkeypatch: pytest.MonkeyPatch) -> None:
        self.rows: list[int] = []
        self.autocast: list[Any] = []
        self.head_calls = 0
        self.forwards = 0
        self.steps = 0
        self.saved_on_cpu = 0
        self.compiled = 0
        head = model.get_output_embeddings()

        def before(module: Any, args: Any) -> None:  # the embedding: every forward, the chunked loss's included
            self.forwards += 1
            self.rows.append(len(args[0]))
            on = torch.is_autocast_enabled("cpu")
            self.autocast.append(torch.get_autocast_dtype("cpu") if on else None)

        def head_called(*_: Any) -> None:
            self.head_calls += 1

        model.get_input_embeddings().register_forward_pre_hook(before)
        head.register_forward_pre_hook(head_called)
        self.hook = register_optimizer_step_post_hook(lambda *_: self._step())
        seen = self
        original = torch.autograd.graph.save_on_cpu

        class Recorded(original):  # type: ignore[misc, valid-type]
            def __enter__(self) -> Any:
                seen.saved_on_cpu += 1
                return super().__enter__()

        monkeypatch.setattr(torch.autograd.graph, "save_on_cpu", Recorded)

        def compiled(module: torch.nn.Module, *args: Any, **kwargs: Any) -> None:
            # Recorded, not compiled: inductor takes seconds per plan (tests/techniques/test_compile.py runs it).
            seen.compiled += 1

        monkeypatch.setattr(torch.nn.Module, "compile", compiled)

    def _step(self) -> None:
        self.steps += 1


BATCHES = 4
ROWS = 4


def _implementation(model: Any) -> str:
    """The attention implementation a (peft-wrapped) transformers model runs."""
    return str(model.get_base_model().config._attn_implementation if hasattr(model, "get_base_model")
               else model.config._attn_implementation)


def _effects(name: str, value: Any, plan: Plan, model: Any, namespace: dict[str, Any], seen: _Seen) -> None:
    """The lever's effect on the run, for the levers memlab has now (a new lever is checked by the generic part)."""
    checks: dict[str, Callable[[], Any]] = {
        "micro_batch": lambda: set(seen.rows) == {value or ROWS},
        "accumulation": lambda: plan.micro_batch is not None or seen.steps == BATCHES // value,
        "checkpointing": lambda: model.is_gradient_checkpointing is bool(value)
        and checkpointed_blocks(model) == chosen_blocks(len(checkpoint_blocks(model)), value),
        "weights": lambda: {p.dtype for p in model.parameters() if p.requires_grad}
        == {torch.bfloat16 if value == "bf16" else torch.float32},
        "adapter": lambda: (value == "none") is not hasattr(model, "peft_config") and (
            any(type(m).__name__ == "Linear4bit" for m in model.modules()) is (value == "qlora")),
        "precision": lambda: set(seen.autocast) == {{"fp32": None, "bf16": torch.bfloat16,
                                                    "fp16": torch.float16}[value]}
        and ("scaler" in namespace) is (value == "fp16"),
        "optimizer": lambda: type(namespace["optimizer"]).__name__ == {
            "adamw": "AdamW", "adamw_foreach": "AdamW", "adamw8bit": "AdamW8bit", "paged_adamw8bit": "PagedAdamW8bit",
            "adafactor": "Adafactor"}[value] and (namespace["optimizer"].defaults.get("foreach") is True) is (
            value == "adamw_foreach") and (namespace["optimizer"].defaults.get("fused") is True) is (value == "adamw"),
        "offload": lambda: (seen.saved_on_cpu == seen.forwards) is plan.offloads_activations and (
            namespace["optimizer"].param_groups[0]["params"][0] is namespace.get("cpu_params", [None])[0]
        ) is plan.offloads_optimizer,
        "loss": lambda: (seen.head_calls > seen.forwards) is (value == "chunked"),
        "optimizer_in_backward": lambda: ("optimizers" in namespace) is value and (
            seen.steps > BATCHES * len(namespace["params"]) - 1) is value,
        "attention": lambda: _implementation(model) == (value or "sdpa"),  # tiny_llama loads sdpa
        "compile": lambda: seen.compiled == int(value),
        "fp8": lambda: any(type(m).__name__ == "Float8Linear" for m in model.modules()) is value,
    }
    if name in checks:
        assert checks[name](), f"{name}={value!r} has no effect on the run"


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_code_runs_with_the_levers_effect(case: tuple[str, Any, Plan], monkeypatch: pytest.MonkeyPatch) -> None:
    name, value, plan = case
    if _expect_refusal(plan, "code", pytorch_code):
        return
    fragment = REGISTRY[name].fragment(plan, "code")
    code = pytorch_code(plan)
    if isinstance(fragment, Code):
        text = " ".join(code.split())
        for line in _lines(fragment):
            assert " ".join(line.split()) in text, line
        if value != REGISTRY[name].default:
            assert code != pytorch_code(_default(name, plan)), "the lever changed nothing"
    if plan.optimizer in ("adamw8bit", "paged_adamw8bit") or plan.adapter == "qlora":
        pytest.importorskip("bitsandbytes")
    namespace, seen = _run_code(plan, monkeypatch)
    model = namespace["model"]
    _effects(name, value, plan, model, namespace, seen)


# --- lever combinations: every three levers' values together, the code run -------------------------------------------

STRENGTH = 3


def _settings(plan: Plan, names: tuple[str, ...] | list[str]) -> tuple[tuple[str, Any], ...]:
    return tuple((name, getattr(plan, name)) for name in names)


def _built(choice: Mapping[str, Any]) -> Plan | None:
    try:
        return Plan(**choice)
    except MemlabError:  # a combination the registry's conflicts refuse
        return None


def _runs_here(name: str, value: Any) -> bool:
    """Whether the code of a plan with ``name=value`` can run on this machine: an attention implementation whose
    kernel is not here (flash-attn, FlexAttention's backward off CUDA) is left out of the combinations, which run
    their code (its single-lever cases above still check the code's text)."""
    return name != "attention" or value is None or not unavailable(tiny_llama(), value)


def _gain(choice: Mapping[str, Any], name: str, value: Any, missing: set[Any], strength: int) -> int:
    """How many missing settings ``choice`` with ``name=value`` would hold."""
    made = {**choice, name: value}
    return sum(tuple((n, made[n]) for n in levers) in missing
               for levers in itertools.combinations([n for n in REGISTRY if n in made], strength) if name in levers)


@functools.lru_cache(maxsize=1)
def _combinations(strength: int = STRENGTH, seed: int = 0) -> tuple[Plan, ...]:
    """Plans in which every ``strength`` levers' values that some Plan holds together appear together at least once,
    built greedily (each plan started from a setting still missing, every other lever given the value that adds most
    missing settings; a plan the Plan refuses loses some of those choices to their defaults)."""
    names = list(REGISTRY)
    values = {name: [tuple(v) if isinstance(v, list) else v for v in _values(name) if _runs_here(name, v)]
              for name in names}
    rng = random.Random(seed)
    missing = set()
    for levers in itertools.combinations(names, strength):
        for chosen in itertools.product(*(values[name] for name in levers)):
            plan = _built(dict(zip(levers, chosen, strict=True)))
            if plan is not None and _settings(plan, levers) == tuple(zip(levers, chosen, strict=True)):
                missing.add(tuple(zip(levers, chosen, strict=True)))

    def covered(plan: Plan) -> set[tuple[tuple[str, Any], ...]]:
        return set(itertools.combinations(_settings(plan, names), strength))

    plans: list[Plan] = []
    while missing:
        best: Plan | None = None
        for start in rng.sample(sorted(missing, key=repr), min(6, len(missing))):
            choice = dict(start)
            for name in rng.sample(names, len(names)):
                if name not in choice:
                    gains = [(_gain(choice, name, value, missing, strength), rng.random(), i)
                             for i, value in enumerate(values[name])]
                    choice[name] = values[name][max(gains)[2]]
            free = [name for name in names if name not in dict(start)]
            plan = _built(choice)
            while plan is None and free:
                choice.pop(free.pop(rng.randrange(len(free))))
                plan = _built(choice)
            if plan is not None and (best is None or len(covered(plan) & missing) > len(covered(best) & missing)):
                best = plan
        assert best is not None, "no plan holds a setting the covering array wants"
        plans.append(best)
        missing -= covered(best)
    return tuple(plans)


def test_the_combinations_cover_every_three_levers_values() -> None:
    plans = _combinations()
    assert len(set(plans)) == len(plans) < 150
    seen = {frozenset(three) for plan in plans for three in itertools.combinations(_settings(plan, list(REGISTRY)), 3)}
    for three in ({("adapter", "qlora"), ("weights", "bf16"), ("precision", "bf16")},  # issue 44's failing script
                  {("micro_batch", 2), ("accumulation", 2), ("offload", "all")},
                  {("adapter", "lora"), ("lora_dropout", 0.05), ("checkpointing", True)},
                  {("optimizer_in_backward", True), ("weights", "bf16"), ("loss", "chunked")}):
        assert frozenset(three) in seen, three
    assert not any(plan.adapter == "none" and plan.lora_rank != REGISTRY["lora_rank"].default for plan in plans)


# Levers whose check above reads a count or an object that another lever changes by design (the optimizer in backward
# steps once per parameter, with one optimizer each).
_INTERACTS = {"accumulation": ("optimizer_in_backward",), "optimizer": ("optimizer_in_backward",),
              "offload": ("optimizer_in_backward",)}


@pytest.mark.parametrize("plan", _combinations(), ids=lambda plan: plan.label() or "plain")
def test_the_code_of_lever_combinations_runs_with_every_levers_effect(
    plan: Plan, monkeypatch: pytest.MonkeyPatch
) -> None:
    if refusals(plan, "code"):
        _expect_refusal(plan, "code", pytorch_code)
        return
    if plan.optimizer in ("adamw8bit", "paged_adamw8bit") or plan.adapter == "qlora":
        pytest.importorskip("bitsandbytes")
    namespace, seen = _run_code(plan, monkeypatch)
    for name in REGISTRY:
        if not any(getattr(plan, other) != REGISTRY[other].default for other in _INTERACTS.get(name, ())):
            _effects(name, getattr(plan, name), plan, namespace["model"], namespace, seen)


def _run_code(plan: Plan, monkeypatch: pytest.MonkeyPatch) -> tuple[dict[str, Any], _Seen]:
    """Run ``plan``'s code on a tiny Llama and check what every run must show: a finite loss, trained weights, and
    the adapters (if any) on the layers memlab measures, with the settings it measures."""
    model = tiny_llama()
    if plan.attention is not None and (reason := unavailable(model, plan.attention)):
        pytest.skip(f"the code's attention={plan.attention!r} cannot run here: {reason}")  # as bitsandbytes is
    if plan.fp8:
        pytest.importorskip("torchao", reason="the code's fp8 needs torchao (pip install torchao)")
    seen = _Seen(model, monkeypatch)
    before = {key: tensor.clone() for key, tensor in model.state_dict().items()}
    namespace: dict[str, Any] = {"model": model, "batches": [lm_batch(rows=ROWS, seed=i) for i in range(BATCHES)]}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            exec(compile(pytorch_code(plan), plan.label(), "exec"), namespace)
    finally:
        seen.hook.remove()
    model = namespace["model"]
    assert torch.isfinite(namespace["loss"]).all()
    after = model.state_dict()
    assert any(key in after and after[key].shape == before[key].shape and not torch.equal(after[key], before[key])
               for key in before) or plan.adapter != "none", "nothing trained"
    if plan.adapter != "none":  # the adapters trained (LoRA's B starts at zero), on the layers memlab measured
        assert any(p.abs().sum() > 0 for n, p in model.named_parameters() if "lora_B" in n)
        measured = lora_settings(plan, tiny_llama())
        adapted = {n.removeprefix("base_model.model.") for n, m in model.named_modules() if hasattr(m, "lora_A")}
        assert adapted == set(measured.pop("target_modules"))
        for keyword, setting in measured.items():
            assert _lora_keyword(model.peft_config["default"], keyword) == _lora_keyword({keyword: setting}, keyword)
    return namespace, seen


def test_the_matrix_covers_every_lever_and_export() -> None:
    assert {name for name, _, _ in CASES} == set(REGISTRY)
    for lever in REGISTRY.values():
        assert set(lever.exports) == set(TARGETS), lever.name


def test_the_engines_name_no_lever() -> None:
    """The export modules assemble fragments: no ``plan.<lever>`` access and no lever's name as a string there
    (``fsdp2_torch_script``, a CPU harness for the FSDP2 sharding of a subset of plans, is the one exception). A
    trainer's arguments are read back into a Plan by asking each lever (its ``from_arguments``)."""
    folder = Path(__file__).resolve().parents[2] / "memlab" / "export"
    for path in folder.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and node.name == "fsdp2_torch_script":
                node.body = []
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "plan":
                assert node.attr not in REGISTRY and not re.match(r"offloads_", node.attr), (path.name, node.attr)
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                assert node.value not in REGISTRY, (path.name, node.value)
