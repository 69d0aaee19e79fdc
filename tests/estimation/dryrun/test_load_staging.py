"""A load's CPU staging in host_bytes (issue 60, DESIGN.md 2.4): an estimate of a config loads it as
``from_pretrained`` does in transformers 5, which materialises every weight in host memory where no device_map is
given, and one checkpoint tensor at a time where bitsandbytes quantizes on the fly; inference trials carry host bytes
too (estimated with load=, measured, and through JSON)."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import memlab
from memlab import Plan
from memlab.estimation.dryrun.load import HOST_OF_LOAD
from memlab.plan import InferencePlan
from memlab.report import Trial
from memlab.report.inference_trial import InferenceTrial
from tests.models import tiny_llama

BATCH = {"input_ids": (2, 32), "labels": (2, 32)}


def _config(layers: int = 2, dtype: str | None = None) -> LlamaConfig:
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=layers, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=256)
    if dtype is not None:
        config.dtype = dtype
    return config


def _bytes_as_loaded(config: LlamaConfig, dtype: torch.dtype) -> int:
    """What the real model holds loaded in ``dtype``: every parameter in it, the buffers as the model makes them."""
    model = LlamaForCausalLM(config)
    return (sum(p.numel() for p in model.parameters()) * dtype.itemsize
            + sum(b.numel() * b.element_size() for b in model.buffers()))


def _staging_notes(trial: Trial) -> list[str]:
    return [note for note in trial.notes if note.startswith(HOST_OF_LOAD)]


def test_a_load_without_device_map_stages_every_weight_in_host_memory() -> None:
    config = _config()
    plain = memlab.estimate(config, BATCH, Plan(), device="cuda")
    assert plain.host_bytes == _bytes_as_loaded(config, torch.float32)  # no dtype recorded: "auto" is fp32
    bf16 = memlab.estimate(config, BATCH, Plan(weights="bf16"), device="cuda")
    assert bf16.host_bytes == _bytes_as_loaded(config, torch.bfloat16)
    [note] = _staging_notes(bf16)
    assert "from_pretrained(name, dtype=torch.bfloat16)" in note and "no device_map" in note


def test_a_quantized_load_stages_one_checkpoint_tensor_at_a_time() -> None:
    config = _config(dtype="bfloat16")
    qlora = memlab.estimate(config, BATCH, Plan(adapter="qlora"), device="cuda")
    largest = max(p.numel() for p in LlamaForCausalLM(config).parameters())  # the embedding, vocab x hidden
    assert qlora.host_bytes == largest * 2  # read in the checkpoint's bf16 before it is quantized on the GPU
    [note] = _staging_notes(qlora)
    assert "largest checkpoint tensor" in note


def test_the_staging_is_carried_to_the_models_depth() -> None:
    config = _config(layers=6)
    assert memlab.estimate(config, BATCH, Plan(), device="cuda").host_bytes == _bytes_as_loaded(config, torch.float32)
    qlora = memlab.estimate(_config(layers=6, dtype="bfloat16"), BATCH, Plan(adapter="qlora"), device="cuda")
    assert qlora.host_bytes == 256 * 64 * 2  # the embedding, whatever the depth


def test_the_step_keeps_more_on_the_host_than_the_load_and_a_live_model_stages_nothing() -> None:
    config = _config()
    offload = memlab.estimate(config, BATCH, Plan(offload="optimizer"), device="cuda")
    assert offload.host_bytes > 2 * _bytes_as_loaded(config, torch.float32)  # fp32 copies and AdamW state
    assert _staging_notes(offload) == []  # the step decided, not the load
    live = memlab.estimate(tiny_llama(), BATCH, Plan(), device="cuda")  # already loaded: nothing to stage
    assert live.host_bytes == 0 and _staging_notes(live) == []


def test_inference_trials_carry_host_bytes() -> None:
    config = _config()
    estimated = memlab.estimate(config, {"input_ids": (2, 32)}, InferencePlan(), device="cuda",
                                load={"dtype": torch.bfloat16}, host_budget="1MiB")
    assert isinstance(estimated, InferenceTrial)
    assert estimated.host_bytes == _bytes_as_loaded(config, torch.bfloat16) and estimated.host_budget == 2**20
    assert _staging_notes(estimated)
    assert Trial.from_dict(estimated.to_dict()).host_bytes == estimated.host_bytes
    over = memlab.estimate(config, {"input_ids": (2, 32)}, InferencePlan(), device="cuda",
                           load={"dtype": torch.bfloat16}, host_budget="64KiB")
    assert not over.fits and over.verdict_figure == "host"
    # measured on the CPU: an inference plan keeps nothing on the host beyond the model, and says so with a 0
    measured = memlab.measure(tiny_llama(), {"input_ids": torch.randint(0, 128, (2, 8))}, InferencePlan(),
                              steps=1)
    assert measured.status == "ok" and measured.host_bytes == 0 and measured.host_budget is not None
    back = Trial.from_dict(measured.to_dict())
    assert isinstance(back, InferenceTrial) and (back.host_bytes, back.host_budget) == (0, measured.host_budget)
