"""When no single lever fits, the suggestions combine levers (issue 48): for ten (model, budget) cases where every
single lever is estimated over the budget, the suggestions hold a plan whose own estimate fits."""

from __future__ import annotations

import functools
from typing import Any

import pytest
from transformers import LlamaConfig

from memlab.estimation.estimate import estimate_plans
from memlab.plan import Plan
from memlab.report import Trial
from memlab.search.memory import FIT_MARGIN
from memlab.search.speed import speed_prior
from memlab.search.suggest import combined_suggestions, levers_of

SINGLES = (
    Plan(checkpointing=True), Plan(weights="bf16", precision="bf16"), Plan(adapter="lora"),
    Plan(adapter="qlora", precision="bf16"), Plan(optimizer="adamw8bit"), Plan(optimizer="adafactor"),
    Plan(precision="bf16"), Plan(loss="chunked"), Plan(offload="optimizer"),
)
# (hidden size, layers, vocabulary, rows, tokens): small, so that a dry run takes a fraction of a second
MODELS = ((64, 2, 1024, 4, 64), (96, 2, 1024, 2, 64), (128, 2, 2048, 8, 32), (64, 3, 4096, 4, 32), (96, 1, 2048, 4, 64))
FRACTIONS = (0.9, 0.65)  # of the lowest single lever's figure: no single lever fits


def shapes(rows: int, tokens: int) -> dict[str, tuple[int, int]]:
    return {"input_ids": (rows, tokens), "labels": (rows, tokens)}


@functools.cache
def model_case(index: int) -> tuple[LlamaConfig, dict[str, Any], Trial, int]:
    hidden, layers, vocab, rows, tokens = MODELS[index]
    config = LlamaConfig(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=4, vocab_size=vocab)
    batch = shapes(rows, tokens)
    plain = estimate_plans(config, batch, [Plan()], device="cpu").trials[0]
    micro = [Plan(micro_batch=1, accumulation=rows)] if rows > 1 else []
    singles = estimate_plans(config, batch, [*SINGLES, *micro], device="cpu").trials
    lowest = min(trial.verdict_bytes for trial in singles if trial.status == "ok")
    return config, batch, plain, lowest


@pytest.mark.parametrize("fraction", FRACTIONS)
@pytest.mark.parametrize("index", range(len(MODELS)))
@pytest.mark.slow
def test_a_combination_fits_where_no_single_lever_does(index: int, fraction: float) -> None:
    config, batch, plain, lowest = model_case(index)
    budget = int(lowest * fraction)
    assert plain.verdict_bytes > budget

    def estimate(plans: list[Plan]) -> list[Trial]:
        return estimate_plans(config, batch, plans, device="cpu", budget=budget).trials

    found = combined_suggestions(plain, estimate, budget=budget, rows=batch["input_ids"][0],
                                 prior=speed_prior("cpu"), want=1)
    assert found, f"no combination suggested at {budget} bytes"
    for trial in found:
        # a combination (micro_batch and its accumulation are one lever): no single lever fits here
        assert len({name for name, _ in levers_of(trial.plan)} - {"accumulation"}) >= 2
        again = estimate_plans(config, batch, [trial.plan], device="cpu", budget=budget).trials[0]
        assert again.status == "ok" and again.verdict_bytes * FIT_MARGIN <= budget  # its own estimate fits
