"""memlab.fit and memlab.apply on TRL's GRPOTrainer (issue 59): the search over the levers that keep the training the
same (the generations per device x accumulation keeping one optimizer step's generations, checkpointing,
precision, ...), its trials generating as the GRPO measure does with the trainer's arguments set to each plan's
split, the best plan then applied and trained for real with ``trainer.train()`` under ``memlab.watch`` within the
budget; ``apply`` sets the split on the GRPOConfig (the generation batch kept, ``steps_per_generation`` following)
and ``undo`` puts the trainer back. Tiny Llamas on CPU."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("trl")
from test_grpo_step import COMPLETION, FAST, LengthReward, _bytes, _held, _rng, _same, grpo  # noqa: E402

import memlab  # noqa: E402
from memlab import MemlabError  # noqa: E402


class SplitReward(LengthReward):
    """A reward function that also keeps the trainer's generations per device while it scores (what a trial set)."""

    def __init__(self) -> None:
        super().__init__()
        self.trainer: Any = None
        self.per_device: list[int] = []

    def __call__(self, completions: list[Any], completion_ids: list[list[int]], **columns: Any) -> list[float]:
        self.per_device.append(self.trainer.args.per_device_train_batch_size)
        return super().__call__(completions, completion_ids, **columns)


@pytest.mark.parametrize("setup", ["no reference", "reference", "peft"])
def test_fit_best_plan_trains_for_real_within_the_budget(tmp_path: Any, setup: str) -> None:
    trainer = grpo(tmp_path, setup, per_device_train_batch_size=4, gradient_checkpointing=False)
    held = _held(trainer)
    own = memlab.measure(trainer, **FAST)
    assert own.status == "ok" and own.rows_per_step == 4, own.error
    budget = int(own.peak_bytes * 0.8)  # the trainer as set up does not fit: its 4 generations in one micro-batch

    report = memlab.fit(trainer, budget=budget, max_trials=4, **FAST)
    best = report.best
    assert best is not None and best.fits and best.peak_bytes <= budget, [t.plan.label() for t in report.trials]
    assert best.rows_per_step == 4  # the step's generations, whatever the split
    per_device = best.plan.micro_batch or 4 // best.plan.accumulation  # Plan(): all 4 in one micro-batch
    assert any("generated from the train dataset's" in note for note in best.notes)
    names = [name for name, _, _ in best.timeline.phases]
    assert names[0] == "generation" and names[-1] == "optimizer"
    held["rng"] = _rng()
    _same(trainer, held)  # fit leaves the trainer, its models and datasets as they were

    applied = memlab.apply(trainer, best.plan)
    args = trainer.args
    assert (args.per_device_train_batch_size, args.gradient_accumulation_steps) == (per_device,
                                                                                   best.plan.accumulation)
    assert args.generation_batch_size == 4 and args.steps_per_generation == 4 // per_device
    watched = memlab.watch(trainer, budget=budget)
    try:
        trainer.train()
    finally:
        watched.remove()
        applied.undo()
    assert watched.peak_bytes is not None and 0 < watched.peak_bytes <= budget, (watched.peak_bytes, budget)
    assert trainer.args is held["args"] and trainer.train_dataset is held["train_dataset"]
    assert trainer.model is held["model"] and trainer.reward_funcs is held["reward_funcs"]
    assert trainer.ref_model is held["ref_model"] and _bytes(trainer.model) == held["weights"]  # bit-exact
    assert (setup == "peft") == (best.plan.adapter == "lora")  # a peft policy keeps its own adapters
    assert (trainer.args.per_device_train_batch_size, trainer.args.gradient_accumulation_steps) == (4, 1)


def test_a_trial_runs_with_the_trainer_set_to_its_split(tmp_path: Any) -> None:
    """TRL computes the reference log-probs in chunks of per_device_train_batch_size: a plan's trial scores (and so
    computes them) with the trainer's arguments set to the plan's generations per device, and puts them back."""
    reward = SplitReward()
    trainer = grpo(tmp_path, "reference", reward, per_device_train_batch_size=4)
    reward.trainer = trainer
    trial = memlab.measure(trainer, memlab.Plan(micro_batch=1, accumulation=4), **FAST)
    assert trial.status == "ok", trial.error
    assert reward.per_device and set(reward.per_device) == {1} and set(reward.seen) == {COMPLETION}
    reward.per_device.clear()
    assert memlab.measure(trainer, memlab.Plan(accumulation=2), **FAST).status == "ok"  # 2 per device
    assert set(reward.per_device) == {2}
    assert trainer.args.per_device_train_batch_size == 4 and trainer.args.steps_per_generation == 1


