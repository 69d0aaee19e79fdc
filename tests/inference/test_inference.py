"""Inference mode on tiny causal LMs built from configs, on CPU: what bf16, NF4, int8 weights and the KV cache cost,
that the model comes back bit-exact (after measure, compare, fit, and an exception), that estimates on fake tensors
agree with measurements on three architectures, and that bad input says what to write before anything runs.

Every run times one step (``steps=1, noise=0``): memory is what these tests check, never a speed.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from models import assert_same, fingerprint
from torch import nn

import memlab
from memlab.errors import MemlabError, UnsupportedTechnique
from memlab.events import TrialSettled
from memlab.inference import InferencePlan, LargestBatchReport, fit_inference
from memlab.report import InferenceTrial

FAST: dict[str, Any] = {"steps": 1, "warmup": 0, "noise": 0, "progress": False}
VOCAB = 128
LAYERS, HEADS, KV_HEADS, HIDDEN = 2, 8, 2, 256


def gqa_llama() -> nn.Module:
    """A tiny Llama with grouped-query attention (2 kv-heads for 8 heads), its linear layers most of its weights."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        hidden_size=HIDDEN, intermediate_size=4 * HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS, vocab_size=VOCAB, max_position_embeddings=128,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


def small(architecture: str) -> nn.Module:
    import transformers

    shapes = {
        "llama": ("LlamaConfig", "LlamaForCausalLM", dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                                          num_attention_heads=4, num_key_value_heads=2)),
        "gpt2": ("GPT2Config", "GPT2LMHeadModel", dict(n_embd=64, n_layer=2, n_head=4, n_positions=64,
                                                       bos_token_id=0, eos_token_id=0)),
        "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                                          num_attention_heads=4, num_key_value_heads=2)),
    }
    config_name, model_name, sizes = shapes[architecture]
    config = getattr(transformers, config_name)(vocab_size=VOCAB, **sizes)
    torch.manual_seed(0)
    return getattr(transformers, model_name)(config).eval()


