"""issue 60, the user's activation-offloading flags: transformers' ``gradient_checkpointing_kwargs={"offload": True}``
(``activation_checkpointing_kwargs`` in 5.x) and TRL's ``activation_offloading=True`` read as memlab's
``offload="activations"``, measured and estimated as the trainer runs, and exported back to those flags.

On this CPU-only machine neither flag can train: transformers' offload asks for pinned memory ("pin_memory=True
requires a CUDA or other accelerator backend") and TRL's ``OffloadActivations`` reads
``torch.accelerator.current_accelerator().type``, which is None here, as the SFTTrainer is built. The TRL trainers
below are built with TRL's context manager stood in by a no-op (the config keeps ``activation_offloading=True``, as
the user wrote it); on a CPU offload moves nothing, and memlab's trial says so. A CUDA estimate of the same
trainers keeps the trainer's plan and says that memlab's estimate does not model offload on fake tensors. Tiny
Llamas."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest

pytest.importorskip("trl")
import trl  # noqa: E402
from datasets import Dataset  # noqa: E402
from test_trainer_contract import arguments, llama, pad, rows, tokenizer  # noqa: E402
from test_trainer_dpo import preferences  # noqa: E402
from transformers import Trainer, TrainingArguments  # noqa: E402

import memlab  # noqa: E402
from memlab import Plan  # noqa: E402
from memlab.techniques.offload import NOTHING_TO_MOVE, OFFLOAD_ESTIMATED  # noqa: E402

FAST: dict[str, Any] = {"steps": 1, "warmup": 0, "noise": 0, "progress": False}


@pytest.fixture
def trl_offload_stood_in(monkeypatch: pytest.MonkeyPatch) -> None:
    """TRL's activation-offloading context cannot be made without an accelerator: a no-op in its place, so that an
    SFTTrainer/DPOTrainer with ``activation_offloading=True`` can be built on this CPU."""
    for module in (trl.trainer.sft_trainer, trl.trainer.dpo_trainer):
        monkeypatch.setattr(module, "get_act_offloading_ctx_manager", lambda model, **_: StoodIn())


class StoodIn(contextlib.AbstractContextManager):
    """TRL's offloading context as a CPU-only machine could have it: nothing to move."""

    def __exit__(self, *exc: object) -> None:
        return None


def hf_trainer(tmp_path: Any, offload: bool = True, **settings: Any) -> Trainer:
    args = arguments(tmp_path, gradient_checkpointing=True, gradient_checkpointing_kwargs={"offload": offload},
                     **settings)
    return Trainer(model=llama(), args=args, train_dataset=Dataset.from_list(rows()), data_collator=pad)


def sft_trainer(tmp_path: Any, **settings: Any) -> trl.SFTTrainer:
    settings = {"gradient_checkpointing": False, "bf16": False, "per_device_train_batch_size": 2, **settings}
    config = trl.SFTConfig(output_dir=str(tmp_path), report_to=[], use_cpu=True, save_strategy="no", max_steps=1,
                           disable_tqdm=True, **settings)
    return trl.SFTTrainer(model=llama(), args=config, train_dataset=Dataset.from_list(rows()),
                          processing_class=tokenizer())


def test_trl_configs_with_activation_offloading_read_as_offloaded_activations(tmp_path: Any) -> None:
    for config in (trl.SFTConfig, trl.DPOConfig):
        common = dict(output_dir=str(tmp_path), report_to=[], use_cpu=True, per_device_train_batch_size=2,
                      activation_offloading=True)
        alone = config(**common, gradient_checkpointing=False, bf16=False)
        assert Plan.from_training_arguments(alone) == Plan(micro_batch=2, offload="activations"), config.__name__
        # TRL's defaults (SFTConfig: checkpointing on, bf16) with the flag
        defaults = Plan.from_training_arguments(config(**common))
        assert defaults.offload == "activations", config.__name__
        off = Plan.from_training_arguments(config(**{**common, "activation_offloading": False}))
        assert defaults == off.replace(offload="activations"), config.__name__


@pytest.mark.parametrize("setup", ["trainer", "sft"])
def test_offloading_trainers_measured_and_estimated_as_set_up(tmp_path: Any, setup: str,
                                                              trl_offload_stood_in: None) -> None:
    """The must-show: the trainer as set up (plan=None) measured and estimated within 5%, offloaded."""
    if setup == "trainer":
        trainer: Any = hf_trainer(tmp_path)
        expected = Plan(micro_batch=2, checkpointing=True, offload="activations")
    else:
        trainer = sft_trainer(tmp_path, activation_offloading=True)
        expected = Plan(micro_batch=2, offload="activations")
    assert Plan.from_trainer(trainer) == expected
    measured = memlab.measure(trainer, **FAST)
    assert measured.status == "ok", measured.error
    assert measured.plan == expected and NOTHING_TO_MOVE in measured.notes
    estimated = memlab.estimate(trainer)
    assert estimated.status == "ok" and estimated.plan == expected
    assert abs(estimated.peak_bytes - measured.peak_bytes) <= 0.05 * measured.peak_bytes
    # A CUDA estimate keeps the plan the trainer runs, and says how its offload's host side is modelled.
    gpu = memlab.estimate(trainer, device="cuda")
    assert gpu.status == "ok" and gpu.plan == expected
    assert OFFLOAD_ESTIMATED in gpu.notes


