"""A tiny transformers Trainer on CPU over examples of uneven lengths, for the front ends' tests."""

from __future__ import annotations

from typing import Any

import torch
from datasets import Dataset
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

LENGTHS = [4, 6, 30, 5, 4, 6, 4, 5, 4, 4]
"""Examples' lengths: one is much longer (the worst batch holds it)."""


def make_trainer(tmp_path: Any, steps: int = 5, logging_steps: int = 2) -> Trainer:
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                         num_key_value_heads=4, vocab_size=64, max_position_embeddings=64)
    data = Dataset.from_dict({"input_ids": [[(i + j) % 63 + 1 for j in range(n)] for i, n in enumerate(LENGTHS)]})

    def pad(examples: list[dict]) -> dict[str, torch.Tensor]:
        longest = max(len(e["input_ids"]) for e in examples)
        ids = torch.zeros(len(examples), longest, dtype=torch.long)
        for row, example in enumerate(examples):
            ids[row, : len(example["input_ids"])] = torch.tensor(example["input_ids"])
        return {"input_ids": ids, "labels": ids.clone()}

    args = TrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True, save_strategy="no",
                             max_steps=steps, per_device_train_batch_size=2, logging_steps=logging_steps,
                             disable_tqdm=True)
    return Trainer(model=LlamaForCausalLM(config), args=args, train_dataset=data, data_collator=pad)