def ids(rows: int, tokens: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return {"input_ids": torch.randint(0, VOCAB, (rows, tokens), generator=generator)}


@pytest.fixture(scope="module")
def llama() -> nn.Module:
    return gqa_llama()


def test_bf16_halves_the_parameter_bytes_and_nf4_holds_at_most_35_percent_of_bf16(llama: nn.Module) -> None:
    before = fingerprint(llama)
    plans = [InferencePlan(), InferencePlan(weights="bf16"), InferencePlan(weights="bf16", quantize="nf4")]
    report = memlab.compare(llama, ids(2, 16), plans, **FAST)
    assert [t.status for t in report] == ["ok", "ok", "ok"], [t.error for t in report]
    fp32, bf16, nf4 = (t.breakdown["params"] for t in report)
    assert fp32 == 4 * sum(p.numel() for p in llama.parameters()) + sum(
        b.numel() * b.element_size() for b in llama.buffers()
    )
    assert bf16 * 2 == fp32
    assert nf4 <= 0.35 * bf16, f"NF4 holds {nf4 / bf16:.1%} of bf16's bytes"
    for trial in report:
        assert isinstance(trial, InferenceTrial)
        assert sum(trial.breakdown.values()) == trial.peak_bytes
        assert set(trial.breakdown) == {"params", "activations", "kv_cache", "other"}
    assert_same(before, fingerprint(llama))


def test_int8_weights_run_on_cpu_at_about_a_quarter_of_fp32(llama: nn.Module) -> None:
    before = fingerprint(llama)
    fp32, int8 = memlab.compare(llama, ids(2, 8), [InferencePlan(), InferencePlan(quantize="int8")], **FAST)
    assert int8.status == "ok", int8.error
    assert int8.breakdown["params"] < 0.35 * fp32.breakdown["params"]
    assert_same(before, fingerprint(llama))


def test_kv_cache_bytes_equal_the_formula(llama: nn.Module) -> None:
    rows, tokens, new = 3, 20, 5
    head_dim = HIDDEN // HEADS
    report = memlab.compare(
        llama, ids(rows, tokens),
        [
            InferencePlan(weights="bf16"),
            InferencePlan(new_tokens=new),
            InferencePlan(new_tokens=new, kv_cache=False),
            InferencePlan(kv_cache=False),
        ],
        **FAST,
    )
    prefill, generated, uncached, forward = report
    assert prefill.kv_cache_end_bytes == 2 * LAYERS * KV_HEADS * head_dim * tokens * rows * 2  # bf16
    assert prefill.kv_cache_end_bytes == memlab.kv_cache_bytes(llama.config, tokens=tokens, batch=rows, dtype="bf16")
    assert prefill.breakdown["kv_cache"] == prefill.kv_cache_end_bytes  # the whole prompt's cache is alive at the peak
    # Generating 5 tokens runs the prefill and 4 decode steps, so the cache ends with the prompt and 4 more tokens.
    assert generated.context_tokens == tokens + new - 1
    assert generated.kv_cache_end_bytes == 2 * LAYERS * KV_HEADS * head_dim * (tokens + new - 1) * rows * 4  # fp32
    assert generated.prefill_tokens_per_s and generated.decode_tokens_per_s
    assert uncached.kv_cache_end_bytes == 0 and uncached.breakdown["kv_cache"] == 0
    assert forward.breakdown["kv_cache"] == 0 and forward.prefill_tokens_per_s is None


def test_measure_dispatches_on_the_plan_and_batch_size_repeats_rows(llama: nn.Module) -> None:
    llama.train()  # a model just trained in the notebook: inference runs it in eval mode, then puts the flags back
    try:
        before = fingerprint(llama)
        trial = memlab.measure(llama, ids(2, 8), InferencePlan(batch_size=5, weights="bf16"), **FAST)
        assert_same(before, fingerprint(llama))
    finally:
        llama.eval()
    assert isinstance(trial, InferenceTrial) and trial.status == "ok" and trial.rows_per_step == 5
    assert trial.kv_cache_end_bytes == memlab.kv_cache_bytes(llama.config, tokens=8, batch=5, dtype="bf16")


def test_the_model_comes_back_after_a_failing_forward_and_an_interrupt(llama: nn.Module) -> None:
    state = {"raise": None}

    def hook(module: nn.Module, args: Any) -> None:
        if state["raise"] is not None:
            raise state["raise"]

    handle = llama.model.layers[1].register_forward_pre_hook(hook)
    try:
        before = fingerprint(llama)
        state["raise"] = RuntimeError("boom")
        trial = memlab.measure(llama, ids(2, 8), InferencePlan(weights="bf16", quantize="nf4", new_tokens=3), **FAST)
        assert trial.status == "error" and "boom" in (trial.error or "")
        assert_same(before, fingerprint(llama))
        state["raise"] = KeyboardInterrupt()
        with pytest.raises(KeyboardInterrupt) as caught:
            memlab.compare(llama, ids(2, 8), [InferencePlan(weights="fp16")], **FAST)
        assert len(caught.value.report) == 0  # type: ignore[attr-defined]
        assert_same(before, fingerprint(llama))
    finally:
        handle.remove()


def test_close_contenders_are_timed_again_with_the_noise_rules(llama: nn.Module) -> None:
    # The same work twice (the batch has 2 rows): speeds that overlap within noise are timed again in turn (A B A B)
    # and the report names one best, the other a tie or slower; nothing breaks with inference trials pooled.
    before = fingerprint(llama)
    events: list[Any] = []
    report = memlab.compare(llama, ids(2, 8), [InferencePlan(), InferencePlan(batch_size=2)], steps=2, warmup=0,
                            noise=0.5, time_limit=0.5, progress=False, callback=events.append)
    assert [t.status for t in report] == ["ok", "ok"] and report.best is not None
    for trial in report:
        assert isinstance(trial, InferenceTrial) and len(trial.step_times) >= 2
        assert not trial.step_runs or sum(trial.step_runs) == len(trial.step_times)
    # A live figure is told of each pooled trial (TrialSettled), as for training plans, so it shows the pooled speed.
    settled = {event.index: event.trial for event in events if isinstance(event, TrialSettled)}
    assert settled == {index: trial for index, trial in enumerate(report) if trial.step_runs}
    assert_same(before, fingerprint(llama))


def test_a_budget_makes_an_out_of_memory_trial(llama: nn.Module) -> None:
    trial = memlab.measure(llama, ids(2, 8), InferencePlan(), budget="1MiB", **FAST)
    assert trial.status == "oom" and not trial.fits


def test_fit_finds_the_largest_batch_that_fits(llama: nn.Module) -> None:
    before = fingerprint(llama)
    one_row = memlab.measure(llama, ids(1, 16), InferencePlan(weights="bf16", new_tokens=2), **FAST)
    budget = one_row.peak_bytes + 2 * 2**20  # room for some rows more
    report = fit_inference(llama, ids(1, 16), InferencePlan(weights="bf16", new_tokens=2), budget=budget, **FAST)
    assert isinstance(report, LargestBatchReport)
    best = report.best
    assert best is not None and best.fits and best.rows_per_step is not None and best.rows_per_step > 1
    assert any(t.rows_per_step == best.rows_per_step + 1 and not t.fits for t in report), [
        (t.rows_per_step, t.status) for t in report
    ]
    assert len(report) <= 8
    speed = fit_inference(llama, ids(1, 16), goal="speed", space="weights=fp32,bf16", budget=budget, **FAST)
    assert speed.best is not None and {t.label for t in speed} == {"fp32", "bf16"}
    assert_same(before, fingerprint(llama))


@pytest.mark.parametrize("architecture", ["llama", "gpt2", "qwen2"])
def test_estimate_is_within_ten_percent_of_measure(architecture: str) -> None:
    model = small(architecture)
    before = fingerprint(model)
    plans = [InferencePlan(), InferencePlan(weights="bf16", new_tokens=4), InferencePlan(new_tokens=3, kv_cache=False)]
    measured = memlab.compare(model, ids(2, 24), plans, **FAST)
    estimated = memlab.estimate(model, {"input_ids": (2, 24)}, plans[1], device="cpu")
    assert isinstance(estimated, InferenceTrial) and estimated.estimated
    for trial, guess in zip(measured, [memlab.estimate(model, {"input_ids": (2, 24)}, p, device="cpu") for p in plans],
                            strict=True):
        assert trial.status == guess.status == "ok", (trial.error, guess.error)
        own = trial.peak_bytes - trial.preexisting_bytes  # memory held before the run is no part of an estimate
        assert abs(guess.peak_bytes - own) <= 0.10 * own, (trial.label, guess.peak_bytes, own)
        assert guess.kv_cache_end_bytes == trial.kv_cache_end_bytes
    assert_same(before, fingerprint(model))


@pytest.mark.parametrize("quantize", ["nf4", "int8"])
def test_quantized_weights_are_estimated_from_bitsandbytes_layout(quantize: str) -> None:
    model = small("llama")
    plan = InferencePlan(quantize=quantize)
    trial = memlab.measure(model, ids(2, 24), plan, **FAST)
    guess = memlab.estimate(model, {"input_ids": (2, 24)}, plan, device="cpu")
    assert guess.breakdown["params"] == trial.breakdown["params"]  # the same bytes, scales included
    own = trial.peak_bytes - trial.preexisting_bytes
    assert abs(guess.peak_bytes - own) <= 0.10 * own, (guess.peak_bytes, own)


def test_estimate_gives_the_kv_cache_of_a_long_context_from_a_config() -> None:
    from transformers import LlamaConfig

    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=8192)
    trial = memlab.estimate(config, {"input_ids": (2, 4096)}, InferencePlan(weights="bf16"), device="cpu")
    assert trial.kv_cache_end_bytes == memlab.kv_cache_bytes(config, tokens=4096, batch=2, dtype="bf16")
    assert trial.breakdown["kv_cache"] == trial.kv_cache_end_bytes
    on_cuda = memlab.estimate(config, {"input_ids": (2, 64)}, InferencePlan(weights="bf16"), device="cuda")
    assert on_cuda.status == "ok" and not any("AdamW" in note or "autocast" in note for note in on_cuda.notes)
    nf4 = memlab.estimate(config, {"input_ids": (1, 16)}, InferencePlan(quantize="nf4"), device="cpu")
    assert nf4.status == "ok" and nf4.breakdown["params"] < trial.breakdown["params"]


