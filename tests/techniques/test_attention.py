"""The attention lever (memlab.techniques.attention): measured, switched on a live model, and searched by fit.

The attention lever: measured on a tiny Llama (eager keeps the probabilities), the model back exactly, a kernel
that is not here an error trial, the CUDA estimate, the plan's text forms and the exports.

The attention switch: transformers' attn_implementation on a live model, what it keeps, and back exactly.

Issue 61 item 14: ``fit`` on a model loaded with eager attention, at a budget only sdpa fits, answered "nothing
fits" with the eager plan alone: the search's memory model gave every attention kernel the eager plan's activations
(the attention lever entered no activation key), so the sdpa plan was "predicted not to fit" from eager's peak and
never measured. Checked on a tiny Llama at a length where eager's probabilities weigh, then on every causal-LM family
of the zoo that runs eager and can run sdpa."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from models import assert_same, fingerprint, lm_batch, tiny_bert, tiny_llama
from test_zoo import ZOO
from torch import nn
from transformers import LlamaConfig

import memlab
from memlab import Plan
from memlab.errors import MemlabError
from memlab.export.accelerate import accelerate_script
from memlab.plan import parse_grid
from memlab.search.memory import FIT_MARGIN
from memlab.techniques.attention import fused_attention_instead, switch_attention, unavailable

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
