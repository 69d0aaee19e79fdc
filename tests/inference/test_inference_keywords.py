"""memlab's generation passes the KV cache by the keyword the installed transformers names (``cache`` in 5.2x),
so no deprecation warning reaches the user's notebook, measured or estimated."""

from __future__ import annotations

import logging
import warnings

import torch
import transformers
import transformers.utils.logging as hf_logging

import memlab
from memlab.inference import InferencePlan


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_generation_emits_no_deprecation_warning() -> None:
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2))
    batch = {"input_ids": torch.randint(3, 128, (2, 8), generator=torch.Generator().manual_seed(0))}
    hf_logging.warning_once.cache_clear()  # transformers says each deprecation once per process: let it say it again
    handler = _Lines()
    logger = logging.getLogger("transformers")
    logger.addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trial = memlab.measure(model, batch, InferencePlan(new_tokens=3), steps=1, noise=0, progress=False,
                                   verbose=True)
            estimate = memlab.estimate(model, batch, InferencePlan(new_tokens=3), device="cpu")
    finally:
        logger.removeHandler(handler)
    assert trial.status == "ok" and estimate.status == "ok", (trial.error, estimate.error)
    said = handler.lines + [str(w.message) for w in caught]
    assert not [line for line in said if "deprecated" in line or "past_key_values" in line], said
