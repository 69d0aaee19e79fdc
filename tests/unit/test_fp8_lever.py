"""``Plan(fp8=...)`` as a lever: its field, label, ``--try`` value, conflicts and every export (issue 60). None of
these need torchao: the exports write code for it, the declaration names it."""

from __future__ import annotations

import warnings

import pytest

from memlab import Plan
from memlab.errors import MemlabError, MemlabWarning
from memlab.export.accelerate import accelerate_script
from memlab.plan import LEVERS, parse_grid
from memlab.techniques.core.registry import REGISTRY, STEP_ORDER

PLAN = Plan(micro_batch=2, checkpointing=True, precision="bf16", fp8=True)
WITHOUT = PLAN.replace(fp8=False)


def test_fp8_is_a_bool_lever_labelled_and_tried() -> None:
    assert Plan().fp8 is False and LEVERS["fp8"].type == "bool"
    assert Plan(precision="bf16", fp8=True).label() == "bf16 fp8"
    assert Plan(precision="bf16", fp8=True).describe() == "precision bf16, fp8"
    assert [plan.fp8 for plan in parse_grid("precision=bf16 fp8=on,off")] == [True, False]
    # after the weights' dtype (float8 layers share those weights), before checkpointing and compile wrap the model
    assert STEP_ORDER.index("weights") < STEP_ORDER.index("fp8") < STEP_ORDER.index("checkpointing")
    with pytest.raises(MemlabError, match="fp8='yes' is not allowed; write True or False"):
        Plan(precision="bf16", fp8="yes")


@pytest.mark.parametrize(("settings", "says"), [
    ({"precision": "fp16"}, "write precision='bf16' with fp8=True"),
    ({}, "write precision='bf16' with fp8=True"),  # fp32 weights without autocast: nothing runs in bf16
    ({"precision": "bf16", "adapter": "lora"}, "write adapter='none' with fp8=True, or fp8=False"),
])
def test_settings_float8_cannot_go_with_are_refused_saying_what_to_write(settings: dict[str, str], says: str) -> None:
    with pytest.raises(MemlabError, match=says):
        Plan(fp8=True, **settings)  # type: ignore[arg-type]
    assert Plan(weights="bf16", fp8=True).fp8  # pure bf16 weights: float8 beside bf16, as torchtitan trains


def test_the_code_export_converts_with_torchaos_public_function_after_the_weights() -> None:
    code = Plan(weights="bf16", compile=True, fp8=True).to_code()
    assert "from torchao.float8 import Float8LinearConfig, convert_to_float8_training" in code
    assert "convert_to_float8_training(" in code and "module_filter_fn=" in code
    assert code.index("model.to(torch.bfloat16)") < code.index("convert_to_float8_training(") < code.index(
        "model.compile()")
    assert "torchao" not in Plan(weights="bf16", compile=True).to_code()
    compile(code, "<plan>", "exec")


@pytest.mark.parametrize("strategy", ["fsdp2", "fsdp1", "zero2", "zero3"])
def test_the_accelerate_export_asks_for_fp8_with_torchaos_recipe(strategy: str) -> None:
    config = PLAN.to_accelerate_config(gpus=2, strategy=strategy)
    assert config["mixed_precision"] == "fp8"  # accelerate's fp8: bf16 autocast and float8 linear layers
    assert config["fp8_config"]["backend"] == "AO"
    assert WITHOUT.to_accelerate_config(gpus=2, strategy=strategy)["mixed_precision"] == "bf16"
    assert "fp8_config" not in WITHOUT.to_accelerate_config(gpus=2, strategy=strategy)
    script = accelerate_script(PLAN, strategy=strategy)
    assert "from accelerate.utils import AORecipeKwargs" in script
    assert "kwargs_handlers=[AORecipeKwargs()]" in script
    assert "AORecipeKwargs" not in accelerate_script(WITHOUT, strategy=strategy)
    compile(script, "train.py", "exec")


def test_fsdp2_loads_without_ram_efficient_loading_which_accelerate_refuses_with_torchao() -> None:
    for strategy in ("fsdp2", "fsdp1"):
        assert PLAN.to_accelerate_config(gpus=2, strategy=strategy)["fsdp_config"][
            "fsdp_cpu_ram_efficient_loading"] is False
        assert WITHOUT.to_accelerate_config(gpus=2, strategy=strategy)["fsdp_config"][
            "fsdp_cpu_ram_efficient_loading"] is True


def test_the_trainers_arguments_warn_where_fp8_goes_and_deepspeed_says_it() -> None:
    with pytest.warns(MemlabWarning, match="fp8 is not a setting of TrainingArguments: launch with accelerate"):
        kwargs = PLAN.to_training_arguments()
    with warnings.catch_warnings():
        warnings.simplefilter("error", MemlabWarning)
        assert kwargs == WITHOUT.to_training_arguments()
    assert "mixed_precision='fp8'" in PLAN.to_deepspeed()["_comment"]
    assert REGISTRY["fp8"].refusal(PLAN, "deepspeed") == ""


def test_peft_config_is_the_adapters_alone() -> None:
    assert REGISTRY["fp8"].fragment(PLAN, "peft").note == ""
