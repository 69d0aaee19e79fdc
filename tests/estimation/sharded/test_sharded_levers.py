"""Issue 47: every single-GPU lever the engines support, estimated sharded under every strategy (FSDP1, FSDP2,
ZeRO-2, ZeRO-3), the user's load= included, and parameter offload; each estimate's notes name the engine settings
it assumed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import yaml

import memlab
from memlab import Plan
from memlab.errors import MemlabError
from memlab.estimation.request import EstimateRequest
from memlab.estimation.routes import route_name

STRATEGIES = ("fsdp1", "fsdp2", "zero2", "zero3")
SHAPES = {"input_ids": (2, 32), "labels": (2, 32)}


def config() -> object:
    from transformers import LlamaConfig

    return LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                       num_key_value_heads=2, vocab_size=256)


LEVERS = {
    "lora": Plan(adapter="lora", lora_rank=4, precision="bf16"),
    "qlora": Plan(adapter="qlora", lora_rank=4, precision="bf16", checkpointing=True),
    "pure_bf16": Plan(weights="bf16"),
    "selective_checkpointing": Plan(checkpointing=1, precision="bf16"),
    "chunked_loss": Plan(loss="chunked"),
    "optimizer_offload": Plan(offload="optimizer"),
    "params_offload": Plan(offload="params"),
}


def estimate(plan: Plan, strategy: str, gpus: int = 2, **keywords: object) -> memlab.Trial:
    # Several tests ask for the same estimate (a lever's own test and a comparison's): each is made once.
    return _estimate(plan, strategy, gpus, repr(sorted(keywords.items())), keywords)


_ESTIMATES: dict[tuple[Plan, str, int, str], memlab.Trial] = {}


def _estimate(plan: Plan, strategy: str, gpus: int, key: str, keywords: dict[str, object]) -> memlab.Trial:
    if (plan, strategy, gpus, key) not in _ESTIMATES:
        trial = memlab.estimate(config(), SHAPES, plan, gpus=gpus, strategy=strategy, **keywords)  # type: ignore[arg-type]
        assert trial.status == "ok", trial.error
        assert sum(trial.breakdown.values()) == trial.peak_bytes
        _ESTIMATES[plan, strategy, gpus, key] = trial
    return _ESTIMATES[plan, strategy, gpus, key]


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("lever", list(LEVERS))
def test_each_lever_is_estimated_under_each_strategy_and_names_its_engine_settings(lever: str, strategy: str) -> None:
    plan = LEVERS[lever]
    trial = estimate(plan, strategy)
    assert trial.strategy == strategy and trial.gpus == 2  # type: ignore[attr-defined]
    settings = [note for note in trial.notes if note.startswith("engine settings assumed:")]
    assert len(settings) == 1, trial.notes
    if lever == "qlora":
        assert "bnb_4bit_quant_storage=bf16" in settings[0]
    if lever == "params_offload":
        assert trial.host_bytes > 0  # type: ignore[attr-defined]
        assert ("offload_params=True" if strategy.startswith("fsdp") else "offload") in settings[0]
    if strategy == "fsdp1":
        assert "fsdp_version 1" in settings[0] and "limit_all_gathers" in settings[0]


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_adapters_hold_less_than_a_full_fine_tune_and_qlora_less_than_lora(strategy: str) -> None:
    full = estimate(Plan(precision="bf16", checkpointing=True), strategy)
    lora = estimate(Plan(adapter="lora", lora_rank=4, precision="bf16", checkpointing=True), strategy,
                    load={"dtype": torch.bfloat16})
    qlora = estimate(Plan(adapter="qlora", lora_rank=4, precision="bf16", checkpointing=True), strategy)
    assert qlora.breakdown["params"] < lora.breakdown["params"]
    assert lora.breakdown["optimizer"] < full.breakdown["optimizer"] / 10
    assert lora.peak_bytes < full.peak_bytes


@pytest.mark.parametrize("strategy", ("fsdp1", "fsdp2", "zero3"))
def test_more_gpus_hold_less_per_gpu_for_adapters_too(strategy: str) -> None:
    plan = Plan(adapter="lora", lora_rank=4, precision="bf16")
    two, eight = (estimate(plan, strategy, gpus=n, load={"dtype": torch.bfloat16}) for n in (2, 8))
    assert eight.peak_bytes < two.peak_bytes


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_parameter_offload_holds_no_more_than_optimizer_offload(strategy: str) -> None:
    none, optimizer, params = (estimate(Plan(offload=o), strategy) for o in ("none", "optimizer", "params"))
    assert params.peak_bytes <= optimizer.peak_bytes < none.peak_bytes
    if strategy == "zero3":
        assert params.peak_bytes < optimizer.peak_bytes
        assert params.breakdown["params"] < optimizer.breakdown["params"]


def test_parameter_offload_on_one_gpu_says_what_to_write() -> None:
    with pytest.raises(MemlabError, match="on one GPU write offload='optimizer'"):
        memlab.estimate(config(), SHAPES, Plan(offload="params"))
    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    with pytest.raises(MemlabError, match="needs training sharded over GPUs"):
        memlab.measure(model, torch.randn(2, 4), Plan(offload="params"), loss_fn=lambda m, b: m(b).sum(), steps=1,
                       noise=0)
    with pytest.raises(MemlabError, match="needs FSDP or ZeRO-3"):
        Plan(offload="params").to_code()


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_the_users_load_reaches_the_sharded_route(strategy: str) -> None:
    fp32 = estimate(Plan(precision="bf16"), strategy)
    bf16 = estimate(Plan(precision="bf16"), strategy, load={"dtype": torch.bfloat16})
    # accelerate upcasts trained 16-bit weights to fp32 under mixed precision (FSDP2: fsdp2_prepare_model, FSDP1:
    # Accelerator.prepare_model), and DeepSpeed's bf16 mode holds 16-bit weights and fp32 masters, whatever the load
    assert bf16.breakdown["params"] == fp32.breakdown["params"]
    if strategy.startswith("fsdp"):
        assert any("accelerate upcasts the trained weights to fp32" in note for note in bf16.notes), bf16.notes
    assert any("dtype=torch.bfloat16" in note for note in bf16.notes), bf16.notes
    four_bit = estimate(Plan(adapter="lora", lora_rank=4, precision="bf16"), strategy,
                        load={"quantization_config": {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4",
                                                      "bnb_4bit_compute_dtype": "bfloat16",
                                                      "bnb_4bit_quant_storage": "bfloat16"}})
    lora = estimate(Plan(adapter="lora", lora_rank=4, precision="bf16"), strategy, load={"dtype": torch.bfloat16})
    assert four_bit.breakdown["params"] < lora.breakdown["params"]
    assert any("load_in_4bit=True" in note for note in four_bit.notes), four_bit.notes


def test_every_route_takes_the_request() -> None:
    assert route_name(EstimateRequest(config(), SHAPES, Plan(), gpus=2, strategy="fsdp1")) == "sharded"
    assert route_name(EstimateRequest(config(), SHAPES, memlab.InferencePlan())) == "inference"
    assert route_name(EstimateRequest(config(), SHAPES, Plan())) == "one_gpu"


@pytest.mark.parametrize("plan", [LEVERS["lora"], LEVERS["qlora"], LEVERS["params_offload"],
                                  LEVERS["selective_checkpointing"], Plan(precision="bf16", checkpointing=True)],
                         ids=lambda plan: plan.label())
@pytest.mark.parametrize("strategy", ("fsdp1", "fsdp2", "zero3"))
def test_accelerates_own_loader_reads_every_sharded_config(plan: Plan, strategy: str, tmp_path: Path) -> None:
    pytest.importorskip("accelerate")
    from accelerate.commands.config.config_args import ClusterConfig, load_config_from_file

    config_dict = plan.to_accelerate_config(gpus=4, strategy=strategy)
    path = tmp_path / "accelerate.yaml"
    path.write_text(yaml.safe_dump(config_dict))
    loaded = load_config_from_file(str(path))
    assert isinstance(loaded, ClusterConfig) and loaded.num_processes == 4
    if strategy == "fsdp1":
        assert loaded.fsdp_config["fsdp_version"] == 1
        assert loaded.fsdp_config["fsdp_sharding_strategy"] == "FULL_SHARD"
    if plan.offload == "params":
        section = loaded.fsdp_config if strategy.startswith("fsdp") else loaded.deepspeed_config
        assert section.get("fsdp_offload_params") is True or section.get("offload_param_device") == "cpu"


def test_zero2_refuses_parameter_offload_in_its_accelerate_config() -> None:
    with pytest.raises(MemlabError, match="write strategy='zero3'"):
        Plan(offload="params").to_accelerate_config(gpus=2, strategy="zero2")


def test_the_command_line_estimates_every_sharded_lever(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from memlab.frontends.cli.main import main

    config().save_pretrained(tmp_path)  # type: ignore[attr-defined]
    assert main(["estimate", str(tmp_path), "--batch", "2x32", "--device", "cpu", "--gpus", "2", "--strategy",
                 "fsdp1", "--try", "adapter=lora,qlora", "offload=none,params", "--dtype", "bf16"]) == 0
    # The answer's table: a row per plan, its strategy and number of GPUs in their columns (issue 61's layout).
    lines = [line for line in capsys.readouterr().out.splitlines() if re.search(r"\bfsdp1\s+2\s", line)]
    assert len(lines) == 4 and all("error" not in line for line in lines), lines
    assert main(["estimate", str(tmp_path), "--batch", "2x32", "--device", "cpu", "--gpus", "auto", "--budget",
                 "4MiB", "--strategy", "zero3", "--try", "adapter=qlora", "checkpointing=1"]) in (0, 1)
    out = capsys.readouterr().out
    assert "zero3" in out and "qlora" in out, out


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("offload", ("none", "optimizer", "params"))
def test_a_users_accelerate_config_reads_back_as_the_strategy_and_offload(strategy: str, offload: str,
                                                                          tmp_path: Path) -> None:
    from memlab.export.accelerate import sharding_from_accelerate

    plan = Plan(offload=offload, precision="bf16")
    if strategy == "zero2" and offload == "params":
        return  # refused (test_zero2_refuses_parameter_offload_in_its_accelerate_config)
    path = tmp_path / "accelerate.yaml"
    path.write_text(yaml.safe_dump(plan.to_accelerate_config(gpus=4, strategy=strategy)))
    read = sharding_from_accelerate(path)
    # FSDP's one CPU offload is the parameters' (offload_params): optimizer offload reads back as it
    expected = "params" if strategy.startswith("fsdp") and offload != "none" else offload
    assert read == {"gpus": 4, "strategy": strategy, "offload": expected}
    with pytest.raises(MemlabError, match="write distributed_type: FSDP or DEEPSPEED"):
        sharding_from_accelerate({"distributed_type": "MULTI_GPU", "num_processes": 2})
