"""Plans exported to TrainingArguments keywords, DeepSpeed configs and a plain PyTorch loop that really runs.

transformers 5.23 on a machine without CUDA refuses ``bf16=True`` unless ``use_cpu=True`` is passed too ("Your
setup doesn't support bf16/gpu"), and accepts ``fp16=True``; so the TrainingArguments checks pass
``use_cpu=True`` wherever CUDA is missing. The plan itself never decides the device, so the exported keywords
leave ``use_cpu`` out.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from memlab.errors import MemlabError
from memlab.export import deepspeed_config, pytorch_code, training_arguments
from memlab.plan import OFFLOADS, Plan

transformers = pytest.importorskip("transformers")
# transformers 5.17 (memlab's floor) names checkpointing gradient_checkpointing*; later 5.x activation_checkpointing*.
LEGACY = "activation_checkpointing" not in {f.name for f in dataclasses.fields(transformers.TrainingArguments)}

GRID = [
    Plan(micro_batch=mb, accumulation=acc, checkpointing=ckpt, precision=precision, optimizer=optimizer)
    for mb, acc, ckpt, precision, optimizer in itertools.product(
        (None, 1, 2, 4), (1, 4), (False, True), ("fp32", "bf16", "fp16"), ("adamw", "adamw8bit")
    )
]
# offload="params" is sharded only: the one-process exports refuse it (test_parameter_offload_is_refused_...)
ALL_PLANS = [plan.replace(offload=offload) for plan in GRID[::7] for offload in OFFLOADS if offload != "params"]


def test_parameter_offload_is_refused_by_the_one_process_exports() -> None:
    plan = Plan(offload="params")
    for export in (plan.to_training_arguments, plan.to_deepspeed, plan.to_code):
        with pytest.raises(MemlabError, match="needs FSDP or ZeRO-3; write plan.to_accelerate_config"):
            export()


def _ids(plan: Plan) -> str:
    return plan.label().replace(" ", "_")


# --- TrainingArguments ---------------------------------------------------------------------------------------------


def _accepted(kwargs: dict, tmp_path: Path) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # no deprecated names
        return transformers.TrainingArguments(
            output_dir=str(tmp_path), use_cpu=not torch.cuda.is_available(), report_to="none", **kwargs
        )


# transformers builds TrainingArguments(deepspeed=...) only where deepspeed is installed: the plans that offload the
# optimizer (exported as a DeepSpeed config) are checked apart, where it is.
def test_every_plan_fit_could_return_is_accepted_by_training_arguments(tmp_path: Path) -> None:
    _check_training_arguments([plan for plan in GRID + ALL_PLANS if not plan.offloads_optimizer], tmp_path)


@pytest.mark.needs("deepspeed")
def test_plans_that_offload_the_optimizer_are_accepted_with_deepspeed(tmp_path: Path) -> None:
    _check_training_arguments([plan for plan in GRID + ALL_PLANS if plan.offloads_optimizer], tmp_path)


def _check_training_arguments(plans: list[Plan], tmp_path: Path) -> None:
    assert plans
    for plan in plans:
        if plan.offloads_activations and not plan.checkpointing:
            # The Trainer offloads only checkpointed activations: the export says so rather than drop the lever.
            with pytest.raises(MemlabError, match="write checkpointing=True"):
                plan.to_training_arguments()
            continue
        kwargs = plan.to_training_arguments()
        assert kwargs == training_arguments(plan)
        args = _accepted(kwargs, tmp_path)
        if plan.micro_batch is not None:
            assert args.per_device_train_batch_size == plan.micro_batch
        else:
            assert "per_device_train_batch_size" not in kwargs
        assert args.gradient_accumulation_steps == plan.accumulation
        name = "gradient" if LEGACY else "activation"  # transformers 5.17 (the floor): gradient_checkpointing*
        assert getattr(args, f"{name}_checkpointing") is plan.checkpointing
        assert args.bf16 is (plan.precision == "bf16") and args.fp16 is (plan.precision == "fp16")
        assert args.optim == {"adamw": "adamw_torch_fused", "adamw8bit": "adamw_bnb_8bit"}[plan.optimizer]
        if plan.checkpointing:
            assert getattr(args, f"{name}_checkpointing_kwargs")["use_reentrant"] is False
            assert getattr(args, f"{name}_checkpointing_kwargs").get("offload", False) is plan.offloads_activations
        assert (kwargs.get("deepspeed") == deepspeed_config(plan)) is plan.offloads_optimizer


def test_exported_names_exist_in_the_installed_transformers() -> None:
    fields = {field.name for field in dataclasses.fields(transformers.TrainingArguments)}
    from transformers.training_args import OptimizerNames

    optimizers = {name.value for name in OptimizerNames}
    for plan in ALL_PLANS:
        if plan.offloads_activations and not plan.checkpointing:
            continue  # refused (see above)
        kwargs = training_arguments(plan)
        assert set(kwargs) <= fields
        assert kwargs["optim"] in optimizers


def test_fp16_arguments_without_use_cpu(tmp_path: Path) -> None:
    # transformers 5.23 builds fp16 arguments on a CPU-only machine as well (only bf16 needs use_cpu there)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), report_to="none", **training_arguments(Plan(precision="fp16"))
    )
    assert args.fp16 is True


def test_legacy_names_for_older_transformers(tmp_path: Path) -> None:
    plan = Plan(micro_batch=2, checkpointing=True)
    kwargs = training_arguments(plan, legacy_names=True)
    assert kwargs["gradient_checkpointing"] is True
    assert kwargs["gradient_checkpointing_kwargs"] == {"use_reentrant": False}
    # transformers 5.17 (memlab's floor) offloads the checkpointed activations under the older names (issue 58: the
    # export refused it, saying "transformers before 5")
    offloaded = training_arguments(plan.replace(offload="activations"), legacy_names=True)
    assert offloaded["gradient_checkpointing_kwargs"] == {"use_reentrant": False, "offload": True}
    assert "activation_checkpointing_kwargs" not in offloaded
    assert "activation_checkpointing" not in kwargs
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # the deprecated alias still works in 5.x
        args = transformers.TrainingArguments(output_dir=str(tmp_path), report_to="none", **kwargs)
    assert args.gradient_checkpointing is True and getattr(args, "activation_checkpointing", True) is True
    assert training_arguments(Plan(), legacy_names=False)["activation_checkpointing"] is False


# --- DeepSpeed -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("plan", ALL_PLANS, ids=_ids)
def test_deepspeed_config_is_json_and_has_the_expected_keys(plan: Plan) -> None:
    config = plan.to_deepspeed()
    assert json.loads(json.dumps(config)) == config
    assert config["zero_optimization"]["stage"] == 2
    assert config["gradient_accumulation_steps"] == plan.accumulation
    assert config["train_micro_batch_size_per_gpu"] == (plan.micro_batch if plan.micro_batch else "auto")
    if plan.offloads_optimizer:
        assert config["zero_optimization"]["offload_optimizer"] == {"device": "cpu", "pin_memory": True}
    else:
        assert "offload_optimizer" not in config["zero_optimization"]
    if plan.offloads_activations:
        assert config["activation_checkpointing"]["cpu_checkpointing"] is True
    else:
        assert "activation_checkpointing" not in config
    assert ("bf16" in config) is (plan.precision == "bf16")
    assert ("fp16" in config) is (plan.precision == "fp16")
    if plan.precision == "bf16":
        assert config["bf16"] == {"enabled": True}
    if plan.precision == "fp16":
        assert config["fp16"]["enabled"] is True and config["fp16"]["loss_scale"] == 0
    if plan.optimizer == "adamw8bit":
        assert "optimizer" not in config
        assert "bitsandbytes" in config["_comment"]
        assert config["zero_allow_untested_optimizer"] is True
        assert ("zero_force_ds_cpu_optimizer" in config) is plan.offloads_optimizer
    else:
        assert config["optimizer"]["type"] == "AdamW"
    for absent in ("gradient_clipping", "scheduler", "train_batch_size"):
        assert absent not in config


def test_deepspeed_comment_when_activations_are_offloaded_without_checkpointing() -> None:
    only = "offloads only checkpointed activations"
    assert only in deepspeed_config(Plan(offload="activations"))["_comment"]
    assert only not in deepspeed_config(Plan(checkpointing=True, offload="activations"))["_comment"]


# --- plain PyTorch -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("plan", GRID + ALL_PLANS, ids=_ids)
def test_pytorch_code_compiles(plan: Plan) -> None:
    code = plan.to_code()
    assert code == pytorch_code(plan)
    compile(code, plan.label(), "exec")
    assert plan.label() in code.splitlines()[0]
    assert ("torch.autocast" in code) is (plan.precision != "fp32")
    assert ("GradScaler" in code) is (plan.precision == "fp16")
    assert ("checkpointing_enable" in code) is plan.checkpointing
    assert ("AdamW8bit" in code) is (plan.optimizer == "adamw8bit")
    assert ("save_on_cpu" in code) is plan.offloads_activations
    assert ("cpu_params" in code) is plan.offloads_optimizer


def _tiny_gpt2() -> torch.nn.Module:
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=32)
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config)


def _run(plan: Plan, batches: list[dict[str, torch.Tensor]], model: torch.nn.Module | None = None) -> tuple:
    model = model if model is not None else _tiny_gpt2()
    namespace: dict = {"model": model, "batches": batches}
    exec(compile(plan.to_code(), plan.label(), "exec"), namespace)
    return model, namespace


def _batch(rows: int) -> dict[str, torch.Tensor]:
    ids = torch.randint(0, 100, (rows, 16), generator=torch.Generator().manual_seed(rows))
    return {"input_ids": ids, "labels": ids}


@pytest.mark.parametrize(
    "plan",
    [
        Plan(),
        Plan(micro_batch=2, accumulation=2, checkpointing=True),
        Plan(accumulation=2, precision="bf16"),
        Plan(micro_batch=1, accumulation=4, precision="fp16", offload="all"),
    ],
    ids=_ids,
)
def test_pytorch_code_runs_on_a_tiny_gpt2(plan: Plan) -> None:
    before = _tiny_gpt2().state_dict()
    model, namespace = _run(plan, [_batch(4), _batch(4)])
    after = model.state_dict()
    assert any(not torch.equal(before[key], after[key]) for key in before)  # it trained
    assert all(p.grad is None for p in model.parameters())  # every step ended with zero_grad
    assert torch.isfinite(namespace["loss"])
    assert model.training
    assert getattr(model, "is_activation_checkpointing", model.is_gradient_checkpointing) is plan.checkpointing


def _summed_gradients(plan: Plan, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    config = transformers.GPT2Config(
        n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=32, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0
    )
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config)
    sums: dict[str, torch.Tensor] = {}

    def hook(name: str):  # every backward's contribution, before zero_grad clears .grad
        def add(grad: torch.Tensor) -> None:
            sums[name] = sums[name] + grad if name in sums else grad.clone()

        return add

    for name, parameter in model.named_parameters():
        parameter.register_hook(hook(name))
    _run(plan, [batch], model)
    return sums


def test_pytorch_code_accumulation_gives_the_full_batch_gradient() -> None:
    batch = _batch(4)
    full = _summed_gradients(Plan(), batch)
    sliced = _summed_gradients(Plan(micro_batch=2, accumulation=2, checkpointing=True), batch)
    uneven = _summed_gradients(Plan(micro_batch=1, accumulation=4), batch)
    assert full.keys() == sliced.keys() == uneven.keys() and full
    for name in full:
        torch.testing.assert_close(sliced[name], full[name], rtol=1e-4, atol=1e-6, msg=name)
        torch.testing.assert_close(uneven[name], full[name], rtol=1e-4, atol=1e-6, msg=name)


def test_pytorch_code_with_8bit_adam_runs() -> None:
    pytest.importorskip("bitsandbytes")
    model, namespace = _run(Plan(micro_batch=2, accumulation=2, optimizer="adamw8bit"), [_batch(4)])
    assert type(namespace["optimizer"]).__name__ == "AdamW8bit"


def test_adapter_plans_export_a_lora_config_and_code_that_builds_them() -> None:
    pytest.importorskip("peft")
    plan = Plan(adapter="qlora", lora_rank=8, weights="bf16")
    config = plan.to_peft_config()
    assert (config.r, config.lora_alpha, config.lora_dropout, config.target_modules) == (8, 16, 0.0, "all-linear")
    code = plan.to_code()
    compile(code, "<plan>", "exec")
    assert "get_peft_model" in code and "BitsAndBytesConfig" in code and "model.to(torch.bfloat16)" in code
    with pytest.raises(MemlabError, match="needs adapter='lora' or 'qlora'"):
        Plan().to_peft_config()


# --- issue 15's levers: Adafactor, paged 8-bit AdamW, fused AdamW, the chunked loss ---------------------------------

NEW_LEVERS = [
    Plan(optimizer="adafactor"),
    Plan(micro_batch=1, accumulation=4, checkpointing=True, precision="fp16", optimizer="adafactor"),
    Plan(optimizer="paged_adamw8bit", offload="optimizer"),
    Plan(loss="chunked"),
    Plan(micro_batch=2, accumulation=2, optimizer="adafactor", loss="chunked", offload="all"),
]


def test_memlabs_adamw_is_what_the_trainer_builds_when_nothing_is_said(tmp_path: Path) -> None:
    from transformers.training_args import OptimizerNames

    assert training_arguments(Plan())["optim"] == "adamw_torch_fused"
    default = transformers.TrainingArguments(output_dir=str(tmp_path), report_to="none").optim
    assert default == OptimizerNames.ADAMW_TORCH_FUSED


@pytest.mark.parametrize(
    "plan",
    [pytest.param(p, marks=pytest.mark.needs("deepspeed") if p.offloads_optimizer else ()) for p in NEW_LEVERS],
    ids=_ids,
)
def test_new_levers_export_the_trainers_own_names(plan: Plan, tmp_path: Path) -> None:
    from transformers.training_args import OptimizerNames

    names = {
        "adamw": OptimizerNames.ADAMW_TORCH_FUSED,
        "adafactor": OptimizerNames.ADAFACTOR,
        "paged_adamw8bit": OptimizerNames.PAGED_ADAMW_8BIT,
    }
    if plan.offloads_activations and not plan.checkpointing:
        with pytest.raises(MemlabError, match="only checkpointed activations"):
            training_arguments(plan)
        plan = plan.replace(checkpointing=True)
    kwargs = training_arguments(plan)
    args = _accepted(kwargs, tmp_path)
    assert args.optim == names[plan.optimizer]
    assert args.use_liger_kernel is (plan.loss == "chunked")
    if plan.loss == "chunked":
        config = args.liger_kernel_config
        assert config["fused_linear_cross_entropy"] is True
        assert not any(value for key, value in config.items() if key != "fused_linear_cross_entropy")


@pytest.mark.parametrize("plan", NEW_LEVERS, ids=_ids)
def test_deepspeed_leaves_adafactor_and_paged_adam_to_the_user_and_says_so(plan: Plan) -> None:
    config = plan.to_deepspeed()
    assert json.loads(json.dumps(config)) == config
    if plan.optimizer == "adamw":
        assert config["optimizer"]["type"] == "AdamW"
    else:
        assert "optimizer" not in config and config["zero_allow_untested_optimizer"] is True
        assert {"adafactor": "Adafactor", "paged_adamw8bit": "PagedAdamW8bit"}[plan.optimizer] in config["_comment"]
    assert ("chunked loss is not a DeepSpeed setting" in config.get("_comment", "")) is (plan.loss == "chunked")


@pytest.mark.parametrize("plan", NEW_LEVERS, ids=_ids)
def test_pytorch_code_of_the_new_levers_runs(plan: Plan) -> None:
    if plan.optimizer == "paged_adamw8bit":
        pytest.importorskip("bitsandbytes")
    before = _tiny_gpt2().state_dict()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # bitsandbytes: "paged optimizers are not supported on CPU"
        model, namespace = _run(plan, [_batch(4), _batch(4)])
    after = model.state_dict()
    assert any(not torch.equal(before[key], after[key]) for key in before)
    assert torch.isfinite(namespace["loss"])
    kind = {"adafactor": "Adafactor", "paged_adamw8bit": "PagedAdamW8bit", "adamw": "AdamW"}[plan.optimizer]
    assert type(namespace["optimizer"]).__name__ == kind
    if plan.optimizer == "adamw":
        assert namespace["optimizer"].defaults["fused"] is True


def test_pytorch_code_chunked_loss_gives_the_full_loss_gradient() -> None:
    batch = _batch(4)
    batch["labels"] = batch["labels"].clone()
    batch["labels"][:, :3] = -100
    full = _summed_gradients(Plan(), batch)
    chunked = _summed_gradients(Plan(loss="chunked"), batch)
    assert full.keys() == chunked.keys() and full
    for name in full:
        torch.testing.assert_close(chunked[name], full[name], rtol=1e-4, atol=1e-6, msg=name)
