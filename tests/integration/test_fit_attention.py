"""Issue 61 item 14: ``fit`` on a model loaded with eager attention, at a budget only sdpa fits, answered "nothing
fits" with the eager plan alone: the search's memory model gave every attention kernel the eager plan's activations
(the attention lever entered no activation key), so the sdpa plan was "predicted not to fit" from eager's peak and
never measured. Checked on a tiny Llama at a length where eager's probabilities weigh, then on every causal-LM family
of the zoo that runs eager and can run sdpa.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from models import assert_same, fingerprint
from test_zoo import ZOO
from torch import nn

import memlab
from memlab import Plan
from memlab.search.memory import FIT_MARGIN
from memlab.techniques.attention import fused_attention_instead

QUICK: dict[str, Any] = dict(steps=1, warmup=0, noise=0, progress=False)
# every axis but attention held, so that sdpa is the only way under the budget
HELD = {"micro_batch": [2], "checkpointing": [False], "precision": ["fp32"], "optimizer": ["adamw"],
        "offload": ["none"], "loss": ["full"]}


def _batch(model: nn.Module, tokens: int) -> dict[str, torch.Tensor]:
    torch.manual_seed(1)
    ids = torch.randint(0, model.config.vocab_size, (2, tokens))
    return {"input_ids": ids, "labels": ids.clone()}


def _only_sdpa_fits(model: nn.Module, batch: Any) -> None:
    """Measure both kernels, put the budget just above sdpa's peak (and eager more than fit's 10% margin over it),
    and fit: the answer must be sdpa, measured, with the model back as it was. (The fingerprint first: its copies are
    memory the process holds, which every trial counts.)"""
    before = fingerprint(model)
    eager = memlab.measure(model, batch, Plan(), **QUICK)
    sdpa = memlab.measure(model, batch, Plan(attention="sdpa"), **QUICK)
    assert eager.status == sdpa.status == "ok", (eager.error, sdpa.error)
    budget = int(sdpa.peak_bytes * 1.04)
    if eager.peak_bytes <= budget * FIT_MARGIN:  # where fit would measure sdpa anyway
        saved = 1 - sdpa.peak_bytes / eager.peak_bytes  # attention dropout sends CPU sdpa to the math backend
        pytest.skip(f"{type(model).__name__}: sdpa saves {saved:.0%} here, too little to test the search")
    report = memlab.fit(model, batch, budget=budget, batch_size=2, space=HELD, **QUICK)
    assert report.best is not None, [(t.plan.label(), t.status, t.peak_bytes, budget) for t in report.trials]
    assert report.best.plan.attention == "sdpa"
    assert model.config._attn_implementation == "eager"
    assert_same(before, fingerprint(model))


def test_fit_measures_sdpa_where_only_sdpa_fits_on_an_eager_llama() -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
        vocab_size=128, max_position_embeddings=256, attn_implementation="eager"))
    _only_sdpa_fits(model, _batch(model, 128))


CAUSAL = [name for name in ("llama", "mistral", "qwen2", "gemma", "phi3", "gpt_neox", "gpt2", "opt", "phi", "qwen3",
                            "starcoder2", "stablelm", "gptj", "codegen", "olmo2", "granite", "nemotron", "persimmon",
                            "biogpt", "gpt_bigcode") if name in ZOO]


@pytest.mark.parametrize("name", CAUSAL)
def test_fit_measures_sdpa_where_only_sdpa_fits_on_every_causal_family(name: str) -> None:
    model, _, _ = ZOO[name]()
    model.set_attn_implementation("eager")
    if not fused_attention_instead(model):
        pytest.skip(f"{name} cannot run sdpa here")
    limit = min(getattr(model.config, name, 10**6) for name in ("max_position_embeddings", "n_positions")
                if hasattr(model.config, name))
    _only_sdpa_fits(model, _batch(model, min(128, limit)))
