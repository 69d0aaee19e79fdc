"""``memlab.fit(..., dry_run=True, gpu=...)``: a laptop asks the search for a GPU it does not have. The plans that card
runs are searched (fp16 on a T4, offload), each judged on that card's figure, the budget its memory by default, and
each answer is ``memlab.estimate``'s for that GPU; a measured fit refuses ``gpu=``; a GRPOTrainer's dry runs too."""

from __future__ import annotations

from typing import Any

import pytest

import memlab
from memlab.estimation.cuda.gpus import gpu_kind
from tests.models import assert_same, fingerprint, lm_batch, tiny_llama

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

SPACE = {"micro_batch": [4, 2], "checkpointing": [False, True], "optimizer": ["adamw"]}


def test_each_trial_is_the_estimate_for_that_gpu_and_judged_on_its_card() -> None:
    model, batch = tiny_llama(), lm_batch(rows=4, length=16)
    kind = gpu_kind("RTX4090-24GB")
    report = memlab.fit(model, batch, dry_run=True, gpu="RTX4090-24GB", budget="1GiB", space=SPACE, progress=False)
    assert report.trials and report.budget == 2**30
    for trial in report.trials:
        alone = memlab.estimate(model, batch, trial.plan, device="cuda", gpu="RTX4090-24GB", budget="1GiB")
        assert (trial.peak_bytes, trial.reserved_bytes, trial.context_bytes) == (
            alone.peak_bytes, alone.reserved_bytes, alone.context_bytes)
        assert trial.device.startswith("cuda") and trial.context_bytes == kind.context_bytes
        assert trial.fits == (trial.card_bytes <= report.budget)
    assert report.best is not None and "precision" not in SPACE
    assert {trial.plan.precision for trial in report.trials} <= {"fp32", "bf16"}


def test_the_budget_is_the_cards_memory_by_default_and_a_t4_searches_fp16() -> None:
    model, batch = tiny_llama(), lm_batch(rows=2, length=8)
    report = memlab.fit(model, batch, dry_run=True, gpu="T4-16GB", progress=False,
                        space={"micro_batch": [2], "checkpointing": [False], "optimizer": ["adamw"]})
    assert report.budget == gpu_kind("T4-16GB").memory_bytes
    assert report.skipped or report.trials
    searched = {plan.precision for plan in [*(t.plan for t in report.trials), *(p for p, _ in report.skipped)]}
    assert "fp16" in searched and "bf16" not in searched  # a T4 runs no bf16: its fast precision is fp16
    offloads = {plan.offload for plan in [*(t.plan for t in report.trials), *(p for p, _ in report.skipped)]}
    assert "optimizer" in offloads  # a GPU's space: the optimizer state can go to the host


def test_a_measured_fit_refuses_gpu_and_changes_nothing() -> None:
    model, batch = tiny_llama(), lm_batch(rows=2, length=8)
    before = fingerprint(model)
    with pytest.raises(memlab.MemlabError, match=r"write memlab.fit\(\.\.\., dry_run=True, gpu=\.\.\.\)"):
        memlab.fit(model, batch, gpu="RTX4090-24GB", budget="1GiB", progress=False)
    with pytest.raises(memlab.MemlabError, match="is not a GPU memlab knows"):
        memlab.fit(model, batch, dry_run=True, gpu="RTX 9999", budget="1GiB", progress=False)
    with pytest.raises(memlab.MemlabError, match=r"the T4-16GB runs no bf16 .*; write space=\{'precision': \['fp16', "
                                                 r"'fp32'\]\}"):
        memlab.fit(model, batch, dry_run=True, gpu="T4-16GB", space={"precision": ["fp32", "bf16"]}, progress=False)
    assert_same(before, fingerprint(model))


def test_a_grpo_trainers_dry_runs_are_for_that_gpu(tmp_path: Any) -> None:
    pytest.importorskip("trl")
    from tests.trl_trainers import make_grpo_trainer

    trainer = make_grpo_trainer(tmp_path)
    kind = gpu_kind("A100-40GB")
    report = memlab.fit(trainer, dry_run=True, gpu="A100-40GB", progress=False,
                        space={"checkpointing": [False], "optimizer": ["adamw"], "precision": ["fp32"]})
    assert report.budget == kind.memory_bytes and report.best is not None
    alone = memlab.estimate(trainer, report.best.plan, gpu="A100-40GB", budget=kind.memory_bytes)
    assert (report.best.peak_bytes, report.best.card_bytes) == (alone.peak_bytes, alone.card_bytes)
    assert report.best.context_bytes == kind.context_bytes


def test_estimate_with_a_gpu_kind_is_for_that_gpu_wherever_the_model_is() -> None:
    model, batch = tiny_llama(), lm_batch(rows=2, length=8)
    asked = memlab.estimate(model, batch, gpu="L4-24GB")
    assert asked.device.startswith("cuda") and asked.card_bytes is not None
    assert asked.context_bytes == gpu_kind("L4-24GB").context_bytes
    assert asked.peak_bytes == memlab.estimate(model, batch, device="cuda", gpu="L4-24GB").peak_bytes
    on_cpu = memlab.estimate(model, batch, device="cpu", gpu="L4-24GB")  # a device given is kept
    assert on_cpu.device == "cpu" and on_cpu.card_bytes is None


def test_a_dry_run_where_nothing_fits_suggests_what_is_estimated_to() -> None:
    model, batch = tiny_llama(layers=2, width=64), lm_batch(rows=4, length=32)
    space = {"micro_batch": [4], "checkpointing": [False], "optimizer": ["adamw"], "precision": ["fp32"]}
    plain = memlab.estimate(model, batch, memlab.Plan(), device="cpu")
    budget = int(plain.peak_bytes * 0.7)
    before = fingerprint(model)
    report = memlab.fit(model, batch, dry_run=True, budget=budget, space=space, progress=False)
    assert report.best is None and report.suggestions, [t.label for t in report.trials]
    for trial in report.suggestions:  # each the estimate of its plan, and within the budget with room to spare
        alone = memlab.estimate(model, batch, trial.plan, device="cpu", budget=budget)
        assert trial.estimated and trial.fits and trial.peak_bytes == alone.peak_bytes <= budget
        assert trial.plan.label() not in {t.plan.label() for t in report.trials}
    assert_same(before, fingerprint(model))


def test_a_grpo_dry_run_where_nothing_fits_suggests_its_config_changes(tmp_path: Any) -> None:
    pytest.importorskip("trl")
    from test_grpo_step import COMPLETION, grpo

    trainer = grpo(tmp_path, "reference", per_device_train_batch_size=4, num_generations=4)
    space = {"micro_batch": [4], "checkpointing": [False], "precision": ["fp32"], "optimizer": ["adamw"]}
    plain = memlab.estimate(trainer, memlab.Plan(micro_batch=4), device="cpu")
    reference = sum(p.numel() * p.element_size() for p in trainer.ref_model.parameters())
    budget = plain.peak_bytes - reference // 2  # beta=0 frees the reference model's weights: it fits
    report = memlab.fit(trainer, dry_run=True, budget=budget, space=space, progress=False)
    assert report.best is None and report.suggestions, [(t.label, t.peak_bytes, budget) for t in report.trials]
    said = [trial.notes[0] for trial in report.suggestions]
    assert any(note.startswith("GRPOConfig(beta=0.0)") for note in said), said
    assert all(trial.estimated and trial.fits for trial in report.suggestions)
    assert report.shorter_sequences is not None and f"(of {COMPLETION})" in report.shorter_sequences
    assert (trainer.beta, trainer.max_completion_length, trainer.num_generations) == (0.1, COMPLETION, 4)
