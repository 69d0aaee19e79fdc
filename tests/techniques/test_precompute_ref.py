"""The precompute_ref lever (memlab.techniques.precompute_ref): declared, exported, and run on a DPOTrainer.

A DPOTrainer's ``precompute_ref`` lever (issue 59): ``Plan(precompute_ref=...)`` exports to a DPOConfig's
``precompute_ref_log_probs`` and reads back; the other exports say it belongs to DPOConfig; a model's own step
refuses it; the panel does not show it.

TRL's ``precompute_ref_log_probs`` as a DPO lever (issue 59, "the levers these trainers add"): ``Plan(
precompute_ref=True)`` estimated on a DPOTrainer that runs its reference in each step, searched by ``fit``, exported to
``DPOConfig`` and refused by ``memlab.apply``. Tiny Llamas on CPU, full fine-tuning with a separate reference model."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch

import memlab
from memlab import MemlabError, Plan
from memlab.frontends.levers import panel_lever_specs
from memlab.plan import LEVERS, parse_grid

trl = pytest.importorskip("trl")
pytest.importorskip("trl")
pytest.importorskip("peft")
from test_dpo import FAST, _held, _same, dpo  # noqa: E402


def _config(tmp_path: Any, **kwargs: Any) -> Any:
    return trl.DPOConfig(output_dir=str(tmp_path), report_to=[], use_cpu=True, **kwargs)


@pytest.mark.parametrize("value", [True, False])
def test_a_dpoconfig_takes_the_lever_and_reads_it_back(tmp_path: Any, value: bool) -> None:
    plan = Plan(micro_batch=2, accumulation=2, precompute_ref=value)
    kwargs = plan.to_training_arguments(trl=trl.DPOConfig)
    assert kwargs["precompute_ref_log_probs"] is value
    back = Plan.from_training_arguments(_config(tmp_path, **kwargs))
    assert back.precompute_ref is (True if value else None)  # False is the config's default: the trainer's own
    assert Plan.from_training_arguments(_config(tmp_path)).precompute_ref is None
    assert "precompute_ref_log_probs" not in Plan(micro_batch=2).to_training_arguments(trl=trl.DPOConfig)


def test_other_exports_say_the_lever_belongs_to_dpoconfig() -> None:
    plan = Plan(micro_batch=2, precompute_ref=True)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        kwargs = plan.to_training_arguments()
    assert not any("precompute" in key for key in kwargs)
    assert any("plan.to_training_arguments(trl=trl.DPOConfig)" in str(w.message) for w in said)
    assert "plan.to_training_arguments(trl=trl.DPOConfig)" in plan.to_code()
    with pytest.raises(MemlabError, match="DPOConfig's precompute_ref_log_probs.*trl=True names no config class"):
        plan.to_training_arguments(trl=True)
    with pytest.raises(MemlabError, match="SFTConfig takes no precompute_ref_log_probs"):
        plan.to_training_arguments(trl=trl.SFTConfig)


def test_the_lever_labels_parses_and_is_hidden_from_the_panel() -> None:
    assert Plan().precompute_ref is None and Plan(precompute_ref=True).label() == "precompute-ref=True"
    assert LEVERS["precompute_ref"].choices == ("on", "off")
    assert parse_grid("precompute_ref=model,on") == [Plan(), Plan(precompute_ref=True)]
    with pytest.raises(MemlabError, match="write True or False"):
        Plan(precompute_ref="yes")
    assert "precompute_ref" in LEVERS and "precompute_ref" not in panel_lever_specs(Plan)


def test_a_models_own_step_refuses_it_before_anything_runs() -> None:
    model, batch = torch.nn.Linear(4, 1), torch.randn(8, 4)
    weights = model.weight.detach().clone()

    def loss(m: Any, b: Any) -> Any:
        return m(b).mean()

    calls = (lambda: memlab.measure(model, batch, Plan(precompute_ref=True), loss_fn=loss, steps=1, noise=0,
                                    progress=False),
             lambda: memlab.estimate(model, batch, Plan(precompute_ref=True), loss_fn=loss))
    for call in calls:
        with pytest.raises(MemlabError, match=r"has no DPOTrainer's reference.*trl=trl.DPOConfig"):
            call()
    assert torch.equal(model.weight, weights)


# one plan pinned, so the search's only axis is the lever
PINNED = {"micro_batch": [2], "checkpointing": [True], "precision": ["fp32"], "optimizer": ["adamw"]}


def _bytes(model: Any) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def test_the_precomputed_estimate_matches_a_precomputed_trainer_without_the_reference(tmp_path: Any) -> None:
    # Measured first, alone: a CPU measurement counts every tensor the process holds (the online trainer's too).
    precomputed = dpo(tmp_path / "precomputed", "precomputed")
    assert precomputed.ref_model is None and memlab.Plan.from_trainer(precomputed).precompute_ref is True
    measured = memlab.measure(precomputed, **FAST)
    assert measured.status == "ok", measured.error
    del precomputed

    trainer = dpo(tmp_path / "online", "reference")
    held = _held(trainer)
    own = memlab.Plan.from_trainer(trainer)
    assert own.precompute_ref is None and not trainer.precompute_ref_logps
    online = memlab.estimate(trainer)
    estimated = memlab.estimate(trainer, own.replace(precompute_ref=True))
    assert estimated.status == "ok" and estimated.plan.precompute_ref is True
    assert abs(estimated.peak_bytes - measured.peak_bytes) <= 0.05 * measured.peak_bytes
    reference = _bytes(trainer.ref_model)
    saved = online.peak_bytes - estimated.peak_bytes
    assert reference <= saved <= reference + 1024  # the reference's weights (its forward is below the peak here)
    said = " ".join(estimated.notes)
    assert "no reference forward in the step" in said and "without ref_model loads none" in said
    _same(trainer, held)
    assert trainer.precompute_ref_logps is False and "ref_chosen_logps" not in trainer.train_dataset.column_names


def test_fit_searches_both_values_and_picks_precompute_where_only_it_fits(tmp_path: Any) -> None:
    trainer = dpo(tmp_path, "reference")
    held = _held(trainer)
    plan = memlab.Plan(micro_batch=2, checkpointing=True)
    online = memlab.estimate(trainer, plan)
    precomputed = memlab.estimate(trainer, plan.replace(precompute_ref=True))
    assert precomputed.peak_bytes < online.peak_bytes
    budget = (online.peak_bytes + precomputed.peak_bytes) // 2
    report = memlab.fit(trainer, budget=budget, dry_run=True, progress=False, space=PINNED)
    assert {trial.plan.precompute_ref for trial in report.trials} == {None, True}
    assert report.best is not None and report.best.plan.precompute_ref is True and report.best.fits
    assert not next(trial for trial in report.trials if trial.plan.precompute_ref is None).fits
    # the answer exported: the keyword that builds the trainer it was estimated for
    kwargs = report.best.plan.to_training_arguments(trl=trl.DPOConfig)
    assert kwargs["precompute_ref_log_probs"] is True
    # A measured search leaves it out: its answer is one memlab.apply takes on this trainer.
    measured = memlab.fit(trainer, budget="1GiB", space=PINNED, **FAST)
    assert measured.best is not None and {trial.plan.precompute_ref for trial in measured.trials} == {None}
    _same(trainer, held)


def test_fit_keeps_a_precomputing_trainers_own_setting(tmp_path: Any) -> None:
    trainer = dpo(tmp_path, "precomputed")
    report = memlab.fit(trainer, budget="1GiB", dry_run=True, progress=False, space=PINNED)
    assert {trial.plan.precompute_ref for trial in report.trials} == {True}


def test_apply_refuses_a_change_and_leaves_the_trainer_untouched(tmp_path: Any) -> None:
    trainer = dpo(tmp_path, "reference")
    held = _held(trainer)
    plan = memlab.Plan.from_trainer(trainer).replace(precompute_ref=True)
    with pytest.raises(MemlabError, match=r"build a new DPOTrainer with DPOConfig\(precompute_ref_log_probs=True"):
        memlab.apply(trainer, plan)
    _same(trainer, held)
    assert trainer.precompute_ref_logps is False and "memlab_applied" not in " ".join(vars(trainer))
    with memlab.apply(trainer, plan.replace(precompute_ref=None)):  # the rest of the plan goes on
        pass
    _same(trainer, held)


def test_the_reverse_and_other_trainers_refuse_with_what_to_write(tmp_path: Any) -> None:
    precomputed = dpo(tmp_path, "precomputed")
    with pytest.raises(MemlabError, match="precompute_ref=None"):
        memlab.estimate(precomputed, memlab.Plan.from_trainer(precomputed).replace(precompute_ref=False))
    assert precomputed.precompute_ref_logps is True


def test_a_live_trial_runs_the_precomputed_step_and_says_the_reference_stays(tmp_path: Any) -> None:
    trainer = dpo(tmp_path, "reference")
    held = _held(trainer)
    trial = memlab.measure(trainer, memlab.Plan.from_trainer(trainer).replace(precompute_ref=True), **FAST)
    assert trial.status == "ok", trial.error
    assert "this live trainer's reference model stays in memory" in " ".join(trial.notes)
    _same(trainer, held)
    assert trainer.precompute_ref_logps is False
