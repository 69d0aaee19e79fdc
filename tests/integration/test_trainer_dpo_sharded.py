"""TRL's DPOTrainer estimated sharded over GPUs (issue 59): its fused LM head reads ``lm_head.weight`` without
calling ``lm_head``, which shares an FSDP2 group with the final norm (PyTorch's FSDPMemTracker failed on it with a
KeyError naming FSDPLinear); the reference model counted as TRL prepares it for each engine. Tiny Llamas on CPU."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("trl")
pytest.importorskip("peft")
from test_trainer_dpo import _held, _same, dpo  # noqa: E402

import memlab  # noqa: E402
from memlab.trainer.reference import reference_bytes  # noqa: E402


@pytest.mark.parametrize("setup", ["reference", "precomputed", "peft"])
def test_dpo_is_estimated_sharded_with_fsdp2_and_zero3(tmp_path: Any, setup: str) -> None:
    trainer = dpo(tmp_path, setup)
    held = _held(trainer)
    one = memlab.estimate(trainer)
    assert one.status == "ok", one.error
    for strategy in ("fsdp2", "zero3"):
        trial = memlab.estimate(trainer, gpus=2, strategy=strategy)
        assert trial.status == "ok", (strategy, trial.error)
        assert trial.gpus == 2 and trial.strategy == strategy
        assert sum(trial.breakdown.values()) == trial.peak_bytes == sum(trial.detail.values())
        # each GPU's activations are the one-GPU step's (the same micro-batch on every GPU)
        assert trial.detail["activations"] == pytest.approx(one.breakdown["activations"], rel=0.05)
    _same(trainer, held)


def test_the_sharded_reference_is_each_gpus_share_and_fsdp2_gathers_it(tmp_path: Any) -> None:
    trainer = dpo(tmp_path, "reference")
    whole = reference_bytes(trainer.ref_model)
    share = -(-whole // 2)
    notes = {}
    for strategy in ("fsdp2", "zero3", "zero2"):
        trial = memlab.estimate(trainer, gpus=2, strategy=strategy)
        assert trial.status == "ok", trial.error
        notes[strategy] = next(note for note in trial.notes if "reference model" in note)
    assert f"{share:,}-byte share" in notes["fsdp2"] and f"gathered for its forward ({whole:,} bytes)" in notes["fsdp2"]
    assert f"{share:,}-byte share" in notes["zero3"] and "a module at a time" in notes["zero3"]
    assert f"{whole:,} bytes" in notes["zero2"] and "whole on each GPU" in notes["zero2"]
