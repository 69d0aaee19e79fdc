"""The fp8 lever (memlab.techniques.fp8): declared, exported, and tried on a model.

``Plan(fp8=...)`` as a lever: its field, label, ``--try`` value, conflicts and every export (issue 60). None of
these need torchao: the exports write code for it, the declaration names it.

The fp8 lever on a model: where torchao's float8 cannot run, an error trial that says what it needs (no torchao
needed to test that); with torchao installed, a float8 step on a tiny Llama with the model back exactly, the estimate
with and without fp8 (bf16, with and without checkpointing) and its difference explained by what torchao saves for
backward, the note for a GPU without float8 units, and the exported loop run as written.

torchao is not in the test extra (``pip install torchao``): the tests that need it skip with that reason."""

from __future__ import annotations

import importlib.util
import warnings
from pathlib import Path

import pytest
import torch
from models import assert_same, fingerprint, lm_batch, tiny_llama

import memlab
from memlab import Plan
from memlab.errors import MemlabError, MemlabWarning
from memlab.estimation.cuda.gpus import GPUS
from memlab.export.accelerate import accelerate_script
from memlab.plan import LEVERS, parse_grid
from memlab.techniques import fp8
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


FP8 = Plan(precision="bf16", fp8=True)
BF16 = Plan(precision="bf16")
SHAPES = {"input_ids": torch.randint(0, 64, (2, 32))}
SHAPES["labels"] = SHAPES["input_ids"]


def _torchao() -> None:
    if importlib.util.find_spec("torchao") is None:
        pytest.skip("needs torchao (pip install torchao): not in memlab's test extra")


def test_a_cpu_trial_is_an_error_trial_that_says_what_fp8_needs() -> None:
    model = tiny_llama()
    before = fingerprint(model)
    report = memlab.compare(model, lm_batch(rows=2, length=8), [BF16, FP8], steps=1, warmup=0, noise=0)
    assert [trial.status for trial in report.trials] == ["ok", "error"]
    error = report.trials[1].error or ""
    assert "fp8 cannot run here" in error and "torchao installed" in error and "compute capability 8.9" in error
    assert "Write fp8=False" in error
    assert_same(before, fingerprint(model))


def test_without_torchao_an_estimate_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fp8, "_torchao_problem", lambda: "torchao is not installed")
    trial = memlab.estimate(tiny_llama(), SHAPES, FP8, device="cuda", gpu="H100-80GB")
    assert trial.status == "error"
    assert "torchao is not installed; it needs torchao installed (pip install torchao)" in (trial.error or "")


def test_the_float8_step_runs_and_the_model_comes_back_exactly(monkeypatch: pytest.MonkeyPatch) -> None:
    _torchao()
    from torchao.float8.float8_linear import Float8Linear

    # torch runs torch._scaled_mm on the CPU too: the GPU check lifted, the real swap and undo run here
    monkeypatch.setattr(fp8, "unavailable", lambda device, fake=False: "")
    model = tiny_llama()
    before = fingerprint(model)
    report = memlab.compare(model, lm_batch(rows=2, length=8), [FP8], steps=1, warmup=0, noise=0)
    trial = report.trials[0]
    assert trial.status == "ok", trial.error
    kept = next(note for note in trial.notes if note.startswith("fp8: torchao's Float8Linear"))
    assert "on the linear layers but the first and last (model.layers.0.self_attn.q_proj, lm_head)" in kept
    assert "saved for backward as they come (bfloat16 for a bf16 input)" in kept
    assert not any(isinstance(module, Float8Linear) for module in model.modules())
    assert_same(before, fingerprint(model))


def _converted_weight_bytes(model: torch.nn.Module, dtype: torch.dtype = torch.bfloat16) -> int:
    modules = dict(model.named_modules())
    return sum(modules[name].weight.numel() * dtype.itemsize for name in fp8.converted_layers(model))


def test_the_estimate_runs_torchaos_float8_linear_and_its_difference_is_what_torchao_saves() -> None:
    _torchao()
    model = tiny_llama(width=64)
    estimates = {(checkpointing, on): memlab.estimate(
        model, SHAPES, BF16.replace(checkpointing=checkpointing, fp8=on), device="cuda", gpu="H100-80GB")
        for checkpointing in (False, True) for on in (False, True)}
    assert all(trial.status == "ok" for trial in estimates.values()), [t.error for t in estimates.values()]
    with_fp8 = estimates[False, True]
    assert any("estimated through torchao's own Float8Linear on fake tensors" in note for note in with_fp8.notes)
    assert fp8.saved_for_backward() == (torch.bfloat16, torch.bfloat16)  # its high-precision input and weight
    # Under bf16 autocast an nn.Linear saves bf16 copies of its fp32 weight; a Float8Linear saves the fp32 weight
    # itself (a view) and its bf16 input, as nn.Linear does: the difference is those copies, no more.
    copies = _converted_weight_bytes(model)
    plain = estimates[False, False]
    assert plain.breakdown["activations"] - with_fp8.breakdown["activations"] == copies == 155_648
    assert plain.peak_bytes - with_fp8.peak_bytes == copies
    assert with_fp8.breakdown["params"] == plain.breakdown["params"]
    # Checkpointed, only one block's saved tensors exist at once: the peaks differ by at most one block's copies.
    block = copies // model.config.num_hidden_layers + 4096 * 2
    assert abs(estimates[True, False].peak_bytes - estimates[True, True].peak_bytes) <= block


