"""The accelerate config goes through accelerate's own launcher and plugin classes; DeepSpeed's parser takes the
ZeRO configs."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from memlab import Plan
from memlab.errors import MemlabError
from memlab.export.accelerate import accelerate_config, accelerate_script, fsdp2_torch_script


def _launch_args(config: dict[str, Any], tmp_path: Path) -> tuple[Any, Any, bool]:
    """What ``accelerate launch --config_file <config> train.py`` makes of the config, before it launches."""
    from accelerate.commands.config.config_args import ClusterConfig, load_config_from_file
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser

    path = tmp_path / "memlab_accelerate.yaml"
    path.write_text(yaml.safe_dump(config))
    assert isinstance(load_config_from_file(str(path)), ClusterConfig)
    args = launch_command_parser().parse_args(["--config_file", str(path), "train.py"])
    return _validate_launch_command(args)


@pytest.mark.parametrize(
    "plan",
    [Plan(checkpointing=True, precision="bf16", offload="optimizer"), Plan(), Plan(precision="fp16")],
    ids=lambda p: p.label(),
)
def test_fsdp2_config_gives_the_intended_plugin(plan: Plan, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from accelerate.utils import FullyShardedDataParallelPlugin
    from accelerate.utils.launch import prepare_multi_gpu_env
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy

    config = plan.to_accelerate_config(gpus=8, strategy="fsdp2", layer_classes=["LlamaDecoderLayer"])
    args, _, _ = _launch_args(config, tmp_path)
    env = prepare_multi_gpu_env(args)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert env["ACCELERATE_MIXED_PRECISION"] == {"fp32": "no"}.get(plan.precision, plan.precision)
    assert args.num_processes == 8
    plugin = FullyShardedDataParallelPlugin()
    if env["ACCELERATE_MIXED_PRECISION"] != "no":
        plugin.set_mixed_precision(env["ACCELERATE_MIXED_PRECISION"])  # what Accelerator() does with it
    assert plugin.fsdp_version == 2
    assert plugin.reshard_after_forward is True
    assert plugin.auto_wrap_policy.__name__ == "transformer_auto_wrap_policy"
    assert plugin.transformer_cls_names_to_wrap == ["LlamaDecoderLayer"]
    assert plugin.activation_checkpointing is plan.checkpointing
    assert isinstance(plugin.cpu_offload, CPUOffloadPolicy) is plan.offloads_optimizer
    policy = plugin.mixed_precision_policy
    if plan.precision == "fp32":
        assert policy is None or getattr(policy, "param_dtype", None) is None
    else:
        import torch

        assert isinstance(policy, MixedPrecisionPolicy)
        assert policy.param_dtype == {"bf16": torch.bfloat16, "fp16": torch.float16}[plan.precision]


def test_zero_config_gives_the_deepspeed_plugin(tmp_path: Path) -> None:
    from accelerate.utils.launch import prepare_deepspeed_cmd_env

    config = Plan(precision="bf16", offload="all", accumulation=4).to_accelerate_config(gpus=8, strategy="zero3")
    args, defaults, mixed_from_config = _launch_args(config, tmp_path)
    args.deepspeed_fields_from_accelerate_config = ",".join(
        [*defaults.deepspeed_config, *(["mixed_precision"] if mixed_from_config else [])]
    )
    _, env = prepare_deepspeed_cmd_env(args)
    assert env["ACCELERATE_DEEPSPEED_ZERO_STAGE"] == "3"
    assert env["ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE"] == "cpu"
    assert env["ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE"] == "cpu"
    assert env["ACCELERATE_MIXED_PRECISION"] == "bf16"
    two = accelerate_config(Plan(offload="all"), gpus=2, strategy="zero2")["deepspeed_config"]
    assert two["zero_stage"] == 2 and two["offload_param_device"] == "none"  # ZeRO-2 cannot offload parameters


def _deepspeed_parse(config: dict[str, Any]) -> Any:
    from deepspeed.runtime.config import DeepSpeedConfig

    return DeepSpeedConfig(config)  # no process group here: DeepSpeed takes world size 1


@pytest.mark.needs("deepspeed")
def test_deepspeed_parser_takes_to_deepspeed() -> None:
    for plan in (Plan(micro_batch=2, accumulation=4, precision="bf16", offload="optimizer"),
                 Plan(micro_batch=1, precision="fp16"), Plan(micro_batch=1, optimizer="adamw8bit")):
        parsed = _deepspeed_parse(plan.to_deepspeed())
        assert parsed.zero_optimization_stage == 2
        assert parsed.train_batch_size == plan.micro_batch * plan.accumulation
        assert parsed.bfloat16_config.enabled is (plan.precision == "bf16")
        assert parsed.float16_config.enabled is (plan.precision == "fp16")


@pytest.mark.needs("deepspeed")
def test_deepspeed_parser_takes_the_zero3_accelerate_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from accelerate.utils import DeepSpeedPlugin
    from accelerate.utils.launch import prepare_deepspeed_cmd_env

    plan = Plan(micro_batch=2, accumulation=4, precision="bf16", offload="optimizer")
    args, defaults, mixed_from_config = _launch_args(plan.to_accelerate_config(gpus=8, strategy="zero3"), tmp_path)
    args.deepspeed_fields_from_accelerate_config = ",".join(
        [*defaults.deepspeed_config, *(["mixed_precision"] if mixed_from_config else [])]
    )
    _, env = prepare_deepspeed_cmd_env(args)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    plugin = DeepSpeedPlugin()
    plugin.set_mixed_precision(env["ACCELERATE_MIXED_PRECISION"])
    # What Accelerator.prepare fills in for the "auto" entries (world size 1: no process group in this test).
    plugin.deepspeed_config_process(
        must_match=False, train_micro_batch_size_per_gpu=2, train_batch_size=2 * 4, gradient_clipping=1.0
    )
    parsed = _deepspeed_parse(plugin.deepspeed_config)
    assert parsed.zero_optimization_stage == 3
    assert parsed.gradient_accumulation_steps == 4
    assert parsed.bfloat16_config.enabled
    assert str(parsed.zero_config.offload_optimizer.device).endswith("cpu")


def test_scripts_carry_the_levers() -> None:
    script = accelerate_script(Plan(accumulation=8, optimizer="adamw8bit", weights="bf16", offload="activations"))
    compile(script, "train.py", "exec")
    assert "gradient_accumulation_steps=8" in script
    assert "bnb.optim.AdamW8bit" in script
    assert "dtype=torch.bfloat16" in script
    assert "save_on_cpu" in script
    torch_script = fsdp2_torch_script(Plan(checkpointing=True, precision="bf16"), model_code="m()", batch_code="b()")
    assert "gradient_checkpointing_enable" in torch_script and "param_dtype=torch.bfloat16" in torch_script
    lora_script = fsdp2_torch_script(Plan(adapter="lora"), model_code="m()", batch_code="b()")
    assert "get_peft_model" in lora_script  # the adapters before fully_shard
    with pytest.raises(MemlabError, match="fsdp2_torch_script covers"):
        fsdp2_torch_script(Plan(adapter="qlora"), model_code="m()", batch_code="b()")


def test_bad_sharding_says_what_to_write() -> None:
    with pytest.raises(MemlabError, match='write strategy="fsdp2"'):
        Plan().to_accelerate_config(gpus=8, strategy="none")
    with pytest.raises(MemlabError, match="write one of"):
        Plan().to_accelerate_config(gpus=8, strategy="zero1")
    with pytest.raises(MemlabError, match="write an int >= 1"):
        Plan().to_accelerate_config(gpus=0)
    assert os.environ.get("ACCELERATE_USE_FSDP") is None
