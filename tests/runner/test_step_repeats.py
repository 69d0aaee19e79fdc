"""A dry run leaves out the micro-batches that repeat the one before (``repeats_left_out``), and its answer is the
answer of running every one: the peak, the card figure, the breakdown and the host bytes, on a plain model, with
activation offload, a Trainer's collated micro-batches and a GRPOTrainer's step. A live step runs every one."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

import memlab
from memlab.live import batch as batches
from memlab.runner import step as runner_step
from tests.models import lm_batch, tiny_gpt2, tiny_llama

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _trial(report: Any) -> Any:
    return report.trials[0] if hasattr(report, "trials") else report


def _answer(report: Any) -> tuple[Any, ...]:
    trial = _trial(report)
    assert trial.status == "ok", trial.error
    return trial.peak_bytes, trial.reserved_bytes, dict(trial.breakdown), trial.host_bytes


def _every_micro_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner_step, "repeats_left_out", lambda micro: micro)


def _counted(loss: Any) -> tuple[Any, list[int]]:
    calls: list[int] = []

    def counted(model: Any, batch: Any) -> Any:
        calls.append(1)
        return loss(model, batch)

    return counted, calls


def _lm_loss(model: Any, batch: Any) -> Any:
    return model(**batch).loss


@pytest.mark.parametrize("plan", [
    memlab.Plan(micro_batch=2, accumulation=4, precision="bf16", checkpointing=True),
    memlab.Plan(micro_batch=1, accumulation=8, weights="bf16", optimizer="adafactor"),
    memlab.Plan(micro_batch=2, accumulation=3, offload="activations"),
    memlab.Plan(micro_batch=2, accumulation=4, adapter="lora", lora_rank=4, precision="bf16"),
], ids=["autocast ckpt", "pure bf16", "activation offload", "lora"])
def test_a_dry_run_of_repeats_answers_as_running_every_micro_batch(
        monkeypatch: pytest.MonkeyPatch, plan: memlab.Plan) -> None:
    model, batch = tiny_llama(), lm_batch(rows=8, length=16)
    left_out_loss, left_out_calls = _counted(_lm_loss)
    left_out = memlab.estimate(model, batch, plan, loss_fn=left_out_loss, device="cuda", gpu="H100-80GB")
    with monkeypatch.context() as patched:
        _every_micro_batch(patched)
        every_loss, every_calls = _counted(_lm_loss)
        every = memlab.estimate(model, batch, plan, loss_fn=every_loss, device="cuda", gpu="H100-80GB")
    assert _answer(left_out) == _answer(every)
    # warm-up and tracked step: two micro-batches each, where every one is accumulation's
    assert (len(left_out_calls), len(every_calls)) == (4, 2 * plan.accumulation)
    trial = _trial(left_out)
    assert batches.repeats_note(plan.accumulation, 2) in trial.notes


def test_two_micro_batches_are_both_run_and_say_nothing() -> None:
    loss, calls = _counted(_lm_loss)
    report = memlab.estimate(tiny_gpt2(), lm_batch(rows=4, length=8), memlab.Plan(micro_batch=2, accumulation=2),
                             loss_fn=loss, device="cuda", gpu="H100-80GB")
    trial = _trial(report)
    assert len(calls) == 4
    assert not any(note.startswith("accumulation") for note in trial.notes)


def test_a_live_step_runs_every_micro_batch() -> None:
    loss, calls = _counted(_lm_loss)
    memlab.measure(tiny_gpt2(), lm_batch(rows=8, length=8), memlab.Plan(micro_batch=2, accumulation=4),
                   loss_fn=loss, noise=0)
    assert len(calls) % 4 == 0 and len(calls) >= 8  # each step all four: warm-up, tracked, timed


def test_micro_batches_of_other_shapes_are_run() -> None:
    parts = [torch.zeros(2, 8), torch.zeros(2, 8), torch.zeros(2, 6), torch.zeros(2, 6), torch.zeros(2, 8)]
    assert [tuple(p.shape) for p in batches.repeats_left_out(parts)] == [(2, 8), (2, 8), (2, 6), (2, 8)]
    known = [{"grid": torch.tensor([1, 2])}, {"grid": torch.tensor([1, 2])}, {"grid": torch.tensor([2, 2])}]
    assert len(batches.repeats_left_out(known)) == 3  # the third's values differ: it is run


def test_a_trainers_micro_batches_answer_as_every_one(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    from tests.trainers import make_trainer

    trainer = make_trainer(tmp_path)
    trainer.args.gradient_accumulation_steps = 4
    left_out = memlab.estimate(trainer, device="cuda", gpu="H100-80GB")
    _every_micro_batch(monkeypatch)
    every = memlab.estimate(trainer, device="cuda", gpu="H100-80GB")
    assert _answer(left_out) == _answer(every)


@pytest.mark.parametrize("peft", [False, True], ids=["full", "lora"])
def test_a_grpo_step_answers_as_every_micro_batch(monkeypatch: pytest.MonkeyPatch, tmp_path: Any,
                                                   peft: bool) -> None:
    pytest.importorskip("trl")
    from tests.trl_trainers import make_grpo_trainer

    trainer = make_grpo_trainer(tmp_path, gradient_accumulation_steps=4)
    plan = memlab.Plan(micro_batch=2, accumulation=4, adapter="lora", lora_rank=4) if peft else None
    left_out = memlab.estimate(trainer, plan, device="cuda", gpu="H100-80GB")
    _every_micro_batch(monkeypatch)
    every = memlab.estimate(trainer, plan, device="cuda", gpu="H100-80GB")
    assert _answer(left_out) == _answer(every)
    assert dataclasses.asdict(_trial(left_out).plan) == dataclasses.asdict(_trial(every).plan)
    assert batches.repeats_note(4, 2) in _trial(left_out).notes
