"""What a 4-bit layer keeps for backward follows the bitsandbytes version: releases before 0.43.2 kept each 4-bit
layer's input (bitsandbytes' changelog for 0.43.2), and the dry run models the installed release or the one named."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from models import lm_batch, tiny_llama

import memlab
from memlab.estimation.dryrun.adapters import bitsandbytes_version, four_bit_keeps_inputs, modelled_bitsandbytes

pytest.importorskip("peft")
bitsandbytes = pytest.importorskip("bitsandbytes")

QLORA = memlab.Plan(adapter="qlora", lora_rank=4, lora_targets=["q_proj", "v_proj"])
QLORA_BF16 = QLORA.replace(precision="bf16")


def keep_inputs_as_before_0_43_2(monkeypatch: pytest.MonkeyPatch) -> None:
    """bitsandbytes' own ``MatMul4Bit`` made to keep its input as 0.41.1's did (``ctx.tensors = (A, B)``)."""
    from bitsandbytes.autograd import _functions

    original = _functions.MatMul4Bit.forward

    def forward(ctx: Any, A: torch.Tensor, B: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        output = original(ctx, A, B, *args, **kwargs)
        if any(ctx.needs_input_grad[:2]):
            ctx.tensors = (A, ctx.tensors[1])
        return output

    monkeypatch.setattr(_functions.MatMul4Bit, "forward", staticmethod(forward))


def test_the_installed_release_is_modelled_unless_another_is_named() -> None:
    assert bitsandbytes_version() == bitsandbytes.__version__
    with modelled_bitsandbytes("0.41.1"):
        assert bitsandbytes_version() == "0.41.1" and four_bit_keeps_inputs(bitsandbytes_version())
    assert bitsandbytes_version() == bitsandbytes.__version__
    assert not four_bit_keeps_inputs("0.43.2") and four_bit_keeps_inputs("0.43.1")
    with pytest.raises(ValueError, match="write one such as '0.41.1'"):
        modelled_bitsandbytes("latest").__enter__()


@pytest.mark.parametrize("plan", [QLORA, QLORA_BF16], ids=["fp32", "bf16-autocast"])
def test_the_inputs_an_old_release_kept_cost_in_the_estimate_what_they_cost_in_a_measurement(
    monkeypatch: pytest.MonkeyPatch, plan: memlab.Plan
) -> None:
    model, batch = tiny_llama(width=64), lm_batch(rows=4, length=32)
    now = memlab.estimate(model, batch, plan)
    with modelled_bitsandbytes("0.41.1"):
        before = memlab.estimate(model, batch, plan)
    measured_now = memlab.measure(model, batch, plan, steps=1, noise=0, progress=False)
    keep_inputs_as_before_0_43_2(monkeypatch)
    measured_before = memlab.measure(model, batch, plan, steps=1, noise=0, progress=False)
    assert now.status == before.status == measured_now.status == measured_before.status == "ok"
    estimated_extra = before.breakdown["activations"] - now.breakdown["activations"]
    measured_extra = measured_before.breakdown["activations"] - measured_now.breakdown["activations"]
    assert measured_extra > 0.1 * measured_now.breakdown["activations"]  # the old release kept a lot
    assert abs(estimated_extra / measured_extra - 1) <= 0.02, (estimated_extra, measured_extra)
    assert any("0.41.1 (before 0.43.2) keeps each 4-bit layer's input" in note for note in before.notes)
    assert not any("keeps each 4-bit layer's input" in note for note in now.notes)


def test_adapters_on_a_4bit_load_keep_the_inputs_an_old_release_kept() -> None:
    from transformers import LlamaConfig

    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=2, vocab_size=256)
    shapes = {"input_ids": (2, 32), "labels": (2, 32)}
    four_bit = {"torch_dtype": torch.bfloat16, "quantization_config": {"load_in_4bit": True}}
    plan = memlab.Plan(weights="bf16", adapter="lora", lora_rank=4)
    now = memlab.estimate(config, shapes, plan, device="cpu", load=four_bit)
    with modelled_bitsandbytes("0.41.1"):
        before = memlab.estimate(config, shapes, plan, device="cpu", load=four_bit)
    assert before.breakdown["activations"] > now.breakdown["activations"]
    assert any("pip install -U bitsandbytes" in note for note in before.notes)
    in_bf16 = memlab.estimate(config, shapes, plan, device="cpu", load={"torch_dtype": torch.bfloat16})
    with modelled_bitsandbytes("0.41.1"):  # nothing is 4-bit: nothing more is kept, nothing is said
        old_in_bf16 = memlab.estimate(config, shapes, plan, device="cpu", load={"torch_dtype": torch.bfloat16})
    assert old_in_bf16.peak_bytes == in_bf16.peak_bytes and old_in_bf16.notes == in_bf16.notes