def test_dpo_trainer_with_activation_offloading_is_read(tmp_path: Any, trl_offload_stood_in: None) -> None:
    config = trl.DPOConfig(output_dir=str(tmp_path), report_to=[], use_cpu=True, save_strategy="no", max_steps=1,
                           per_device_train_batch_size=2, disable_tqdm=True, activation_offloading=True, bf16=False)
    trainer = trl.DPOTrainer(model=llama(), ref_model=llama(), args=config, train_dataset=preferences(),
                             processing_class=tokenizer())
    # DPOConfig checkpoints by default; the flag adds the offload
    assert Plan.from_trainer(trainer) == Plan(micro_batch=2, checkpointing=True, offload="activations")


@pytest.mark.parametrize("plan", [Plan(micro_batch=2, offload="activations"),
                                  Plan(micro_batch=2, checkpointing=True, offload="activations"),
                                  Plan(micro_batch=1, accumulation=2, precision="bf16", offload="activations")],
                         ids=lambda plan: plan.label())
def test_activation_offload_plans_round_trip_through_a_trl_config(tmp_path: Any, plan: Plan,
                                                                 trl_offload_stood_in: None) -> None:
    kwargs = plan.to_training_arguments(trl=True)
    assert kwargs["activation_offloading"] is True
    assert "offload" not in (kwargs.get("activation_checkpointing_kwargs") or {})  # TRL's flag carries it alone
    trainer = sft_trainer(tmp_path, **kwargs)
    assert Plan.from_trainer(trainer) == plan
    # Without trl=True the Trainer's own form: offload only under checkpointing, refused without it.
    if plan.checkpointing:
        hf = plan.to_training_arguments()
        # transformers 5.24 spells it activation_checkpointing_kwargs; 5.17 (the floor) gradient_checkpointing_kwargs
        spelled = [key for key in ("activation_checkpointing_kwargs", "gradient_checkpointing_kwargs") if key in hf]
        assert len(spelled) == 1 and hf[spelled[0]]["offload"] is True and "activation_offloading" not in hf
        args = TrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True, **hf)
        trained = Trainer(model=llama(), args=args, train_dataset=Dataset.from_list(rows()), data_collator=pad)
        assert Plan.from_trainer(trained) == plan
    else:
        with pytest.raises(memlab.MemlabError, match="without checkpointing"):
            plan.to_training_arguments()


def test_a_plan_without_activation_offload_switches_the_trl_flag_off() -> None:
    assert Plan(micro_batch=2).to_training_arguments(trl=True)["activation_offloading"] is False
    kwargs = Plan(micro_batch=2, checkpointing=True, offload="all").to_training_arguments(trl=True)
    assert kwargs["activation_offloading"] is True and "deepspeed" in kwargs  # the optimizer through ZeRO offload


def test_apply_switches_a_trl_trainers_offloading_and_undo_puts_it_back(tmp_path: Any,
                                                                         trl_offload_stood_in: None) -> None:
    """memlab.apply on an SFTTrainer: a plan without activation offload turns TRL's flag (and the context TRL
    enters around each training step) off; one with it turns them on, without checkpointing too (TRL's form)."""
    offloading = sft_trainer(tmp_path, activation_offloading=True)
    args, context = offloading.args, offloading.maybe_activation_offload_context
    plain = Plan(micro_batch=2)
    with memlab.apply(offloading, plain):
        assert offloading.args.activation_offloading is False
        assert isinstance(offloading.maybe_activation_offload_context, contextlib.nullcontext)
        assert Plan.from_trainer(offloading) == plain
    assert offloading.args is args and offloading.maybe_activation_offload_context is context
    other = sft_trainer(tmp_path / "other")
    offloaded = Plan(micro_batch=1, accumulation=2, offload="activations")
    with memlab.apply(other, offloaded):
        assert other.args.activation_offloading is True and Plan.from_trainer(other) == offloaded
        other.train()  # on this CPU TRL's context cannot be made: offload moves nothing, the step trains
    assert other.args.activation_offloading is False and Plan.from_trainer(other) == Plan(micro_batch=2)
