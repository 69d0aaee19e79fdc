"""Issue 48: an FSDP2 dry run of a model whose layers repeat runs five layers and four, and carries the five to the
model's depth (memlab.estimation.sharded.fsdp2.depth): PyTorch's FSDPMemTracker's books and the allocator's model, told
the carried events, must give the estimate of a dry run of every layer, field for field, with the same module
snapshots (what ZeRO and optimizer offload read)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import transformers

import memlab.estimation.sharded.fsdp2.run as fsdp2
from memlab import Plan
from memlab.estimation.configs import meta_model
from memlab.estimation.request import EstimateRequest
from memlab.estimation.sharded.per_gpu import sharded_estimate

LAYERS = 7
SHAPES = {"input_ids": (2, 16), "labels": (2, 16)}
SMALL = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=LAYERS, num_attention_heads=2,
             num_key_value_heads=2, vocab_size=128, max_position_embeddings=64)


def _dry_run(config: Any, plan: Plan, gpus: int, monkeypatch: pytest.MonkeyPatch, *, whole: bool = False,
             device: str = "cuda") -> tuple[Any, list[dict[str, int]], list[bool]]:
    """The FSDP2 dry run of ``plan`` (of memlab's meta model of ``config``, as the command line passes it), its
    module-level snapshots, and whether it was carried from five layers (empty: not tried)."""
    carried: list[bool] = []
    real = fsdp2._carried

    def told(*args: Any) -> Any:
        result = real(*args)
        carried.append(result is not None)
        return result

    with monkeypatch.context() as patch:
        patch.setattr(fsdp2, "_carried", told)
        if whole:
            patch.setattr(fsdp2, "shallow_model", lambda _: None)
        request = fsdp2.ShardedRequest(meta_model(config), SHAPES, plan, gpus, device=device, budget=1 << 30)
        trial, peaks = fsdp2.fsdp2_dry_run(request)
    return trial, peaks, carried


PLANS = {
    "plain": Plan(),
    "bf16 and checkpointing": Plan(precision="bf16", checkpointing=True),
    "optimizer offload": Plan(offload="optimizer"),
}


@pytest.mark.parametrize("name", list(PLANS))
def test_an_fsdp2_dry_run_is_carried_to_the_one_of_every_layer(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    config = transformers.LlamaConfig(**SMALL)
    carried, carried_peaks, tried = _dry_run(config, PLANS[name], 4, monkeypatch)
    whole, whole_peaks, _ = _dry_run(config, PLANS[name], 4, monkeypatch, whole=True)
    assert tried == [True] and carried.status == "ok"
    assert dataclasses.asdict(carried) == dataclasses.asdict(whole)
    assert carried_peaks == whole_peaks


@pytest.mark.slow
def test_gpt2_on_eight_gpus_and_a_cpu_estimate_are_carried_too(monkeypatch: pytest.MonkeyPatch) -> None:
    gpt2 = transformers.GPT2Config(n_layer=LAYERS, n_embd=32, n_head=2, vocab_size=128, n_positions=64,
                                   bos_token_id=0, eos_token_id=0)
    for config, gpus, device in ((gpt2, 8, "cuda"), (transformers.LlamaConfig(**SMALL), 2, "cpu")):
        carried, carried_peaks, tried = _dry_run(config, Plan(), gpus, monkeypatch, device=device)
        whole, whole_peaks, _ = _dry_run(config, Plan(), gpus, monkeypatch, whole=True, device=device)
        assert tried == [True]
        assert dataclasses.asdict(carried) == dataclasses.asdict(whole)
        assert carried_peaks == whole_peaks


def test_zero3_whose_activations_come_from_an_fsdp2_run_is_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    config = transformers.LlamaConfig(**SMALL)
    carried = sharded_estimate(EstimateRequest(meta_model(config), SHAPES, gpus=4, strategy="zero3", device="cuda"))
    monkeypatch.setattr(fsdp2, "shallow_model", lambda _: None)
    whole = sharded_estimate(EstimateRequest(meta_model(config), SHAPES, gpus=4, strategy="zero3", device="cuda"))
    assert dataclasses.asdict(carried) == dataclasses.asdict(whole)


def test_eight_bit_adam_and_shallow_models_are_dry_run_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    """8-bit AdamW's state is computed from the shards' sizes after the run; a model of five layers or fewer has
    nothing to carry."""
    _, _, tried = _dry_run(transformers.LlamaConfig(**SMALL), Plan(optimizer="adamw8bit"), 4, monkeypatch)
    assert tried == []
    _, _, tried = _dry_run(transformers.LlamaConfig(**dict(SMALL, num_hidden_layers=5)), Plan(), 4, monkeypatch)
    assert tried == []
