"""The KV-cache formula on the attention layouts that keep fewer key/value heads than query heads, and on models
that keep no cache at all (regressions: Falcon's multi-query cache was counted with every query head, and an
encoder-only config got a number)."""

from __future__ import annotations

import pytest
import torch
from transformers import BertConfig, FalconConfig, FalconForCausalLM, GPTBigCodeConfig, LlamaConfig, RobertaConfig

import memlab
from memlab.errors import MemlabError
from memlab.inference.kv import cache_bytes, kv_cache_bytes, kv_shape


def test_falcon_7b_multi_query_keeps_one_kv_head() -> None:
    falcon_7b = FalconConfig()  # the defaults are Falcon-7B's shape: 71 heads, multi_query
    layers, kv_heads, head_dim = kv_shape(falcon_7b)
    assert (layers, kv_heads, head_dim) == (32, 1, 64)
    assert kv_cache_bytes(falcon_7b, tokens=2048, batch=1, dtype="bf16") == 2 * 32 * 1 * 64 * 2048 * 2


def test_falcon_new_architecture_keeps_its_kv_heads_and_plain_falcon_every_head() -> None:
    assert kv_shape(FalconConfig(new_decoder_architecture=True, num_attention_heads=16, num_kv_heads=4))[1] == 4
    assert kv_shape(FalconConfig(multi_query=False, num_attention_heads=8, hidden_size=64))[1] == 8


def test_starcoder_multi_query_keeps_one_kv_head() -> None:
    assert kv_shape(GPTBigCodeConfig(n_head=12, n_embd=768, multi_query=True))[1] == 1
    assert kv_shape(GPTBigCodeConfig(n_head=12, n_embd=768, multi_query=False))[1] == 12


@pytest.mark.parametrize("config", [BertConfig(), RobertaConfig()], ids=["bert", "roberta"])
def test_an_encoder_only_model_has_no_cache_to_count(config: object) -> None:
    with pytest.raises(MemlabError, match="encoder-only model: it keeps no KV cache; pass the config of a decoder"):
        memlab.kv_cache_bytes(config, tokens=128)


def test_decoders_still_count() -> None:
    assert kv_cache_bytes(BertConfig(is_decoder=True, num_hidden_layers=2), tokens=1, dtype=1) == 2 * 2 * 768
    assert kv_shape(LlamaConfig(num_attention_heads=32, num_key_value_heads=8))[1] == 8


def test_the_formula_matches_the_cache_falcon_really_builds() -> None:
    config = FalconConfig(
        vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, multi_query=True, alibi=False
    )
    model = FalconForCausalLM(config).eval()
    with torch.no_grad():
        cache = model(torch.randint(0, 128, (3, 7)), use_cache=True).past_key_values
    assert cache_bytes(cache) == kv_cache_bytes(config, tokens=7, batch=3, dtype="fp32") > 0
