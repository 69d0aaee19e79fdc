"""Eager attention's kept tensors are all counted (issue 57 item 6): a dry run for ``device="cuda"`` keeps, byte for
byte, the activations the CPU's measured step keeps with the same eager code, in float32 without dropout (the one
difference between the two devices there would be CUDA's one-byte dropout mask): GPT-2 (fp32 softmax of its own
dtype, the causal ``where``), OPT (softmax in float32 cast back, the weights kept by the matmul with the values) and
Llama (the same, with grouped heads repeated).

The published OPT runs (benchmarks/attention_vs_published.py) keep 8 bytes per attention element where this code keeps
6: their transformers (4.46) also kept the masked scores for ``torch.max``'s backward, which today's code no longer
calls; estimated with that code, memlab's eager-minus-SDPA difference is the published one.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import transformers

import memlab
from memlab import Plan


def gpt2() -> torch.nn.Module:
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=128, n_positions=64, n_embd=64, n_layer=2, n_head=4, resid_pdrop=0.0, embd_pdrop=0.0,
        attn_pdrop=0.0, attn_implementation="eager"))


def opt() -> torch.nn.Module:
    return transformers.OPTForCausalLM(transformers.OPTConfig(
        vocab_size=128, hidden_size=64, word_embed_proj_dim=32, num_hidden_layers=2, num_attention_heads=4,
        ffn_dim=128, max_position_embeddings=64, do_layer_norm_before=False, dropout=0.0, attention_dropout=0.0,
        attn_implementation="eager"))


def llama() -> torch.nn.Module:
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, attn_implementation="eager"))


@pytest.mark.parametrize("make", [gpt2, opt, llama], ids=["gpt2", "opt", "llama"])
def test_a_cuda_estimate_keeps_what_eager_attention_keeps_on_the_cpu(make: Callable[[], torch.nn.Module]) -> None:
    torch.manual_seed(0)
    model = make()
    ids = torch.randint(0, 128, (2, 48), generator=torch.Generator().manual_seed(0))
    batch = {"input_ids": ids, "labels": ids}
    estimate = memlab.estimate(model, batch, Plan(), device="cuda")
    measured = memlab.measure(model, batch, Plan(), steps=1, warmup=1, progress=False, noise=0)
    assert estimate.status == measured.status == "ok", estimate.error or measured.error
    assert estimate.breakdown["activations"] == measured.breakdown["activations"]
