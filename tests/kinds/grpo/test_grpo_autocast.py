"""A bf16 GRPO step as trainer.train() runs it (issue 59): accelerate wraps the policy's forward in autocast (and its
outputs in an fp32 copy) when train() prepares the model, so TRL's generation and its reference / old-policy log-probs
compute in bf16 there, not only the training forward. memlab's measured step runs them the same way: the dtypes the
policy's layers compute in, without and with gradients, are train()'s. Tiny Llama on CPU."""

from __future__ import annotations

from typing import Any

import pytest
import torch

pytest.importorskip("trl")
from test_grpo_step import FAST, grpo  # noqa: E402

import memlab  # noqa: E402


def _dtypes_seen(trainer: Any) -> tuple[dict[bool, set[torch.dtype]], Any]:
    """The dtypes a projection of the policy's first layer computes in, by whether gradients were on (generation and
    log-probs without, the training forward with); and the hook's handle. (TRL 1.16 computes the log-probs from the
    head's weight in its fused LM head, so the head module itself sees only the generation.)"""
    seen: dict[bool, set[torch.dtype]] = {True: set(), False: set()}

    def record(module: Any, inputs: Any, output: torch.Tensor) -> None:
        seen[torch.is_grad_enabled()].add(output.dtype)

    return seen, trainer.model.model.layers[0].self_attn.q_proj.register_forward_hook(record)


def test_generation_and_log_probs_run_under_autocast_as_in_train(tmp_path: Any) -> None:
    # steps_per_generation=2 over one accumulation step: TRL computes the old policy's log-probs too.
    trainer = grpo(tmp_path, bf16=True, per_device_train_batch_size=2, steps_per_generation=2,
                   gradient_checkpointing=False)
    assert memlab.Plan.from_trainer(trainer).precision == "bf16"

    measured, handle = _dtypes_seen(trainer)
    try:
        trial = memlab.measure(trainer, **FAST)
    finally:
        handle.remove()
    assert trial.status == "ok", trial.error
    assert [name for name, _, _ in trial.timeline.phases][:2] == ["generation", "old-policy"]

    trained, handle = _dtypes_seen(trainer)
    watched = memlab.watch(trainer)
    try:
        trainer.train()
    finally:
        handle.remove()
    assert watched.peak_bytes > 0
    assert trained == {True: {torch.bfloat16}, False: {torch.bfloat16}}, trained  # what train() computes in
    assert measured == trained, (measured, trained)


def test_a_reference_model_computes_under_autocast_as_in_train(tmp_path: Any) -> None:
    """TRL's reference model held apart (beta > 0 without peft) is prepared by accelerate too, for evaluation: under
    a bf16 plan its log-probs compute in bf16, in train() with the plan written back and in memlab's measured step of
    a trainer built without it (fit's bf16 plans on notebook 14's trainer: the reference computed in fp32 there, a
    peak of 5.76 MB in the reference phase where train() peaked at 4.81 MB in backward)."""
    built = grpo(tmp_path / "built", "reference", per_device_train_batch_size=2, gradient_checkpointing=False)
    written_back = grpo(tmp_path / "bf16", "reference", bf16=True, per_device_train_batch_size=2,
                        gradient_checkpointing=False)

    def reference_dtypes(trainer: Any) -> tuple[set[torch.dtype], Any]:
        seen: set[torch.dtype] = set()
        layer = trainer.ref_model.model.layers[0].self_attn.q_proj
        return seen, layer.register_forward_hook(lambda module, inputs, output: seen.add(output.dtype))

    measured, handle = reference_dtypes(built)
    try:
        trial = memlab.measure(built, memlab.Plan.from_trainer(built).replace(precision="bf16"), **FAST)
    finally:
        handle.remove()
    assert trial.status == "ok", trial.error
    trained, handle = reference_dtypes(written_back)
    try:
        written_back.train()
    finally:
        handle.remove()
    assert trained == {torch.bfloat16}, trained
    assert measured == trained, (measured, trained)
