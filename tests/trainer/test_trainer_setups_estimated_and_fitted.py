"""What no other trainer test shows: DPO's estimate phase by phase (with a reference model,
precomputed reference log-probs, peft with its adapters off as the reference, peft with precomputed log-probs),
``fit``'s best plan trained under ``watch`` for each DPO set-up, GRPO with a peft policy and beta=0 (no reference),
and the worst batch memlab picks checked against a brute-force scan: the trainer's step estimated on every batch
its train dataset can make. Tiny Llamas on CPU."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

pytest.importorskip("trl")
pytest.importorskip("peft")
import trl  # noqa: E402
from datasets import Dataset  # noqa: E402
from test_dpo import dpo  # noqa: E402
from test_grpo_step import FAST, _bytes, _held, _rng, _same, grpo, phase_peaks  # noqa: E402
from test_trainer_contract import llama, tokenizer  # noqa: E402
from trl_trainers import trained_with  # noqa: E402

import memlab  # noqa: E402
from memlab.sizes import format_bytes  # noqa: E402

DPO_SETUPS = {"reference": ("reference", {}), "precomputed": ("precomputed", {}), "peft": ("peft", {}),
              "peft precomputed": ("peft", {"precompute_ref_log_probs": True})}


DPO_HELD = ("args", "model", "ref_model", "train_dataset", "data_collator", "_metrics", "optimizer")


def dpo_held(trainer: Any) -> dict[str, Any]:
    """What a DPO trainer holds, by identity, and its models' weights as bytes (a CPU measurement counts the
    process's tensors, so copies held as tensors would be measured)."""
    held = {name: getattr(trainer, name) for name in DPO_HELD}
    held["callbacks"] = list(trainer.callback_handler.callbacks)
    held["weights"] = _bytes(trainer.model)
    held["reference"] = None if trainer.ref_model is None else _bytes(trainer.ref_model)
    return held


def dpo_same(trainer: Any, held: dict[str, Any]) -> None:
    now = dpo_held(trainer)
    for name in (*DPO_HELD, "callbacks", "weights", "reference"):
        assert now[name] is held[name] if name in DPO_HELD else now[name] == held[name], name
    if trainer.ref_model is not None:
        assert all(p.grad is None for p in trainer.ref_model.parameters())


def _within(measured: Any, estimated: Any, phases: tuple[str, ...]) -> None:
    ours, theirs = phase_peaks(measured.timeline), phase_peaks(estimated.timeline)
    for phase in phases:
        assert abs(theirs[phase] / ours[phase] - 1) <= 0.05, (phase, ours[phase], theirs[phase])
    assert abs(estimated.peak_bytes / measured.peak_bytes - 1) <= 0.05


@pytest.mark.parametrize("setup", list(DPO_SETUPS))
def test_dpo_each_phase_estimated_within_5_percent_of_the_measured(tmp_path: Any, setup: str) -> None:
    name, settings = DPO_SETUPS[setup]
    trainer = dpo(tmp_path, name, **settings)
    held = dpo_held(trainer)
    measured = memlab.measure(trainer, **FAST)
    estimated = memlab.estimate(trainer)
    assert measured.status == estimated.status == "ok", (measured.error, estimated.error)
    assert [p for p, _, _ in measured.timeline.phases] == [p for p, _, _ in estimated.timeline.phases] == [
        "forward", "backward", "optimizer"]
    _within(measured, estimated, ("forward", "backward", "optimizer"))
    dpo_same(trainer, held)


def test_dpo_estimate_holds_the_reference_model(tmp_path: Any) -> None:
    """The estimate ran the policy alone: a ref_model's weights (57,760 bytes here) were missing from every point,
    the optimizer phase's peak 20% under the measured one."""
    trainer = dpo(tmp_path, "reference")
    measured, estimated = memlab.measure(trainer, **FAST), memlab.estimate(trainer)
    held = (*trainer.ref_model.parameters(), *trainer.ref_model.buffers())
    reference = sum(t.numel() * t.element_size() for t in held)  # 57,728 of weights, 32 of rotary buffers
    assert estimated.breakdown["other"] >= reference and estimated.timeline.peak.bytes == estimated.peak_bytes
    assert min(estimated.timeline.series["other"]) >= reference
    assert any(f"reference model's {format_bytes(reference)} under other" in note for note in estimated.notes), (
        estimated.notes)
    _within(measured, estimated, ("forward", "backward", "optimizer"))


@pytest.mark.parametrize("setup", ["precomputed", "peft", "peft precomputed"])
def test_dpo_fit_best_plan_trained_under_watch_within_the_budget(tmp_path: Any, setup: str) -> None:
    """The reference model's set-up: test_dpo.py's test_dpo_fit_then_trained_under_watch_within_the_budget."""
    name, settings = DPO_SETUPS[setup]
    trainer = dpo(tmp_path, name, **settings)
    held = dpo_held(trainer)
    whole, split = memlab.compare(trainer, plans=[memlab.Plan(), memlab.Plan(accumulation=2)], **FAST).trials
    assert whole.peak_bytes > split.peak_bytes
    budget = (whole.peak_bytes + split.peak_bytes) // 2
    space = {"micro_batch": [2, 1], "checkpointing": [False], "precision": ["fp32"], "optimizer": ["adamw"]}
    report = memlab.fit(trainer, budget=budget, space=space, **FAST)
    assert report.best is not None and report.best.plan.micro_batch == 1 and report.best.rows_per_step == 2
    assert (report.best.plan.adapter == "lora") == (name == "peft")
    dpo_same(trainer, held)
    peak = trained_with(trainer, report.best.plan, budget)
    assert peak is not None and 0 < peak <= budget, (peak, budget)
    assert trainer.args is held["args"] and trainer.model is held["model"]
    assert trainer.train_dataset is held["train_dataset"] and trainer.ref_model is held["ref_model"]
    assert (trainer.args.per_device_train_batch_size, trainer.args.gradient_accumulation_steps) == (2, 1)


