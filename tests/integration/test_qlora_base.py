"""QLoRA holds the whole base in 4-bit, as 4-bit loading does, and follows the model's own rules for what stays in
higher precision (regression: T5's ``wo``, kept in fp32 by transformers, was quantized and the trial failed with a
raw RuntimeError; with ``lora_targets='attention'`` only the adapted layers were quantized)."""

from __future__ import annotations

import pytest
import torch
from models import assert_same, fingerprint, lm_batch, tiny_gpt2, tiny_llama
from transformers import T5Config, T5ForConditionalGeneration

import memlab
from memlab.techniques.adapters import adapter_targets, attach_adapter, quantized_targets

pytest.importorskip("peft")
bitsandbytes = pytest.importorskip("bitsandbytes")


def tiny_t5() -> T5ForConditionalGeneration:
    torch.manual_seed(0)
    config = T5Config(
        d_model=32, d_ff=64, d_kv=16, num_layers=1, num_heads=2, vocab_size=64, decoder_start_token_id=0, pad_token_id=0
    )
    return T5ForConditionalGeneration(config)


def test_t5_keeps_wo_out_of_quantization_and_the_trial_runs() -> None:
    model = tiny_t5()
    assert "wo" in (model._keep_in_fp32_modules or [])
    assert not [name for name in quantized_targets(model) if name.endswith(".wo")]
    batch = {"input_ids": torch.randint(0, 64, (2, 8)), "labels": torch.randint(0, 64, (2, 8))}
    before = fingerprint(model)
    trial = memlab.measure(model, batch, memlab.Plan(adapter="qlora", lora_rank=4), steps=1, noise=0, progress=False)
    assert trial.status == "ok", trial.error
    assert_same(before, fingerprint(model))


def test_the_t5_estimate_quantizes_what_the_trial_does() -> None:
    model = tiny_t5()
    shapes = {"input_ids": (2, 8), "labels": (2, 8)}
    trial = memlab.estimate(model, shapes, memlab.Plan(adapter="qlora", lora_rank=4), device="cpu")
    assert trial.status == "ok", trial.error


def test_qlora_quantizes_the_whole_base_whatever_lora_targets_adapts() -> None:
    model = tiny_llama(width=64)
    base, attention = set(adapter_targets(model)), adapter_targets(model, "attention")
    undo = attach_adapter(model, memlab.Plan(adapter="qlora", lora_rank=2, lora_targets="attention"))
    try:
        four_bit = {n for n, m in model.named_modules() if isinstance(m, bitsandbytes.nn.Linear4bit)}
        assert {name.removesuffix(".base_layer") for name in four_bit} == base  # every linear layer but the head
        assert len(base) > len(attention)
    finally:
        assert undo is not None
        undo()
    assert not any(isinstance(m, bitsandbytes.nn.Linear4bit) for m in model.modules())
    model(**lm_batch())


def test_qlora_holds_gpt2s_conv1d_layers_in_4bit_as_transformers_loads_them() -> None:
    """transformers' bitsandbytes integration loads GPT-2's Conv1D layers in 4-bit: QLoRA is measured and estimated
    on them, and the model comes back as it was."""
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=32,
                                      bos_token_id=0, eos_token_id=0))
    assert "transformer.h.0.attn.c_attn" in quantized_targets(gpt2) and "lm_head" not in quantized_targets(gpt2)
    shapes = {"input_ids": (1, 8), "labels": (1, 8)}
    estimated = memlab.estimate(gpt2, shapes, memlab.Plan(adapter="qlora"), device="cpu")
    batch = {name: torch.randint(0, 64, shape) for name, shape in shapes.items()}
    before = fingerprint(gpt2)
    measured = memlab.measure(gpt2, batch, memlab.Plan(adapter="qlora"), steps=1, noise=0, progress=False)
    assert estimated.status == measured.status == "ok", (estimated.error, measured.error)
    assert_same(before, fingerprint(gpt2))
    assert estimated.breakdown["optimizer"] == measured.breakdown["optimizer"]  # the same adapters train
    assert abs(estimated.breakdown["params"] - measured.breakdown["params"]) <= 0.1 * measured.breakdown["params"]


@pytest.mark.parametrize("make", ["gpt2", "llama_classifier", "t5"])
def test_to_codes_4bit_layers_are_the_ones_the_trial_quantizes(make: str) -> None:
    """The exported script's quantize_nf4 holds in 4-bit exactly the layers memlab's QLoRA trial does (transformers'
    choice: GPT-2's Conv1D in, a classifier's new head and T5's ``wo`` out), and runs a second time on a model that
    is already in 4-bit without touching it."""
    from transformers import LlamaConfig, LlamaForSequenceClassification

    from memlab.techniques.adapters import quantize_code

    if make == "gpt2":
        model = tiny_gpt2()
    elif make == "llama_classifier":
        model = LlamaForSequenceClassification(LlamaConfig(
            vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
            num_key_value_heads=2, num_labels=3, pad_token_id=0))
    else:
        model = tiny_t5()
    expected = quantized_targets(model)
    namespace = {"torch": torch, "bnb": pytest.importorskip("bitsandbytes"), "model": model}
    exec("\n".join(quantize_code(memlab.Plan(adapter="qlora"))), namespace)  # noqa: S102 (memlab's own export)
    held = [name for name, module in model.named_modules() if type(module).__name__ == "Linear4bit"]
    assert held == expected and held
    exec("\n".join(quantize_code(memlab.Plan(adapter="qlora"))), namespace)  # noqa: S102
    assert [name for name, module in model.named_modules() if type(module).__name__ == "Linear4bit"] == expected
