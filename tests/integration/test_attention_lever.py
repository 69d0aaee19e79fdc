"""The attention lever: measured on a tiny Llama (eager keeps the probabilities), the model back exactly, a kernel
that is not here an error trial, the CUDA estimate, the plan's text forms and the exports."""

from __future__ import annotations

import pytest
import torch
from models import assert_same, fingerprint, lm_batch, tiny_llama
from transformers import LlamaConfig

import memlab
from memlab.errors import MemlabError
from memlab.export.accelerate import accelerate_script
from memlab.plan import Plan, parse_grid

ROWS, TOKENS = 4, 24  # 2 layers, 2 heads, fp32, no attention dropout


def _eager_llama() -> torch.nn.Module:
    model = tiny_llama()
    model.set_attn_implementation("eager")
    return model


def _probabilities_minus_logsumexp(model: torch.nn.Module) -> int:
    """What eager keeps for backward beyond sdpa: each layer's fp32 probabilities (rows x heads x tokens^2), less
    the fp32 logsumexp (rows x heads x tokens) sdpa keeps instead."""
    config = model.config
    per_layer = ROWS * config.num_attention_heads * (TOKENS * TOKENS - TOKENS) * 4
    return per_layer * config.num_hidden_layers


@pytest.mark.parametrize("built", ["sdpa", "eager"])
def test_eager_keeps_the_probabilities_measured_and_the_model_comes_back(built: str) -> None:
    model = tiny_llama() if built == "sdpa" else _eager_llama()
    before = fingerprint(model)
    other = "eager" if built == "sdpa" else "sdpa"
    report = memlab.compare(model, lm_batch(rows=ROWS, length=TOKENS), [Plan(), Plan(attention=other)],
                            steps=1, warmup=0, noise=0)
    assert_same(before, fingerprint(model))
    assert model.config._attn_implementation == built
    plain, switched = report.trials
    assert plain.status == switched.status == "ok"
    assert f"attention {other} ran (the plan's attention='{other}')" in switched.notes
    eager, sdpa = (switched, plain) if other == "eager" else (plain, switched)
    extra = eager.breakdown["activations"] - sdpa.breakdown["activations"]
    assert extra == _probabilities_minus_logsumexp(model) == 35_328
    assert eager.peak_bytes - sdpa.peak_bytes == extra
    assert eager.breakdown["params"] == sdpa.breakdown["params"]


def test_a_kernel_that_is_not_here_is_an_error_trial_that_says_what_to_install() -> None:
    model = tiny_llama()
    before = fingerprint(model)
    report = memlab.compare(model, lm_batch(rows=2, length=8), [Plan(), Plan(attention="flash_attention_2")],
                            steps=1, warmup=0, noise=0)
    assert [trial.status for trial in report.trials] == ["ok", "error"]
    assert "pip install flash-attn" in (report.trials[1].error or "")
    assert_same(before, fingerprint(model))
    assert model.config._attn_implementation == "sdpa"


def test_the_cuda_estimate_of_eager_keeps_the_probabilities() -> None:
    config = LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=4, vocab_size=1000)
    rows, tokens = 4, 512
    shapes = {"input_ids": (rows, tokens), "labels": (rows, tokens)}
    eager, sdpa, flash = (memlab.estimate(config, shapes, Plan(precision="bf16", attention=name), device="cuda")
                          for name in ("eager", "sdpa", "flash_attention_2"))
    assert eager.status == sdpa.status == flash.status == "ok"
    # eager under bf16 autocast: softmax in fp32 (its output kept for softmax's backward) and its bf16 copy (kept by
    # the product with V): 6 bytes an element, for every layer. sdpa (flash backend) keeps neither, but keeps for its
    # own backward what eager does not: its bf16 output and its fp32 logsumexp (rows x heads x tokens each)
    heads, head_dim = config.num_attention_heads, config.hidden_size // config.num_attention_heads
    probabilities = rows * heads * tokens * tokens * (4 + 2) * config.num_hidden_layers
    flash_kept = rows * heads * tokens * (head_dim * 2 + 4) * config.num_hidden_layers
    extra = eager.breakdown["activations"] - sdpa.breakdown["activations"]
    assert extra == probabilities - flash_kept == 48_168_960
    assert flash.peak_bytes == sdpa.peak_bytes  # sdpa's flash backend keeps what flash-attention keeps
    assert any("flash_attention_2 estimated as sdpa" in note for note in flash.notes)


def test_the_plan_reads_and_checks_it() -> None:
    assert Plan().attention is None and Plan(attention="eager").label() == "attn-eager"
    grid = parse_grid(["attention=model,eager,sdpa"])
    assert [plan.attention for plan in grid] == [None, "eager", "sdpa"]
    with pytest.raises(MemlabError, match="write one of eager, sdpa, flash_attention_2, flex_attention, or None"):
        Plan(attention="flash")


def test_the_exports_write_it_where_the_model_is_loaded() -> None:
    plan = Plan(attention="sdpa")
    assert "model.set_attn_implementation('sdpa')" in plan.to_code()
    assert "attn_implementation='sdpa'" in accelerate_script(plan)
    assert "attention" not in str(plan.to_training_arguments())
    assert "attn_implementation='sdpa'" in str(plan.to_deepspeed().get("_comment", ""))


def test_the_panel_offers_it_with_the_model_as_loaded_first() -> None:
    from memlab.frontends.jupyter.panel_core import PanelCore
    from memlab.options import RunOptions

    panel = PanelCore(torch.nn.Linear(4, 1), torch.randn(8, 4), RunOptions())
    control = panel.controls["attention"]
    # It shows its first option by name (a drop-down holding None shows an empty box), read as None.
    assert control.value == control.label == "model's" and control.options[0] == "model's"
    assert panel.plan().attention is None
    control.value = "eager"
    assert panel.plan().attention == "eager" and "as the model was loaded" in control.tooltip
    control.value = "model's"  # picked again: the label again, not an empty box
    assert control.label == "model's" and panel.plan().attention is None


def test_fit_searches_sdpa_by_default_on_a_model_that_runs_eager() -> None:
    from memlab.search.fit import fit

    model, batch = _eager_llama(), lm_batch(rows=ROWS, length=TOKENS)
    before = fingerprint(model)
    eager = memlab.measure(model, batch, Plan(), steps=1, warmup=0, noise=0)
    sdpa = memlab.measure(model, batch, Plan(attention="sdpa"), steps=1, warmup=0, noise=0)
    budget = (eager.peak_bytes + sdpa.peak_bytes) // 2  # only sdpa fits
    space = {"micro_batch": [ROWS], "checkpointing": [False], "precision": ["fp32"], "optimizer": ["adamw"],
             "offload": ["none"], "loss": ["full"]}  # every other axis held: attention is the default space's
    report = fit(model, batch, budget=budget, batch_size=ROWS, space=space, steps=1, noise=0, progress=False)
    assert report.best is not None and report.best.plan.attention == "sdpa"
    assert model.config._attn_implementation == "eager"
    assert_same(before, fingerprint(model))
    # A model that already runs sdpa gets no attention axis: nothing to gain.
    assert all(trial.plan.attention is None for trial in fit(
        tiny_llama(), batch, budget="1GiB", batch_size=ROWS, space=space, steps=1, noise=0, progress=False))
