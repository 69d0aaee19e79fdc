"""A dry run's generation costed by its shape (issue 68): the prefill, the first decode step and the last, the KV
cache grown between them (memlab.inference.kv.grow_cache), against the token-by-token dry run it replaces, on full,
sliding-window and hybrid caches; its cost flat in the new tokens; a live generation still runs every step."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

import pytest
import torch
from transformers import Gemma2Config, LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM, Qwen2Config

import memlab
from memlab.estimation.cuda.gpus import GPUS
from memlab.estimation.dryrun.single_gpu import estimate_inference
from memlab.inference.kv import cache_bytes, cache_tokens, can_grow, grow_cache, new_cache
from memlab.inference.run import SKIPPED_DECODE_NOTE
from memlab.inference.step import InferenceStep
from memlab.plan import InferencePlan

CONFIGS = {
    "llama": LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=256),
    "qwen2": Qwen2Config(hidden_size=128, intermediate_size=256, num_hidden_layers=3, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=4096),
    "mistral-window": MistralConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                    num_key_value_heads=2, vocab_size=256, sliding_window=8),
    "gemma2-hybrid": Gemma2Config(hidden_size=128, intermediate_size=256, num_hidden_layers=4, num_attention_heads=4,
                                  num_key_value_heads=2, head_dim=32, vocab_size=1024, sliding_window=16),
}


@contextmanager
def every_decode_step() -> Iterator[None]:
    """The token-by-token dry run: no decode step left out."""
    with mock.patch.object(InferenceStep, "skipped", staticmethod(lambda plan, ids, cache: 0)):
        yield


@contextmanager
def counted_forwards() -> Iterator[list[int]]:
    calls: list[int] = []
    forward = InferenceStep._forward

    def counting(self: InferenceStep, *args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return forward(self, *args, **kwargs)

    with mock.patch.object(InferenceStep, "_forward", counting):
        yield calls


def _estimate(config: Any, rows: int, prompt: int, new: int, kv_cache: bool, device: str) -> memlab.Trial:
    return estimate_inference(config, {"input_ids": (rows, prompt)},
                              InferencePlan(new_tokens=new, weights="bf16", kv_cache=kv_cache), device=device,
                              gpu=GPUS["H100-80GB"])[0]


@pytest.mark.parametrize(("name", "kv_cache", "device"), [
    *((name, kv_cache, "cuda") for name in CONFIGS for kv_cache in (True, False)), ("llama", True, "cpu")])
@pytest.mark.slow
def test_the_shape_costed_generation_is_the_token_by_token_dry_runs(name: str, kv_cache: bool, device: str) -> None:
    # a long generation from a short prompt, so that the last decode step holds the generation's peak
    config = CONFIGS[name]
    by_shape = _estimate(config, rows=16, prompt=2, new=40, kv_cache=kv_cache, device=device)
    with every_decode_step():
        by_token = _estimate(config, rows=16, prompt=2, new=40, kv_cache=kv_cache, device=device)
    assert by_shape.status == by_token.status == "ok"
    assert by_token.timeline is not None and by_token.timeline.peak.phase == "decode"
    assert by_shape.peak_bytes == by_token.peak_bytes
    assert by_shape.breakdown == by_token.breakdown
    assert by_shape.kv_cache_end_bytes == by_token.kv_cache_end_bytes
    assert by_shape.context_tokens == by_token.context_tokens
    assert SKIPPED_DECODE_NOTE in by_shape.notes and SKIPPED_DECODE_NOTE not in by_token.notes
    if device == "cuda":  # the allocator's segments split as the cache grows a token at a time: the note's bound
        assert by_token.reserved_bytes is not None and by_shape.reserved_bytes is not None
        assert 0.97 * by_token.reserved_bytes <= by_shape.reserved_bytes <= by_token.reserved_bytes


@pytest.mark.slow
def test_a_dry_runs_generation_costs_the_same_forwards_at_any_length() -> None:
    config = CONFIGS["qwen2"]
    counts = []
    for new in (8, 64, 1024):
        with counted_forwards() as calls:
            trial = _estimate(config, rows=2, prompt=8, new=new, kv_cache=True, device="cuda")
        assert trial.status == "ok" and trial.context_tokens == 8 + new - 1
        counts.append(len(calls))
    assert counts[0] == counts[1] == counts[2]
    with every_decode_step(), counted_forwards() as calls:
        _estimate(config, rows=2, prompt=8, new=64, kv_cache=True, device="cuda")
    assert len(calls) > counts[1]  # what the shape saves


def test_a_live_generation_still_runs_every_decode_step() -> None:
    torch.manual_seed(0)
    model = LlamaForCausalLM(CONFIGS["llama"])
    batch = {"input_ids": torch.randint(256, (2, 5))}
    with counted_forwards() as calls:
        trial = memlab.measure(model, batch, InferencePlan(new_tokens=9), steps=1, noise=0)
    assert trial.status == "ok" and trial.context_tokens == 5 + 9 - 1
    assert SKIPPED_DECODE_NOTE not in trial.notes
    assert len(calls) % 9 == 0 and len(calls) >= 9  # each step: a prefill and 8 decode forwards


def test_grow_cache_leaves_what_one_token_steps_leave() -> None:
    # a full layer and a sliding window of 4 (it keeps 3 positions, on a storage of 4 after a one-token step)
    for cache_config in ({"sliding_window": None}, {"sliding_window": 4}):
        config = MistralConfig(**{**CONFIGS["mistral-window"].to_dict(), **cache_config})
        model = MistralForCausalLM(config)
        stepped, grown = new_cache(model), new_cache(model)
        for cache in (stepped, grown):
            for layer in range(config.num_hidden_layers):
                cache.update(torch.zeros(2, 2, 5, 16), torch.zeros(2, 2, 5, 16), layer)
        for _ in range(7):
            for layer in range(config.num_hidden_layers):
                stepped.update(torch.zeros(2, 2, 1, 16), torch.zeros(2, 2, 1, 16), layer)
        assert can_grow(grown)
        grow_cache(grown, 7)
        assert cache_tokens(grown) == cache_tokens(stepped) == 12
        assert cache_bytes(grown) == cache_bytes(stepped)
        for ours, theirs in zip(grown.layers, stepped.layers, strict=True):
            assert ours.keys.shape == theirs.keys.shape and ours.values.shape == theirs.values.shape


def test_a_cache_of_another_kind_is_not_grown() -> None:
    from transformers import DynamicCache

    assert not can_grow(DynamicCache())  # nothing in it yet
    assert not can_grow(None)

