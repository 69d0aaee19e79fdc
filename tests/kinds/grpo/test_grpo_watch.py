"""memlab.watch and memlab.apply on a TRL GRPOTrainer that trains (issue 59): a watched ``train()`` marks the
generation and the reference and old-policy log-prob passes on the costliest step's timeline, each with its peak, and
leaves the trainer's methods as they were; a plan applied to a trainer that already trained (another split of the
generations) trains, and so does the trainer after ``undo()``. Tiny Llama on CPU."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("trl")
import trl  # noqa: E402
from datasets import Dataset  # noqa: E402
from test_trainer_contract import llama, tokenizer  # noqa: E402
from transformers import LlamaForCausalLM  # noqa: E402

import memlab  # noqa: E402
from memlab.kinds.grpo import GRPO  # noqa: E402
from tests.trl_trainers import phase_peaks  # noqa: E402

GENERATION_METHODS = GRPO.generation_methods


def length_reward(completions: list[Any], **_: Any) -> list[float]:
    return [float(len(completion)) for completion in completions]


def grpo(tmp_path: Any, **overrides: Any) -> trl.GRPOTrainer:
    settings: dict[str, Any] = {"per_device_train_batch_size": 2, "num_generations": 2, "max_steps": 2, "beta": 0.0}
    settings.update(overrides)
    args = trl.GRPOConfig(output_dir=str(tmp_path), report_to=[], use_cpu=True, save_strategy="no",
                          max_completion_length=4, disable_tqdm=True, bf16=False, seed=0, **settings)
    prompts = Dataset.from_list([{"prompt": " ".join(f"w{(i + j) % 60}" for j in range(3 + i))} for i in range(8)])
    model = llama()
    if settings.get("beta", 0.0) != 0.0:  # TRL loads the reference model from the policy's path
        model.save_pretrained(tmp_path / "policy")
        model = LlamaForCausalLM.from_pretrained(tmp_path / "policy")
    return trl.GRPOTrainer(model=model, reward_funcs=length_reward, args=args, train_dataset=prompts,
                           processing_class=tokenizer())


def test_a_watched_grpo_train_marks_generation_reference_and_old_policy(tmp_path: Any) -> None:
    # beta > 0: the reference pass; num_iterations=2: each generation trained on twice, so the old policy's too.
    # One step: the step that generates is the costliest (the only one), its timeline the watch's.
    trainer = grpo(tmp_path, beta=0.1, num_iterations=2, max_steps=1)
    own = {name: getattr(trainer, name) for name in GENERATION_METHODS}
    watched = memlab.watch(trainer)
    try:
        trainer.train()
        # train() put the trainer's methods back, the watch still on: none on the instance, the class's again
        assert not set(GENERATION_METHODS) & set(vars(trainer))
        assert all(getattr(trainer, name) == method for name, method in own.items())
    finally:
        watched.remove()
    timeline = watched.timeline
    assert timeline is not None and watched.peak_step == 1 and timeline.label == "step 1"
    names = [name for name, _, _ in timeline.phases]
    assert names == ["generation", "old-policy", "reference", "forward", "backward", "optimizer"], names
    peaks = phase_peaks(timeline)
    assert all(peaks[name] > 0 for name in names), peaks
    assert max(peaks.values()) <= timeline.peak.bytes == watched.peak_bytes


def test_a_watched_train_that_raises_puts_the_methods_back(tmp_path: Any) -> None:
    trainer = grpo(tmp_path, beta=0.0, max_steps=1)

    def failing(*_: Any, **__: Any) -> Any:
        raise RuntimeError("generation failed")

    trainer._generate = failing  # the user's own override, kept exactly
    watched = memlab.watch(trainer)
    with pytest.raises(RuntimeError, match="generation failed"):
        trainer.train()
    assert vars(trainer)["_generate"] is failing
    assert not {"_generate_and_score_completions", "_get_per_token_logps_and_entropies"} & set(vars(trainer))
    watched.remove()


def test_apply_on_a_trainer_that_trained_then_undo_trains_again(tmp_path: Any) -> None:
    # 4 generations a step, 2 per micro-batch: steps_per_generation 2; the plan makes it 4 (1 per micro-batch).
    trainer = grpo(tmp_path, per_device_train_batch_size=2, gradient_accumulation_steps=2, num_generations=4,
                   max_steps=1)
    trainer.train()
    assert trainer.args.steps_per_generation == 2
    applied = memlab.apply(trainer, memlab.Plan(micro_batch=1, accumulation=4))
    assert trainer.args.steps_per_generation == 4
    trainer.train()  # TRL's buffer from the first train() held 2 micro-batches: IndexError on the old code
    assert trainer.state.global_step == 1
    applied.undo()
    assert trainer.args.steps_per_generation == 2
    trainer.train()
    assert trainer.state.global_step == 1


def samples_each_step(watched: Any) -> list[int]:
    """The samples a watch counted in each step (its samples per second over the step's time)."""
    return [round(step.samples_per_s * step.step_time_s) for step in watched.steps]


def test_a_watched_grpo_step_counts_its_completions_as_the_trainer_does(tmp_path: Any) -> None:
    """issue 71 item 8: memlab.watch reported 0 samples/s on every step of a GRPOTrainer (TRL's own log said 1.274
    samples/s): its training_step is given the prompts, and the rows it trains on are generated inside it."""
    trainer = grpo(tmp_path, gradient_accumulation_steps=2)
    watched = memlab.watch(trainer)
    metrics = trainer.train().metrics
    watched.remove()
    per_step = trainer.args.per_device_train_batch_size * trainer.args.gradient_accumulation_steps  # completions
    assert all(step.samples_per_s > 0 for step in watched.steps)
    assert samples_each_step(watched) == [per_step] * trainer.args.max_steps
    assert sum(samples_each_step(watched)) == round(metrics["train_samples_per_second"] * metrics["train_runtime"])
    # each row's tokens: its prompt's and its completion's (at most max_completion_length)
    assert all(len(step.lengths) == per_step and all(n > 4 for n in step.lengths) for step in watched.steps)
