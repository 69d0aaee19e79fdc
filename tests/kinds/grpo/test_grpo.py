"""TRL's GRPOTrainer and the TRL trainers memlab does not run (issue 59): one MemlabError that says what works
today (watch) and what to write, the trainer untouched; memlab.watch records a real GRPO run. Tiny Llama on CPU."""

from __future__ import annotations

from typing import Any

import pytest
import torch

pytest.importorskip("trl")
import trl  # noqa: E402
from datasets import Dataset  # noqa: E402
from test_trainer_contract import llama, tokenizer  # noqa: E402
from trl_trainers import make_grpo_trainer  # noqa: E402

import memlab  # noqa: E402
from memlab import MemlabError  # noqa: E402


def length_reward(completions: list[Any], **_: Any) -> list[float]:
    return [float(len(completion)) for completion in completions]


def grpo(tmp_path: Any) -> trl.GRPOTrainer:
    args = trl.GRPOConfig(output_dir=str(tmp_path), report_to=[], use_cpu=True, save_strategy="no", max_steps=2,
                          per_device_train_batch_size=2, num_generations=2, max_completion_length=4,
                          disable_tqdm=True, bf16=False, seed=0)
    prompts = Dataset.from_list([{"prompt": " ".join(f"w{(i + j) % 60}" for j in range(3 + i))} for i in range(6)])
    return trl.GRPOTrainer(model=llama(), reward_funcs=length_reward, args=args, train_dataset=prompts,
                           processing_class=tokenizer())


def _state(trainer: Any) -> dict[str, Any]:
    return {"args": trainer.args, "model": trainer.model, "train_dataset": trainer.train_dataset,
            "data_collator": trainer.data_collator, "callbacks": list(trainer.callback_handler.callbacks),
            "weights": {k: v.clone() for k, v in trainer.model.state_dict().items()}}


def test_grpo_is_refused_where_it_is_not_run_yet_with_what_works_and_what_to_write(tmp_path: Any) -> None:
    trainer = grpo(tmp_path)
    before = _state(trainer)
    calls = {"worst_batch": lambda: memlab.trainer.worst_batch(trainer),
             "a batch given": lambda: memlab.measure(trainer, {"input_ids": torch.ones(2, 4, dtype=torch.long)}),
             "limits": lambda: memlab.limits(trainer, memlab.Plan(), budget="64MiB", batch={"input_ids": (2, 16)})}
    for name, call in calls.items():
        with pytest.raises(MemlabError) as refused:
            call()
        said = str(refused.value)
        assert "GRPOTrainer" in said and ("memlab.measure(trainer)" in said or "memlab.estimate(trainer)" in said
                                          or "memlab.limits(trainer, budget=" in said), name
        assert "SFTTrainer, which" not in said and "returned no tensors" not in said, name  # not the SFT advice
        if name == "limits":  # limits varies the trainer's own settings, not a batch
            assert "vary='tokens') for the longest max_completion_length" in said
        if name not in ("a batch given", "limits"):
            assert "memlab.watch(trainer" in said and "2 completions per prompt up to 4 tokens" in said, name
    after = _state(trainer)
    assert all(after[k] is before[k] for k in ("args", "model", "train_dataset", "data_collator"))
    assert after["callbacks"] == before["callbacks"]
    assert all(torch.equal(after["weights"][k], v) for k, v in before["weights"].items())

    # What the refusal says works, works: measure, estimate, fit, apply, and watch on train().
    trial = memlab.measure(trainer, steps=1, warmup=0, noise=0)
    assert trial.status == "ok", trial.error
    assert memlab.estimate(trainer).status == "ok"
    assert memlab.fit(trainer, budget="64MiB", steps=1, noise=0, progress=False, max_trials=2).best is not None
    memlab.apply(trainer, memlab.Plan()).undo()
    watched = memlab.watch(trainer)
    trainer.train()
    assert watched.peak_bytes > 0 and watched.peak_step is not None


def test_other_trl_trainers_are_refused_in_one_sentence(tmp_path: Any) -> None:
    class PPOTrainer(trl.GRPOTrainer):  # a generating TRL trainer of another name, as experimental ones are
        pass

    PPOTrainer.__module__ = "trl.experimental.ppo.ppo_trainer"
    trainer = grpo(tmp_path)
    trainer.__class__ = PPOTrainer
    with pytest.raises(MemlabError, match=r"PPOTrainer's step.*memlab.watch\(trainer"):
        memlab.estimate(trainer)
    with pytest.raises(MemlabError, match=r"does not yet measure, estimate or fit a PPOTrainer's step"):
        memlab.measure(trainer, steps=1, warmup=0, noise=0)  # only GRPO's step is run
    reward = trl.RewardTrainer.__new__(trl.RewardTrainer)  # not generating, not measured: refused before it is read
    with pytest.raises(MemlabError, match=r"does not measure, estimate or fit a TRL RewardTrainer.*SFTTrainer, "
                                          r"DPOTrainer and GRPOTrainer"):
        memlab.trainer.TrainerSource.from_trainer(reward)


def test_a_grpo_completion_past_the_models_positions_is_one_error_that_says_what_to_write(tmp_path: Any) -> None:
    trainer = make_grpo_trainer(tmp_path, max_completion_length=200)  # the tiny Llama has 128 positions
    written = r"max_position_embeddings=128; write GRPOConfig\(max_completion_length=\d+\) or less"
    with pytest.raises(MemlabError, match=written) as refused:
        memlab.estimate(trainer)
    assert trainer.max_completion_length == 200
    longest = int(str(refused.value).split("max_completion_length=")[2].split(")")[0])
    trainer.max_completion_length = longest  # what it says to write is taken
    assert memlab.estimate(trainer).status == "ok"
