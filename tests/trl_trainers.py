"""Tiny TRL trainers on CPU (a GRPOTrainer and a DPOTrainer on a one-layer Llama and a word tokenizer), for the
front ends' tests; nothing is downloaded."""

from __future__ import annotations

from typing import Any

import torch
import trl
from datasets import Dataset
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast


def llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                        num_attention_heads=4, num_key_value_heads=4, vocab_size=64,
                                        max_position_embeddings=128, pad_token_id=0))


def word_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {"[PAD]": 0, "[UNK]": 1, "[EOS]": 2, **{f"w{i}": i + 3 for i in range(60)}}
    words = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=words, pad_token="[PAD]", unk_token="[UNK]", eos_token="[EOS]")


def length_reward(completions: list[Any], **_: Any) -> list[float]:
    return [float(len(completion)) for completion in completions]


def make_grpo_trainer(tmp_path: Any, reward_funcs: Any = length_reward, reward_processing_classes: Any = None,
                      peft_config: Any = None, **settings: Any) -> trl.GRPOTrainer:
    """Two completions of 8 tokens per prompt, 2 generations per device, no reference model (beta=0; with
    beta > 0, TRL's reference model loaded from the policy saved under ``tmp_path``)."""
    config: dict[str, Any] = dict(output_dir=str(tmp_path / "grpo"), report_to=[], use_cpu=True, save_strategy="no",
                                  max_steps=1, per_device_train_batch_size=2, num_generations=2,
                                  max_completion_length=8, disable_tqdm=True, bf16=False, seed=0, beta=0.0)
    config.update(settings)
    prompts = Dataset.from_list([{"prompt": " ".join(f"w{(i + j) % 60}" for j in range(3 + i))} for i in range(6)])
    model = llama()
    if config["beta"]:  # TRL loads the reference model from the policy's path
        model.save_pretrained(tmp_path / "policy")
        model = LlamaForCausalLM.from_pretrained(tmp_path / "policy")
    return trl.GRPOTrainer(model=model, reward_funcs=reward_funcs, args=trl.GRPOConfig(**config),
                           train_dataset=prompts, processing_class=word_tokenizer(),
                           reward_processing_classes=reward_processing_classes, peft_config=peft_config)


def make_dpo_trainer(tmp_path: Any, peft_config: Any = None, **settings: Any) -> trl.DPOTrainer:
    """Preference pairs of uneven lengths and a reference model held apart (with a ``peft_config``, none: the
    reference is the base with its adapters off)."""
    config: dict[str, Any] = dict(output_dir=str(tmp_path / "dpo"), report_to=[], use_cpu=True, save_strategy="no",
                                  max_steps=1, per_device_train_batch_size=2, disable_tqdm=True, bf16=False, seed=0)
    config.update(settings)
    rows = [{"prompt": " ".join(f"w{(i + j) % 60}" for j in range(3 + (i * 5) % 11)),
             "chosen": " ".join(f"w{(i * 3 + j) % 60}" for j in range(2 + i % 4)),
             "rejected": " ".join(f"w{(i * 7 + j) % 60}" for j in range(1 + (i * 3) % 9))} for i in range(6)]
    return trl.DPOTrainer(model=llama(), ref_model=None if peft_config is not None else llama(),
                          args=trl.DPOConfig(**config), train_dataset=Dataset.from_list(rows),
                          processing_class=word_tokenizer(), peft_config=peft_config)


def phase_peaks(timeline: Any) -> dict[str, int]:
    """The largest total in each named phase of a timeline."""
    totals = [sum(timeline.series[name][i] for name in timeline.categories) for i in range(len(timeline.x))]
    peaks: dict[str, int] = {}
    for name, start, end in timeline.phases:
        inside = [total for x, total in zip(timeline.x, totals, strict=True) if start <= x <= end]
        peaks[name] = max([peaks.get(name, 0), *inside])
    return peaks


def trained_with(trainer: Any, plan: Any, budget: int) -> int | None:
    """``trainer.train()`` with ``plan`` applied (undone after) under ``memlab.watch`` with ``budget``: the watched
    peak, as a user checks what ``fit`` chose."""
    import memlab

    with memlab.apply(trainer, plan):
        watched = memlab.watch(trainer, budget=budget)
        try:
            trainer.train()
        finally:
            watched.remove()
    return watched.peak_bytes
