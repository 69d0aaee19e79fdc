"""A Trainer's step as accelerate runs it (memlab.trainer.source): the fp32 copy of mixed precision's outputs.

memlab.trainer.source.accelerate_outputs_fp32: accelerate's fp32-output wrapper on a model's forward for one
call under mixed precision, put back after (also on error), the model's own instance forward kept.

A bf16/fp16 Trainer's step as accelerate runs it: the forward's fp16/bf16 outputs copied to fp32
(``accelerate.utils.convert_outputs_to_fp32``, which ``Accelerator.prepare_model`` puts on the model under native
mixed precision). memlab's ``measure`` and ``estimate`` of a trainer run its ``compute_loss`` on the same outputs
the trainer sees in ``trainer.train()``; an fp32 trainer's forward is left alone. Tiny Llamas on CPU."""

from __future__ import annotations

from types import MethodType, SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn

pytest.importorskip("accelerate")
from accelerate.utils import convert_outputs_to_fp32  # noqa: E402

from memlab.trainer.source import accelerate_outputs_fp32  # noqa: E402

pytest.importorskip("trl")
import trl  # noqa: E402
from datasets import Dataset  # noqa: E402
from test_trainer_contract import pad, tokenizer  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments  # noqa: E402

import memlab  # noqa: E402


def bf16() -> Any:
    return torch.autocast("cpu", dtype=torch.bfloat16)


def test_outputs_copied_to_fp32_under_autocast_and_forward_put_back() -> None:
    model = nn.Linear(4, 4)
    with bf16():
        assert model(torch.ones(1, 4)).dtype == torch.bfloat16
        with accelerate_outputs_fp32(model):
            assert model(torch.ones(1, 4)).dtype == torch.float32
    assert "forward" not in vars(model)


def test_no_wrapper_without_autocast() -> None:
    model = nn.Linear(4, 4)
    with accelerate_outputs_fp32(model):
        assert "forward" not in vars(model)
        assert model(torch.ones(1, 4)).dtype == torch.float32


def test_own_instance_forward_kept_under_the_wrapper_and_put_back_on_error() -> None:
    model = nn.Linear(4, 4)
    calls: list[int] = []

    def own(x: torch.Tensor) -> torch.Tensor:  # an instance forward, as memlab's compile lever puts one
        calls.append(1)
        return nn.Linear.forward(model, x)

    model.forward = own  # type: ignore[method-assign]
    with pytest.raises(ValueError), bf16(), accelerate_outputs_fp32(model):
        assert model(torch.ones(1, 4)).dtype == torch.float32 and calls == [1]
        raise ValueError("a failing step")
    assert vars(model)["forward"] is own


@pytest.mark.parametrize("bound", [False, True])
def test_a_forward_accelerate_already_wraps_is_left_alone(bound: bool) -> None:
    model = nn.Linear(4, 4)
    # accelerate's prepare_model: a bound method re-bound around its function, anything else wrapped as is
    prepared = (MethodType(convert_outputs_to_fp32(model.forward.__func__), model) if bound
                else convert_outputs_to_fp32(model.forward))
    model.forward = prepared  # type: ignore[method-assign]
    with bf16(), accelerate_outputs_fp32(model):
        assert vars(model)["forward"] is prepared
    assert vars(model)["forward"] is prepared


FAST: dict[str, Any] = {"steps": 1, "warmup": 0, "noise": 0, "progress": False}


def llama() -> LlamaForCausalLM:
    """A vocabulary large against the hidden size: the logits are most of the step."""
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=2, vocab_size=2048,
                                        max_position_embeddings=128, pad_token_id=0))


def rows() -> list[dict]:
    """Examples of one length: the worst batch memlab measures is the batch ``trainer.train()`` trains first."""
    return [{"input_ids": [(i * 7 + j) % 60 + 3 for j in range(32)]} for i in range(4)]


class Seen:
    """Records the dtype of the logits each ``compute_loss`` call received, and the model's instance ``forward``
    during the call (SFTTrainer's model has one of its own; accelerate's wrapper is another)."""

    def __init__(self) -> None:
        self.dtypes: list[torch.dtype] = []
        self.forwards: list[Any] = []

    def record(self, model: Any, outputs: Any) -> None:
        self.dtypes.append(outputs.logits.dtype)
        self.forwards.append(vars(model).get("forward"))


def accelerates(forward: Any) -> bool:
    """Whether ``forward`` is accelerate's ``convert_outputs_to_fp32`` wrapper, bound as ``prepare_model`` binds it."""
    inner = getattr(getattr(forward, "__func__", forward), "__wrapped__", None)
    return type(inner).__name__ == "ConvertOutputsToFp32"