def test_grpo_peft_without_a_reference_measured_estimated_fitted_and_trained(tmp_path: Any) -> None:
    """GRPO with a peft policy and beta=0: no reference pass; each phase within 5%, fit's best plan trained."""
    trainer = grpo(tmp_path, "peft", beta=0.0, per_device_train_batch_size=4, gradient_checkpointing=False)
    assert trainer.ref_model is None
    held = _held(trainer)
    measured = memlab.measure(trainer, **FAST)
    assert measured.status == "ok" and measured.plan.adapter == "lora", measured.error
    assert [p for p, _, _ in measured.timeline.phases] == ["generation", "forward", "backward", "optimizer"]
    estimated = memlab.estimate(trainer)
    assert estimated.status == "ok", estimated.error
    _within(measured, estimated, ("generation", "forward", "backward"))
    held["rng"] = _rng()
    _same(trainer, held)

    budget = int(measured.peak_bytes * 0.8)
    report = memlab.fit(trainer, budget=budget, max_trials=4, **FAST)
    best = report.best
    assert best is not None and best.fits and best.rows_per_step == 4 and best.plan.adapter == "lora"
    held["rng"] = _rng()
    _same(trainer, held)
    peak = trained_with(trainer, best.plan, budget)
    assert peak is not None and 0 < peak <= budget, (peak, budget)
    assert trainer.args is held["args"] and trainer.train_dataset is held["train_dataset"]
    assert trainer.model is held["model"] and trainer.reward_funcs is held["reward_funcs"]


def _brute_force(trainer: Any, candidates: Any) -> dict[tuple[int, ...], int]:
    """The trainer's step estimated on each candidate set of rows alone (its train dataset swapped for them)."""
    full = trainer.train_dataset
    peaks = {}
    try:
        for rows in candidates:
            trainer.train_dataset = full.select(list(rows))
            trial = memlab.estimate(trainer)
            assert trial.status == "ok", trial.error
            peaks[tuple(rows)] = trial.peak_bytes
    finally:
        trainer.train_dataset = full
    return peaks


def _words(count: int, start: int) -> str:
    return " ".join(f"w{(start + j) % 60}" for j in range(count))


@pytest.mark.parametrize("rows", [1, 2])
def test_dpo_worst_batch_is_the_largest_of_a_brute_force_scan(tmp_path: Any, rows: int) -> None:
    """Prompt, chosen and rejected words per example. Row 2 (a long chosen, a short rejected) makes the widest
    batch (TRL pads prompt+chosen and prompt+rejected to one width) though the largest in no single column and not
    the largest in all together: ranking examples by the sum of their sequences picked row 0 (6,331,508 bytes
    estimated where row 2 takes 6,866,316)."""
    sizes = [(12, 12, 12), (10, 10, 14), (4, 22, 1), (3, 2, 2), (5, 3, 4)]
    data = Dataset.from_list([{"prompt": _words(p, i), "chosen": _words(c, i + 7), "rejected": _words(r, i + 13)}
                              for i, (p, c, r) in enumerate(sizes)])
    trainer = trl.DPOTrainer(model=llama(), ref_model=llama(), processing_class=tokenizer(), train_dataset=data,
                             args=trl.DPOConfig(output_dir=str(tmp_path), report_to=[], use_cpu=True, max_steps=1,
                                                save_strategy="no", per_device_train_batch_size=rows,
                                                disable_tqdm=True, bf16=False, seed=0))
    peaks = _brute_force(trainer, itertools.combinations(range(len(sizes)), rows))
    worst = memlab.trainer.worst_batch(trainer)
    assert 2 in worst.indices, worst.describe()
    assert peaks[tuple(sorted(worst.indices))] == max(peaks.values())
    assert memlab.estimate(trainer).peak_bytes == max(peaks.values())


@pytest.mark.parametrize("per_device", [2, 4])
@pytest.mark.slow
def test_grpo_worst_prompts_are_the_largest_of_a_brute_force_scan(tmp_path: Any, per_device: int) -> None:
    """Two generations per prompt: a micro-batch of 2 holds one prompt's, of 4 two prompts'; every prompt (or pair)
    estimated with full-length completions."""
    trainer = grpo(tmp_path, "reference", per_device_train_batch_size=per_device)
    prompts = per_device // trainer.num_generations
    peaks = _brute_force(trainer, itertools.combinations(range(len(trainer.train_dataset)), prompts))
    assert len(set(peaks.values())) > 1  # the candidates differ: the scan can tell them apart
    assert memlab.estimate(trainer).peak_bytes == max(peaks.values())
