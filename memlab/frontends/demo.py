"""The built-in demo: a small Llama built from its config (nothing is downloaded) and a random batch for it.

``memlab demo`` and the workshop notebooks use these so that they run anywhere, a CPU-only machine included.
With a real model you would write ``AutoModelForCausalLM.from_pretrained(name)`` and a tokenized batch instead.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from memlab.techniques.precision import bf16_on_cpu, cpu_bf16_units

__all__ = ["DEFAULT_LENGTH", "DEFAULT_ROWS", "VOCAB_SIZE", "cpu_search_note", "default_batch", "default_model"]

VOCAB_SIZE = 1000
"""Vocabulary size of :func:`default_model`; :func:`default_batch` draws token ids below it."""

DEFAULT_ROWS = 8
"""Rows of :func:`default_batch` (the effective batch size the demo keeps)."""

DEFAULT_LENGTH = 64
"""Tokens per row of :func:`default_batch`."""


def default_model(seed: int = 0) -> nn.Module:
    """A small Llama causal language model (4 layers, hidden size 128, vocabulary 1000), random weights.

    About 1.4 million parameters: small enough for a CPU, big enough that activations, gradients and optimizer
    state all show in the breakdown. The same ``seed`` gives the same weights.

    Example:
        >>> model = default_model()
        >>> type(model).__name__, model.config.num_hidden_layers, model.config.hidden_size
        ('LlamaForCausalLM', 4, 128)
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        use_cache=False,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.train()
    return model


def default_batch(rows: int = DEFAULT_ROWS, length: int = DEFAULT_LENGTH, seed: int = 1) -> dict[str, torch.Tensor]:
    """A Hugging Face style batch of random token ids for :func:`default_model`: ``input_ids``,
    ``attention_mask`` and ``labels`` (the ids again, as for causal language modelling), ``rows x length``.

    Example:
        >>> batch = default_batch(rows=4, length=16)
        >>> sorted(batch), tuple(batch["input_ids"].shape)
        (['attention_mask', 'input_ids', 'labels'], (4, 16))
        >>> bool((default_batch()["input_ids"] == default_batch()["input_ids"]).all())
        True
    """
    if rows < 1 or length < 1:
        raise ValueError(f"rows={rows} and length={length} must both be >= 1")
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB_SIZE, (rows, length), generator=generator)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}


def cpu_search_note(flags: Iterable[str] | None = None) -> str:
    """What ``memlab demo`` says of its search on a CPU with ``flags`` (default: this machine's): it keeps fp32 and
    AdamW, and why, from the precision lever's one rule for bf16 on a CPU
    (:func:`memlab.techniques.precision.cpu_bf16_units`).

    Example:
        >>> print(cpu_search_note({"avx2"}))
        (On a CPU the search keeps fp32 and AdamW: 8-bit AdamW is for GPUs, and this CPU emulates bf16, slowly: it \
lists no bf16 matrix units (amx_bf16, avx512_bf16 or Arm's bf16).)
        >>> "natively" in cpu_search_note({"amx_bf16"}) and "Plan(precision='bf16')" in cpu_search_note({"amx_bf16"})
        True
    """
    if cpu_bf16_units(flags):
        return (f"(On a CPU the search keeps fp32 and AdamW, to stay short: 8-bit AdamW is for GPUs, and "
                f"{bf16_on_cpu(flags)}: memlab.compare(model, batch, [memlab.Plan(), "
                "memlab.Plan(precision='bf16')]) measures it here.)")
    return f"(On a CPU the search keeps fp32 and AdamW: 8-bit AdamW is for GPUs, and {bf16_on_cpu(flags)}.)"