def test_with_pure_bf16_weights_float8_keeps_what_bf16_keeps() -> None:
    _torchao()
    model = tiny_llama(width=64)
    plain, with_fp8 = (memlab.estimate(model, SHAPES, Plan(weights="bf16", fp8=on), device="cuda", gpu="H100-80GB")
                       for on in (False, True))
    assert with_fp8.status == "ok", with_fp8.error
    assert with_fp8.breakdown["activations"] == plain.breakdown["activations"]


@pytest.mark.parametrize(("device", "gpu", "where"), [
    ("cuda", "A100-80GB", "the A100-80GB (compute capability 8.0)"), ("cpu", None, "the CPU")])
def test_an_estimate_where_float8_cannot_run_says_so(device: str, gpu: str | None, where: str) -> None:
    _torchao()
    trial = memlab.estimate(tiny_llama(), SHAPES, FP8, device=device, gpu=gpu)
    assert trial.status == "ok", trial.error
    assert fp8.OLD_GPU_NOTE.format(where=where) in trial.notes
    h100 = memlab.estimate(tiny_llama(), SHAPES, FP8, device="cuda", gpu="H100-80GB")
    assert not any("cannot run on" in note for note in h100.notes)


def test_the_exported_loop_converts_and_trains_as_written() -> None:
    _torchao()
    from torchao.float8.float8_linear import Float8Linear

    model = tiny_llama()
    names = fp8.converted_layers(model)
    scope = {"model": model, "batches": [lm_batch(rows=2, length=8)]}
    exec(Plan(weights="bf16", fp8=True).to_code(), scope)  # torch runs float8 matmuls on the CPU too
    converted = [name for name, module in scope["model"].named_modules() if isinstance(module, Float8Linear)]
    assert converted == names and len(names) == 13


def test_a_sharded_estimate_of_fp8_is_refused_saying_to_estimate_one_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    from memlab.errors import MemlabError

    monkeypatch.setattr(fp8, "_torchao_problem", lambda: "")  # refused before torchao is imported
    refused = r"fp8 on a sharded model is not modelled.*estimate fp8 on one GPU \(gpus=1\)"
    with pytest.raises(MemlabError, match=refused):
        memlab.estimate(tiny_llama(), SHAPES, FP8, gpus=2, strategy="fsdp2", gpu="H100-80GB")


def test_the_benchmark_writes_memlabs_differences_beside_the_published_ones(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _torchao()
    import json

    root = Path(__file__).resolve().parents[2]
    monkeypatch.syspath_prepend(str(root))
    from benchmarks import fp8_memory

    result = fp8_memory.main(["--smoke", "--out", str(tmp_path)])
    written = json.loads((tmp_path / "fp8_memory-cpu-smoke.json").read_text())
    assert written["device"]["estimate"] == "cpu, estimate only" and written["versions"]["torchao"]
    assert written["published"]["tensorwise_minus_bf16_gib"] == 0.12
    assert [row["variant"] for row in result["rows"]] == [name for name, _ in fp8_memory.VARIANTS]
    assert all(row["fp8"]["status"] == "ok" and "fp8_minus_bf16_peak_gib" in row for row in result["rows"])


@pytest.mark.parametrize("checkpointing", [False, True])
def test_the_estimate_carried_from_three_layers_is_every_layers_dry_run(
        checkpointing: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    _torchao()
    import dataclasses

    from transformers import LlamaConfig

    import memlab.estimation.dryrun.single_gpu as single_gpu

    config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=5, num_attention_heads=2,
                         num_key_value_heads=2, vocab_size=128, max_position_embeddings=64)
    plan = FP8.replace(checkpointing=checkpointing)
    tried: list[bool] = []
    real = single_gpu.carried_trial
    monkeypatch.setattr(single_gpu, "carried_trial", lambda *a, **k: tried.append(
        (result := real(*a, **k)) is not None) or result)
    carried = single_gpu.estimate_plans(config, SHAPES, [plan], device="cuda", gpu=GPUS["H100-80GB"])[0]
    assert tried == [True], "carried from three layers"
    monkeypatch.setattr(single_gpu, "shallow_model", lambda _: None)  # every layer dry-run
    whole = single_gpu.estimate_plans(config, SHAPES, [plan], device="cuda", gpu=GPUS["H100-80GB"])[0]
    assert carried.status == whole.status == "ok", (carried.error, whole.error)
    for field in dataclasses.fields(whole):
        if field.name != "timeline":
            assert getattr(carried, field.name) == getattr(whole, field.name), field.name
