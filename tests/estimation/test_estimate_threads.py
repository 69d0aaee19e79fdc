"""Issue 48: dry runs run with one intra-op thread (the few real tensors they build wake no thread pool), which
changes no estimate and leaves the caller's thread count as it was."""

from __future__ import annotations

import contextlib

import pytest
import torch
from transformers import LlamaConfig

import memlab
from memlab.estimation.dryrun import single_gpu
from memlab.estimation.dryrun.fake import one_thread
from memlab.estimation.estimate import estimate_plans

PLANS = [
    memlab.Plan(),
    memlab.Plan(checkpointing=True),
    memlab.Plan(precision="bf16", weights="bf16"),
    memlab.Plan(adapter="lora", precision="bf16"),
    memlab.Plan(adapter="qlora", precision="bf16", checkpointing=True),
]
SHAPES = {"input_ids": (2, 32), "labels": (2, 32)}


def _config() -> LlamaConfig:
    return LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                       num_key_value_heads=2, vocab_size=256)


def _bytes(report: memlab.Report) -> list[tuple[str, str, int, dict[str, int], int | None]]:
    return [(trial.label, trial.status, trial.peak_bytes, dict(trial.breakdown), trial.reserved_bytes)
            for trial in report]


def test_one_thread_sets_one_and_puts_the_count_back_even_on_error() -> None:
    before = torch.get_num_threads()
    with pytest.raises(RuntimeError), one_thread():
        assert torch.get_num_threads() == 1
        raise RuntimeError("a dry run that fails")
    assert torch.get_num_threads() == before


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_estimates_are_the_same_bytes_with_the_pool_of_threads(device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        one = estimate_plans(_config(), SHAPES, PLANS, device=device)
        assert torch.get_num_threads() == 2  # the caller's count, back after the dry run
        monkeypatch.setattr(single_gpu, "one_thread", contextlib.nullcontext)
        pool = estimate_plans(_config(), SHAPES, PLANS, device=device)
    finally:
        torch.set_num_threads(threads)
    assert [trial.status for trial in one] == ["ok"] * len(PLANS)
    assert _bytes(one) == _bytes(pool)
