"""ZeRO estimates of a model with a frozen base (a peft-wrapped model) count the frozen weights (regression: they
counted only the trained parameters, a few KB per GPU for a LoRA run where the base is gigabytes)."""

from __future__ import annotations

import pytest
from models import lm_batch, tiny_llama

import memlab
from memlab.estimation.configs import frozen_count, layer_counts

peft = pytest.importorskip("peft")


def lora_model() -> object:
    model = tiny_llama(width=64)
    return peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))


@pytest.mark.parametrize("gpus", [2, 4])
def test_zero3_parameters_of_a_frozen_base_agree_with_fsdp2(gpus: int) -> None:
    model = lora_model()
    shapes = {name: tuple(tensor.shape) for name, tensor in lm_batch().items()}
    fsdp2 = memlab.estimate(model, shapes, memlab.Plan(), device="cpu", gpus=gpus, strategy="fsdp2")
    zero3 = memlab.estimate(model, shapes, memlab.Plan(), device="cpu", gpus=gpus, strategy="zero3")
    assert fsdp2.status == zero3.status == "ok", (fsdp2.error, zero3.error)
    trained, largest = layer_counts(model)
    base = frozen_count(model)
    assert base > 40 * trained  # a LoRA run: the base is nearly everything
    fsdp2_params = fsdp2.detail["sharded_params"]
    # ZeRO-3: the partition of every weight, frozen ones included (sharded), and one gathered layer (unsharded)
    assert zero3.detail["sharded_params"] == 4 * (trained + base) // gpus
    assert zero3.detail["unsharded_params"] == 4 * largest
    assert abs(zero3.detail["sharded_params"] - fsdp2_params) <= 0.05 * fsdp2_params


def test_zero2_holds_the_whole_frozen_base_on_every_gpu() -> None:
    model = lora_model()
    shapes = {name: tuple(tensor.shape) for name, tensor in lm_batch().items()}
    zero2 = memlab.estimate(model, shapes, memlab.Plan(), device="cpu", gpus=4, strategy="zero2")
    trained, _ = layer_counts(model)
    assert zero2.detail["unsharded_params"] == 4 * (trained + frozen_count(model))
    # master weights and AdamW's state for the trained parameters only (and AdamW's 4-byte step per tensor)
    tensors = sum(1 for p in model.parameters() if p.requires_grad)
    assert abs(zero2.detail["optimizer"] - (4 + 8) * trained / 4) <= 4 * tensors
