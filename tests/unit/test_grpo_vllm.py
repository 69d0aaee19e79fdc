"""vLLM's arithmetic for a GRPOTrainer that generates with it (issue 59): the weights in vLLM's dtype (packed 4-bit
weights as stored), the KV cache in whole blocks, the share of the card, what a share too small says, and the
utilizations fit tries. No trainer: a tiny Llama and the settings."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from memlab.inference.kv import kv_cache_bytes
from memlab.kinds.grpo.vllm import BLOCK_TOKENS, RUNTIME_ALLOWANCE, utilization_candidates, vllm_share
from memlab.techniques.vllm import VLLMSettings

CONFIG = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2, vocab_size=256)


def test_weights_in_vllms_dtype_and_kv_in_whole_blocks() -> None:
    model = LlamaForCausalLM(LlamaConfig(**CONFIG))  # float32: vLLM loads it in float16
    parameters = sum(p.numel() for p in model.parameters())
    share = vllm_share(VLLMSettings("colocate", 0.25, sleep=False), model, card=2**32, prompt=20, completion=13,
                       sequences=6)
    assert share.weights == parameters * 2 and share.share == 2**30 and share.during_training == 2**30
    tokens = math.ceil(33 / BLOCK_TOKENS) * BLOCK_TOKENS
    assert share.kv_sequence == kv_cache_bytes(model.config, tokens=tokens, dtype=torch.float16) == 2 * 2 * 64 * 48 * 2
    assert share.kv_batch == 6 * share.kv_sequence and share.host == 0
    assert share.least == pytest.approx((share.weights + share.kv_batch + RUNTIME_ALLOWANCE) / 2**32)

    # A QLoRA base: bitsandbytes' packed uint8 storage is what vLLM loads too.
    packed = model.model.layers[0].mlp.up_proj
    packed.weight = torch.nn.Parameter(torch.zeros(64 * 128 // 2, 1, dtype=torch.uint8), requires_grad=False)
    quantized = vllm_share(VLLMSettings("colocate", 0.25, sleep=False), model, card=2**32, prompt=20, completion=13,
                           sequences=6)
    assert share.weights - quantized.weights == 64 * 128 * 2 - 64 * 128 // 2


def test_a_share_too_small_names_the_utilization_that_holds_the_batch() -> None:
    model = LlamaForCausalLM(LlamaConfig(**CONFIG, dtype="bfloat16"))
    share = vllm_share(VLLMSettings("colocate", 1e-6, sleep=True), model, card=2**30, prompt=100, completion=28,
                       sequences=8)
    assert share.during_training == 0  # asleep: level 2 discards weights and KV cache
    said = share.refusal()
    least = math.ceil((share.weights + share.kv_batch) / 2**30 * 100) / 100
    assert said is not None and "vLLM would not start" in said
    assert f"GRPOConfig(vllm_gpu_memory_utilization={least})" in said
    assert vllm_share(VLLMSettings("colocate", 0.5, sleep=True), model, card=2**30, prompt=100, completion=28,
                      sequences=8).refusal() is None
    candidates = utilization_candidates(vllm_share(VLLMSettings("colocate", 0.7, sleep=False), model, card=2**34,
                                                   prompt=100, completion=28, sequences=8))
    assert candidates == [0.07, 0.1, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.7]
