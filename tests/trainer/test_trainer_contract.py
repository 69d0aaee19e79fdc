"""The Trainer contract the preference and RL trainers build on (issue 59): ``Plan()`` means one thing on every
object, the trainer as set up is ``plan=None`` (``Plan.from_trainer``), the trainer's datasets are the same objects
after any run, and a search with nothing that fits on a trainer's batches answers instead of raising a TypeError.
Tiny Llamas on CPU, a real transformers Trainer and TRL's SFTTrainer."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

pytest.importorskip("trl")
pytest.importorskip("peft")
import trl  # noqa: E402
from datasets import Dataset  # noqa: E402
from peft import LoraConfig, get_peft_model  # noqa: E402
from tokenizers import Tokenizer, models, pre_tokenizers  # noqa: E402
from transformers import (  # noqa: E402
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    Trainer,
    TrainingArguments,
)

import memlab  # noqa: E402
from memlab import MemlabError, Plan  # noqa: E402

FAST: dict[str, Any] = {"steps": 1, "warmup": 0, "noise": 0, "progress": False}
LENGTHS = [4, 6, 30, 5, 28, 4, 12, 9]


def llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                        num_attention_heads=4, num_key_value_heads=4, vocab_size=64,
                                        max_position_embeddings=128, pad_token_id=0))


def tokenizer() -> PreTrainedTokenizerFast:
    vocab = {"[PAD]": 0, "[UNK]": 1, "[EOS]": 2, **{f"w{i}": i + 3 for i in range(60)}}
    words = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=words, pad_token="[PAD]", unk_token="[UNK]", eos_token="[EOS]")


def pad(examples: list[dict]) -> dict[str, torch.Tensor]:
    longest = max(len(e["input_ids"]) for e in examples)
    ids = torch.zeros(len(examples), longest, dtype=torch.long)
    for row, example in enumerate(examples):
        ids[row, : len(example["input_ids"])] = torch.tensor(example["input_ids"])
    return {"input_ids": ids, "attention_mask": (ids != 0).long(), "labels": ids.clone()}


def rows() -> list[dict]:
    return [{"input_ids": [(i + j) % 60 + 3 for j in range(n)]} for i, n in enumerate(LENGTHS)]


def arguments(tmp_path: Any, **changes: Any) -> TrainingArguments:
    settings = dict(output_dir=str(tmp_path), report_to=[], use_cpu=True, save_strategy="no", max_steps=1,
                    per_device_train_batch_size=2, disable_tqdm=True)
    return TrainingArguments(**{**settings, **changes})


def test_plan_means_the_whole_effective_batch_and_none_the_trainer_as_set_up(tmp_path: Any) -> None:
    trainer = Trainer(model=llama(), args=arguments(tmp_path, gradient_accumulation_steps=2),
                      train_dataset=Dataset.from_list(rows()), data_collator=pad)
    own = Plan.from_trainer(trainer)
    assert (own.micro_batch, own.accumulation) == (2, 2)
    plain, as_set_up, named = memlab.compare(trainer, plans=[Plan(), own, Plan(micro_batch=1)], **FAST).trials
    assert [t.status for t in (plain, as_set_up, named)] == ["ok"] * 3
    assert (plain.plan.micro_batch, plain.plan.accumulation, plain.rows_per_step) == (4, 1, 4)
    assert (as_set_up.plan.micro_batch, as_set_up.plan.accumulation, as_set_up.rows_per_step) == (2, 2, 4)
    assert (named.plan.micro_batch, named.plan.accumulation) == (1, 1)
    assert plain.peak_bytes > as_set_up.peak_bytes  # four rows at once hold more than two, twice
    default = memlab.measure(trainer, **FAST)
    assert default.plan == own
    # The estimate means the same: Plan() the four costliest rows in one micro-batch, None the trainer's split.
    assert memlab.estimate(trainer, Plan()).plan == Plan(micro_batch=4)
    assert memlab.estimate(trainer).plan == own
    assert memlab.estimate(trainer, Plan(accumulation=4)).plan == Plan(micro_batch=1, accumulation=4)
    with memlab.apply(trainer, Plan()):
        assert (trainer.args.per_device_train_batch_size, trainer.args.gradient_accumulation_steps) == (4, 1)
    assert (trainer.args.per_device_train_batch_size, trainer.args.gradient_accumulation_steps) == (2, 2)
    with pytest.raises(MemlabError, match="not a transformers Trainer"):
        Plan.from_trainer(llama())


@pytest.mark.parametrize("setup", ["list dataset", "peft model"])
def test_the_trainer_and_its_datasets_are_the_same_objects_afterwards(tmp_path: Any, setup: str) -> None:
    """issue 59: the worst-batch scan's bookkeeping put back a deep copy of a list dataset (plain data)."""
    model = llama()
    if setup == "peft model":
        model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    trainer = Trainer(model=model, args=arguments(tmp_path), train_dataset=rows(), data_collator=pad)
    dataset, collator, model, args = trainer.train_dataset, trainer.data_collator, trainer.model, trainer.args
    contents = [dict(example) for example in dataset]
    assert memlab.measure(trainer, **FAST).status == "ok"
    memlab.estimate(trainer)
    memlab.fit(trainer, budget="1GiB", space={"micro_batch": [2, 1], "checkpointing": [False],
                                              "precision": ["fp32"], "optimizer": ["adamw"]}, **FAST)
    assert trainer.train_dataset is dataset and trainer.data_collator is collator
    assert trainer.model is model and trainer.args is args
    memlab.apply(trainer, Plan(micro_batch=1)).undo()
    assert trainer.train_dataset is dataset and list(dataset) == contents


@pytest.mark.parametrize("setup", ["padded", "padding-free"])
def test_fit_with_nothing_that_fits_answers_on_a_trainers_batches(tmp_path: Any, setup: str) -> None:
    """issue 59: a budget below the weights ended in TypeError: 'StepBatches' object is not iterable."""
    if setup == "padded":
        trainer: Any = Trainer(model=llama(), args=arguments(tmp_path), train_dataset=Dataset.from_list(rows()),
                               data_collator=pad)
    else:
        config = trl.SFTConfig(output_dir=str(tmp_path), report_to=[], use_cpu=True, save_strategy="no",
                               max_steps=1, per_device_train_batch_size=2, disable_tqdm=True, padding_free=True,
                               max_length=None)
        trainer = trl.SFTTrainer(model=llama(), args=config, train_dataset=Dataset.from_list(rows()),
                                 processing_class=tokenizer())
    dataset = trainer.train_dataset
    report = memlab.fit(trainer, budget="16KiB", space={"micro_batch": [2, 1], "checkpointing": [False, True],
                                                        "precision": ["fp32"], "optimizer": ["adamw"]}, **FAST)
    assert report.best is None and report.trials
    if setup == "padded":  # the padded worst batch is varied in tokens (nothing fits: the weights alone are over)
        assert report.shorter_sequences is None or "tokens per row" in report.shorter_sequences
    # The trainer's own plan round trip: its plan, measured and exported back to its arguments.
    own = Plan.from_trainer(trainer)
    assert memlab.measure(trainer, own, **FAST).status == "ok"
    assert Plan.from_training_arguments(dataclasses.replace(trainer.args, **own.to_training_arguments())) == own
    assert trainer.train_dataset is dataset
    with pytest.raises(MemlabError, match=r"memlab.limits\(trainer.model, plan"):
        memlab.limits(trainer, own, budget="1GiB", batch=None)