class SeeingTrainer(Trainer):
    seen: Seen

    def compute_loss(self, model: Any, inputs: Any, return_outputs: bool = False, **kwargs: Any) -> Any:
        loss, outputs = super().compute_loss(model, inputs, return_outputs=True, **kwargs)
        self.seen.record(model, outputs)
        return (loss, outputs) if return_outputs else loss


class SeeingSFTTrainer(trl.SFTTrainer):
    seen: Seen

    def compute_loss(self, model: Any, inputs: Any, return_outputs: bool = False, **kwargs: Any) -> Any:
        loss, outputs = super().compute_loss(model, inputs, return_outputs=True, **kwargs)
        self.seen.record(model, outputs)
        return (loss, outputs) if return_outputs else loss


def make(kind: str, tmp_path: Any, bf16: bool) -> Any:
    common = dict(output_dir=str(tmp_path), report_to=[], use_cpu=True, save_strategy="no", max_steps=1,
                  per_device_train_batch_size=2, disable_tqdm=True, bf16=bf16, seed=0)
    if kind == "trainer":
        args = TrainingArguments(**common, remove_unused_columns=False)
        trainer: Any = SeeingTrainer(model=llama(), args=args, train_dataset=rows(), data_collator=pad)
    else:
        config = trl.SFTConfig(**common, max_length=None)
        trainer = SeeingSFTTrainer(model=llama(), args=config, train_dataset=Dataset.from_list(rows()),
                                   processing_class=tokenizer())
    trainer.seen = Seen()
    return trainer


@pytest.mark.parametrize("kind", ["trainer", "sft"])
def test_bf16_trainer_measured_and_estimated_on_the_fp32_outputs_training_sees(tmp_path: Any, kind: str) -> None:
    trainer = make(kind, tmp_path, bf16=True)
    model = trainer.model
    own = vars(model).get("forward")
    measured = memlab.measure(trainer, **FAST)
    estimated = memlab.estimate(trainer)
    memlab_seen = list(trainer.seen.dtypes)
    assert memlab_seen and all(accelerates(forward) for forward in trainer.seen.forwards)
    assert vars(model).get("forward") is own  # put back after every call, the trainer's own instance forward too
    trainer.seen = Seen()
    watched = memlab.watch(trainer)
    try:
        trainer.train()
    finally:
        watched.remove()
    assert trainer.seen.dtypes == [torch.float32]  # accelerate's conversion in training
    assert set(memlab_seen) == {torch.float32}, memlab_seen  # bfloat16 before: autocast only
    # The copy is freed with the outputs, before backward, whose cross-entropy holds three fp32 logits-sized
    # tensors: it does not move these peaks (byte-identical before and after on this CPU).
    assert watched.peak_bytes is not None and measured.peak_bytes > 0 and estimated.peak_bytes > 0


@pytest.mark.parametrize("kind", ["trainer", "sft"])
def test_fp32_trainer_forward_is_left_alone(tmp_path: Any, kind: str) -> None:
    trainer = make(kind, tmp_path, bf16=False)
    own = vars(trainer.model).get("forward")
    memlab.measure(trainer, **FAST)
    memlab.estimate(trainer)
    assert vars(trainer.model).get("forward") is own
    assert set(trainer.seen.dtypes) == {torch.float32}
    assert not any(accelerates(forward) for forward in trainer.seen.forwards)


def test_a_dry_run_of_a_launched_ranks_step_gathers_nothing_over_the_processes() -> None:
    # Issue 85: TRL's losses gather their metrics over the processes (accelerator.gather, reduce); a launched rank's
    # dry run is its step alone, whose fake tensors cannot be sent (and its forked copy has no group).
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from memlab.trainer.source import dry_run_models

    def refuse(*_: object, **__: object) -> None:
        raise AssertionError("a collective ran")

    accelerator = SimpleNamespace(num_processes=2, gather=refuse, gather_for_metrics=refuse, reduce=refuse)
    trainer = SimpleNamespace(model=torch.nn.Linear(2, 2), accelerator=accelerator)
    with FakeTensorMode():
        fake = torch.nn.Linear(2, 2)
    with dry_run_models(trainer, fake):
        value = torch.ones(2)
        assert trainer.accelerator.gather(value) is value and trainer.accelerator.reduce(value, "sum") is value
        assert trainer.accelerator.gather_for_metrics(value) is value
    assert trainer.accelerator.gather is refuse  # put back