def test_bad_input_is_one_error_that_says_what_to_write_before_the_model_is_touched(llama: nn.Module) -> None:
    mlp = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    before = fingerprint(llama)
    cases: list[tuple[Any, str]] = [
        (lambda: memlab.measure(mlp, torch.randn(2, 8), InferencePlan(new_tokens=4), **FAST),
         "is not a causal language model.*write new_tokens=0"),
        (lambda: memlab.measure(llama, ids(2, 8), InferencePlan(), loss_fn=lambda m, b: m(**b).logits.sum(), **FAST),
         "drop loss_fn"),
        (lambda: memlab.compare(llama, ids(2, 8), [InferencePlan(), memlab.Plan()], **FAST),
         "is a training plan among inference plans"),
        (lambda: memlab.measure(llama, (ids(2, 8)["input_ids"],), InferencePlan(new_tokens=2), **FAST),
         "write batch = {'input_ids': ids}"),
        (lambda: memlab.measure(nn.Sequential(nn.Linear(8, 2)), torch.randn(2, 8), InferencePlan(quantize="nf4"),
                                **FAST),
         "has none besides its output; write quantize='none'"),
        (lambda: fit_inference(llama, ids(2, 8), **FAST), "needs a budget; write for example budget="),
        (lambda: fit_inference(llama, ids(2, 8), goal="fastest", budget="1GiB", **FAST), "write goal='batch'"),
        (lambda: fit_inference(llama, ids(2, 8), space="weights=fp32,bf16", budget="1GiB", **FAST),
         "space= is for goal='speed'"),
        (lambda: memlab.estimate(llama, {"input_ids": (1, 8)}, InferencePlan(), gpus=2, strategy="fsdp2"),
         "drop gpus= and strategy="),
        (lambda: memlab.estimate(llama, {"input_ids": (1, 8)}, [InferencePlan()], device="cpu"),  # type: ignore[arg-type]
         "estimate takes one plan, and this is a list"),
        (lambda: memlab.measure(llama, ids(2, 8), InferencePlan(), lr=0.1, **FAST),
         "inference runs no optimizer; drop lr"),
        (lambda: fit_inference(llama, ids(2, 8), budget="1GiB", lr=0.1, **FAST), "drop lr"),
        # GPT-2 learned 64 positions: a longer context is an IndexError in the forward, and an estimate on fake
        # tensors (which check no index) would call it fine.
        (lambda: memlab.measure(small("gpt2"), ids(2, 60), InferencePlan(new_tokens=8), **FAST),
         "need 67 positions, and GPT2LMHeadModel learned 64 .* write new_tokens <= 5"),
        (lambda: memlab.estimate(small("gpt2"), {"input_ids": (2, 60)}, InferencePlan(new_tokens=8), device="cpu"),
         "write new_tokens <= 5"),
        (lambda: memlab.estimate(small("gpt2").config, {"input_ids": (1, 100)}, InferencePlan(), device="cpu"),
         "100 tokens of input_ids need 100 positions.*write a shorter batch"),
    ]
    for call, says in cases:
        with pytest.raises(MemlabError, match=says):
            call()
    assert issubclass(UnsupportedTechnique, MemlabError)
    assert_same(before, fingerprint(llama))