def test_apply_sets_the_split_and_undo_puts_the_trainer_back(tmp_path: Any) -> None:
    trainer = grpo(tmp_path, per_device_train_batch_size=4, gradient_checkpointing=False)
    args = trainer.args
    before = {name: getattr(args, name) for name in ("per_device_train_batch_size", "gradient_accumulation_steps",
                                                     "steps_per_generation", "generation_batch_size",
                                                     "gradient_checkpointing", "num_generations")}
    applied = memlab.apply(trainer, memlab.Plan(micro_batch=2, accumulation=2, checkpointing=True))
    new = trainer.args
    assert new is not args and trainer._train_batch_size == 2
    assert (new.per_device_train_batch_size, new.gradient_accumulation_steps, new.steps_per_generation,
            new.generation_batch_size, new.num_generations) == (2, 2, 2, 4, 2)
    assert memlab.Plan.from_trainer(trainer).label() == "mb2x2 ckpt"
    applied.undo()
    assert trainer.args is args and trainer._train_batch_size == 4
    assert {name: getattr(args, name) for name in before} == before

    with pytest.raises(MemlabError, match=r"trains on its 4 generations per optimizer step"):
        memlab.apply(trainer, memlab.Plan(micro_batch=1, accumulation=2))
    assert trainer.args is args and "_memlab_applied" not in vars(trainer)

    # 6 generations per step in rounds of 2 (steps_per_generation=1): 3 per device would not divide a round.
    rounds = grpo(tmp_path, per_device_train_batch_size=2, gradient_accumulation_steps=3, steps_per_generation=1)
    kept = rounds.args
    with pytest.raises(MemlabError, match=r"generates 2 completions at once .* micro_batch=3 .*divides both 2 and 6"):
        memlab.apply(rounds, memlab.Plan(micro_batch=3, accumulation=2))
    assert rounds.args is kept and "_memlab_applied" not in vars(rounds)
    applied = memlab.apply(rounds, memlab.Plan(micro_batch=1, accumulation=6))
    assert (rounds.args.steps_per_generation, rounds.args.generation_batch_size) == (2, 2)
    applied.undo()


def test_the_search_estimates_a_plans_cheap_twin_as_the_whole_step(tmp_path: Any) -> None:
    """fit's search estimates a plan through its cheap twin (at most 2 micro-batches: mb1x2 for mb1x4); a GRPO step
    generates and trains on all of its generations whatever the plan, so the twin is the whole step's estimate."""
    from memlab.kinds.grpo.step import grpo_target
    from memlab.kinds.grpo.suggest import with_grpo_dry_runs

    trainer = grpo(tmp_path, per_device_train_batch_size=4)
    estimate = with_grpo_dry_runs(grpo_target(trainer), trainer).estimate  # what fit searches with
    twin, whole = estimate([memlab.Plan(micro_batch=1, accumulation=2), memlab.Plan(micro_batch=1, accumulation=4)],
                           budget=None, device="cpu", lr=1e-5)
    assert twin.status == whole.status == "ok", (twin.error, whole.error)
    assert twin.plan.label() == "mb1x2" and whole.plan.label() == "mb1x4"
    assert twin.peak_bytes == whole.peak_bytes and twin.breakdown == whole.breakdown

    # fit(dry_run=True): the same GRPO estimates, in order of expected speed, until one fits.
    own = memlab.estimate(trainer, memlab.Plan.from_trainer(trainer), device="cpu")
    report = memlab.fit(trainer, budget=int(own.peak_bytes * 0.8), dry_run=True, progress=False)
    assert report.trials and all(trial.estimated for trial in report.trials)
    assert report.best is not None and report.best.rows_per_step == 4
    assert any("GRPO step: generation peak" in note for note in report.best.notes)


def test_where_nothing_fits_fit_suggests_what_changes_the_training_each_estimated(tmp_path: Any) -> None:
    """A budget under every plan of the space: fit says beta=0 (no reference model), the longest
    max_completion_length and fewer num_generations that are estimated to fit, each saying what it changes; the
    trainer's settings are as they were afterwards."""
    trainer = grpo(tmp_path, "reference", per_device_train_batch_size=4, num_generations=4)
    held = _held(trainer)
    space = {"micro_batch": [4], "checkpointing": [False], "precision": ["fp32"], "optimizer": ["adamw"]}
    plain = memlab.estimate(trainer, memlab.Plan(micro_batch=4))
    without_reference = sum(p.numel() * p.element_size() for p in trainer.ref_model.parameters())
    budget = plain.peak_bytes - without_reference // 2  # beta=0 frees the reference model's weights: it fits
    report = memlab.fit(trainer, budget=budget, space=space, max_trials=2, **FAST)
    assert report.best is None and report.suggestions, [(t.plan.label(), t.status) for t in report.trials]
    said = {trial.notes[0].split(")")[0]: trial for trial in report.suggestions}
    assert "GRPOConfig(beta=0.0" in said and "no reference model" in said["GRPOConfig(beta=0.0"].notes[0]
    shorter = [key for key in said if key.startswith("GRPOConfig(max_completion_length=")]
    assert shorter and "completions cut at" in said[shorter[0]].notes[0]
    longest = int(shorter[0].split("=")[1])
    assert 1 <= longest < COMPLETION and f"{longest} tokens (of {COMPLETION})" in report.shorter_sequences
    assert all(trial.estimated and trial.fits for trial in report.suggestions)
    # The next token more is estimated not to fit: the bisection found the longest.
    with_one_more = memlab.kinds.grpo.suggest._estimate(
        trainer, report.suggestions[0].plan, "max_completion_length", longest + 1,
        {"budget": budget, "device": "cpu", "lr": 1e-5}) if longest + 1 < COMPLETION else None
    assert with_one_more is None or not with_one_more.fits
    assert (trainer.beta, trainer.max_completion_length, trainer.num_generations) == (0.1, COMPLETION, 4)
    assert (trainer.args.per_device_train_batch_size, trainer.args.generation_batch_size) == (4, 4)
    held["rng"] = _rng()
    _same(trainer, held)
