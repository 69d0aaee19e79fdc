"""The attention switch: transformers' attn_implementation on a live model, what it keeps, and back exactly."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from memlab.errors import MemlabError
from memlab.techniques.attention import switch_attention, unavailable
from tests.models import fingerprint, lm_batch, tiny_bert, tiny_llama

ROWS, TOKENS = 4, 24  # 24 tokens: no other kept tensor (head dim 16) has the probabilities' size


def _saved(model: nn.Module, batch: dict[str, torch.Tensor]) -> dict[int, torch.Tensor]:
    """Every storage the forward keeps for backward, by address (a tensor saved twice counts once)."""
    kept: dict[int, torch.Tensor] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        kept[tensor.untyped_storage().data_ptr()] = tensor
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        model(**batch)
    return kept


def _bytes(kept: dict[int, Any]) -> int:
    return sum(tensor.untyped_storage().nbytes() for tensor in kept.values())


def _probabilities_bytes(model: nn.Module) -> int:
    config = model.config
    return ROWS * config.num_attention_heads * TOKENS * TOKENS * 4 * config.num_hidden_layers


def test_restore_is_exact_after_each_implementation() -> None:
    model = tiny_llama()
    model.train()
    before = fingerprint(model)
    configs_before = model.config._attn_implementation
    for implementation in ("eager", "sdpa", "flex_attention"):
        if unavailable(model, implementation):
            continue
        undo = switch_attention(model, implementation)
        assert model.config._attn_implementation == implementation
        model(**lm_batch(rows=ROWS, length=TOKENS))["loss"].backward()
        model.zero_grad(set_to_none=True)
        undo()
        assert model.config._attn_implementation == configs_before
        assert model.config.__dict__["_attn_implementation_internal"] == configs_before
    after = fingerprint(model)
    assert after["tensors"].keys() == before["tensors"].keys()
    for name, (dtype, tensor) in before["tensors"].items():
        assert after["tensors"][name][0] == dtype and torch.equal(after["tensors"][name][1], tensor), name
    assert {k: v for k, v in after.items() if k != "tensors"} == {k: v for k, v in before.items() if k != "tensors"}


def test_eager_keeps_the_probabilities_and_nothing_else() -> None:
    model = tiny_llama()
    model.train()
    batch = lm_batch(rows=ROWS, length=TOKENS)
    sdpa = _saved(model, batch)
    undo = switch_attention(model, "eager")
    eager = _saved(model, batch)
    undo()
    square = ROWS * model.config.num_attention_heads * TOKENS * TOKENS
    # matmul may save the probabilities flattened to (rows x heads, tokens, tokens): found by their size
    probabilities = [t for t in eager.values() if t.untyped_storage().nbytes() == square * 4 and t.shape[-1] == TOKENS
                     and t.shape[-2] == TOKENS]
    # rows x heads x tokens x tokens x 4 bytes (fp32), one per layer
    assert _bytes({i: t for i, t in enumerate(probabilities)}) == _probabilities_bytes(model) == 4 * 2 * 24 * 24 * 4 * 2
    # sdpa keeps the softmax's log-sum-exp (rows x heads x tokens, fp32) in their place
    logsumexp = ROWS * model.config.num_attention_heads * TOKENS * 4 * model.config.num_hidden_layers
    assert _bytes(eager) - _bytes(sdpa) == _probabilities_bytes(model) - logsumexp


def test_eager_dropout_keeps_its_mask_and_output_too() -> None:
    model = tiny_llama()
    model.config.attention_dropout = 0.1
    for layer in model.model.layers:
        layer.self_attn.attention_dropout = 0.1
    model.train()
    batch = lm_batch(rows=ROWS, length=TOKENS)
    plain = _bytes(_saved(_without_dropout(model), batch))
    undo = switch_attention(model, "eager")
    with_dropout = _bytes(_saved(model, batch))
    undo()
    # dropout keeps the dropped probabilities for the matmul with V and its mask for its own backward; on CPU torch's
    # dropout draws the mask in the input's dtype (fp32 here; CUDA's fused dropout keeps one byte a value)
    dropped = _probabilities_bytes(model)
    mask = ROWS * model.config.num_attention_heads * TOKENS * TOKENS * 4 * model.config.num_hidden_layers
    assert with_dropout - plain == dropped + mask == 2 * 36864


def _without_dropout(model: nn.Module) -> nn.Module:
    import copy
    twin = copy.deepcopy(model)
    for layer in twin.model.layers:
        layer.self_attn.attention_dropout = 0.0
    switch_attention(twin, "eager")
    return twin


def test_missing_kernel_says_what_to_install_and_touches_nothing() -> None:
    model = tiny_llama()
    before = model.config._attn_implementation
    reason = unavailable(model, "flash_attention_2")
    assert "pip install flash-attn" in reason
    with pytest.raises(MemlabError, match="pip install flash-attn"):
        switch_attention(model, "flash_attention_2")
    assert model.config._attn_implementation == before
    # torch's FlexAttention has no backward on CPU: an error that says where it trains, not a crash mid-trial
    assert "no backward off CUDA" in unavailable(model, "flex_attention")


def test_only_what_transformers_says_the_model_supports() -> None:
    model = tiny_bert()
    for implementation in ("sdpa", "flash_attention_2", "flex_attention"):
        flag = {"sdpa": "_supports_sdpa", "flash_attention_2": "_supports_flash_attn",
                "flex_attention": "_supports_flex_attn"}[implementation]
        if not getattr(type(model), flag):
            assert "does not support" in unavailable(model, implementation)
    assert unavailable(nn.Linear(2, 2), "eager").startswith("attention applies to a transformers model only")
    assert "write one of eager, sdpa" in unavailable(model, "math")
