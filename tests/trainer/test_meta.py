"""A trainer whose model is on the meta device (issue 68: one call for a model you cannot build).

``memlab.trainer_on_meta`` builds TRL's GRPOTrainer and DPOTrainer around a meta model (peft's LoRA, bf16 weights);
``memlab.estimate(trainer, gpu=...)`` answers for it what it answers for the same trainer built with its weights, both
phases of a GRPO step; a dry run never runs the live model (TRL's fused LM head kept the live forward in its closure,
and a DPOTrainer's loss reaches the policy and the reference through the trainer); ``measure``, ``compare``, ``fit``
and ``apply`` refuse a meta model with one error that says what to write, nothing changed.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import peft
import pytest
import torch
import trl
from datasets import Dataset
from torch._subclasses.fake_tensor import is_fake
from transformers import LlamaConfig, LlamaForCausalLM

import memlab
from tests.trl_trainers import length_reward, phase_peaks, word_tokenizer

CONFIG = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, vocab_size=64, max_position_embeddings=128, pad_token_id=0)
PROMPTS = [{"prompt": " ".join(f"w{(i + j) % 60}" for j in range(3 + i))} for i in range(6)]
PAIRS = [{"prompt": " ".join(f"w{(i + j) % 60}" for j in range(3 + (i * 5) % 11)),
          "chosen": " ".join(f"w{(i * 3 + j) % 60}" for j in range(2 + i % 4)),
          "rejected": " ".join(f"w{(i * 7 + j) % 60}" for j in range(1 + (i * 3) % 9))} for i in range(6)]


def policy(meta: bool) -> LlamaForCausalLM:
    torch.manual_seed(0)
    with torch.device("meta" if meta else "cpu"):
        return LlamaForCausalLM(CONFIG).to(torch.bfloat16)


def lora() -> peft.LoraConfig:
    return peft.LoraConfig(r=4, lora_alpha=8, target_modules="all-linear")


def grpo(tmp_path: Path, meta: bool, **settings: Any) -> trl.GRPOTrainer:
    config: dict[str, Any] = dict(output_dir=str(tmp_path / "grpo"), report_to=[], use_cpu=True, save_strategy="no",
                                  max_steps=1, per_device_train_batch_size=4, gradient_accumulation_steps=2,
                                  num_generations=4, max_completion_length=16, disable_tqdm=True, bf16=True, seed=0,
                                  beta=0.0)
    config.update(settings)
    keywords = dict(model=policy(meta), reward_funcs=length_reward, args=trl.GRPOConfig(**config),
                    train_dataset=Dataset.from_list(PROMPTS), processing_class=word_tokenizer(), peft_config=lora())
    return memlab.trainer_on_meta(trl.GRPOTrainer, **keywords) if meta else trl.GRPOTrainer(**keywords)


def dpo(tmp_path: Path, meta: bool) -> trl.DPOTrainer:
    args = trl.DPOConfig(output_dir=str(tmp_path / "dpo"), report_to=[], use_cpu=True, save_strategy="no",
                         max_steps=1, per_device_train_batch_size=2, disable_tqdm=True, bf16=True, seed=0)
    keywords = dict(model=policy(meta), args=args, train_dataset=Dataset.from_list(PAIRS),
                    processing_class=word_tokenizer(), peft_config=lora())
    return memlab.trainer_on_meta(trl.DPOTrainer, **keywords) if meta else trl.DPOTrainer(**keywords)


def trial_phase_peaks(trial: memlab.Trial) -> dict[str, int]:
    assert trial.timeline is not None
    return phase_peaks(trial.timeline)


def close(meta: int | None, real: int | None) -> bool:
    assert meta is not None and real is not None
    return abs(meta - real) <= 0.01 * real


@pytest.mark.parametrize("device", [None, "cuda"])
def test_a_grpo_trainer_on_meta_is_estimated_as_with_its_weights(tmp_path: Path, device: str | None) -> None:
    trainer = grpo(tmp_path / "meta", meta=True)
    assert {p.device.type for p in trainer.model.parameters()} == {"meta"}
    assert {p.dtype for p in trainer.model.parameters() if not p.requires_grad} == {torch.bfloat16}
    on_meta = memlab.estimate(trainer, gpu="H100-80GB", device=device)
    built = memlab.estimate(grpo(tmp_path / "real", meta=False), gpu="H100-80GB", device="cuda")
    assert on_meta.status == built.status == "ok", (on_meta.error, built.error)
    assert on_meta.device.startswith("cuda") and on_meta.plan.adapter == "lora"
    assert not any("could not be estimated" in note for note in on_meta.notes)
    meta_phases, real_phases = trial_phase_peaks(on_meta), trial_phase_peaks(built)
    assert meta_phases.keys() == real_phases.keys() >= {"generation", "forward", "backward"}
    for phase, nbytes in real_phases.items():  # both phases: the generation's and the training's
        assert close(meta_phases[phase], nbytes), phase
    assert close(on_meta.peak_bytes, built.peak_bytes)
    assert close(on_meta.reserved_bytes, built.reserved_bytes)
    for category, nbytes in built.breakdown.items():
        assert abs(on_meta.breakdown[category] - nbytes) <= 0.01 * built.peak_bytes, category


def test_a_dpo_trainer_on_meta_is_estimated_as_with_its_weights(tmp_path: Path) -> None:
    on_meta = memlab.estimate(dpo(tmp_path / "meta", meta=True), gpu="H100-80GB")
    built = memlab.estimate(dpo(tmp_path / "real", meta=False), gpu="H100-80GB", device="cuda")
    assert on_meta.status == built.status == "ok", (on_meta.error, built.error)
    assert on_meta.device.startswith("cuda")
    assert close(on_meta.peak_bytes, built.peak_bytes)
    assert close(on_meta.reserved_bytes, built.reserved_bytes)
    assert close(on_meta.breakdown["activations"], built.breakdown["activations"])


def _runs_on(model: torch.nn.Module) -> tuple[list[bool], Callable[[], None]]:
    """For every call of one of ``model``'s linear layers (or a copy's: hooks are copied with it), whether its
    weight was fake."""
    seen: list[bool] = []
    handles = [module.register_forward_hook(lambda module, args, out: seen.append(is_fake(module.weight)))
               for module in model.modules() if type(module) is torch.nn.Linear]

    def remove() -> None:
        for handle in handles:
            handle.remove()

    return seen, remove


def test_a_dry_run_never_runs_the_live_policy(tmp_path: Path) -> None:
    # TRL's fused LM head keeps the forward it replaced in its closure: the generation called the live model's
    trainer = grpo(tmp_path, meta=False)
    seen, remove = _runs_on(trainer.model)
    try:
        trial = memlab.estimate(trainer, gpu="H100-80GB", device="cuda")
    finally:
        remove()
    assert trial.status == "ok" and "generation" in trial_phase_peaks(trial)
    assert seen and all(seen), f"{seen.count(False)} of {len(seen)} layer calls ran live weights"


def test_a_dpo_dry_run_never_runs_the_live_reference(tmp_path: Path) -> None:
    # a DPOTrainer's loss runs self.ref_model (and self.model, adapters off): the trainer's, not the copy given it
    args = trl.DPOConfig(output_dir=str(tmp_path / "dpo"), report_to=[], use_cpu=True, save_strategy="no",
                         max_steps=1, per_device_train_batch_size=2, disable_tqdm=True, bf16=False, seed=0)
    trainer = trl.DPOTrainer(model=policy(False).float(), ref_model=policy(False).float(), args=args,
                             train_dataset=Dataset.from_list(PAIRS), processing_class=word_tokenizer())
    seen, remove = _runs_on(trainer.ref_model)
    live, remove_live = _runs_on(trainer.model)
    try:
        trial = memlab.estimate(trainer, device="cuda")
    finally:
        remove()
        remove_live()
    assert trial.status == "ok"
    assert seen and all(seen) and live and all(live)
    assert trainer.ref_model is not None and trainer.model.model.embed_tokens.weight.device.type == "cpu"


def _state(trainer: Any) -> dict[str, Any]:
    model = trainer.model
    return {"vars": {name: id(value) for name, value in vars(trainer).items()}, "args": type(trainer.args),
            "parameters": [(name, id(p), p.device.type, p.dtype, p.requires_grad) for name, p in
                           model.named_parameters()],
            "modules": [(name, type(module), id(module)) for name, module in model.named_modules()],
            "forward": vars(model).get("forward")}


@pytest.mark.parametrize("call", ["measure", "compare", "fit", "apply"])
def test_running_a_meta_trainer_for_real_is_one_error_saying_what_to_write(tmp_path: Path, call: str) -> None:
    trainer = grpo(tmp_path, meta=True)
    before = _state(trainer)
    entry = {"measure": lambda: memlab.measure(trainer),
             "compare": lambda: memlab.compare(trainer, [memlab.Plan(), memlab.Plan(micro_batch=2)]),
             "fit": lambda: memlab.fit(trainer, budget="8GiB"),
             "apply": lambda: memlab.apply(trainer, memlab.Plan(checkpointing=True))}[call]
    with pytest.raises(memlab.MemlabError) as raised:
        entry()
    message = str(raised.value)
    assert f"memlab.{call} runs the step for real" in message and "meta device" in message
    assert "memlab.estimate(trainer, gpu='H100-80GB')" in message
    assert _state(trainer) == before


def test_a_meta_model_given_to_measure_says_to_estimate_it() -> None:
    model = policy(True)
    batch = {"input_ids": torch.zeros(2, 8, dtype=torch.long), "labels": torch.zeros(2, 8, dtype=torch.long)}
    with pytest.raises(memlab.MemlabError, match=r"memlab\.estimate\(model, \{'input_ids'"):
        memlab.measure(model, batch, memlab.Plan())
    assert {p.device.type for p in model.parameters()} == {"meta"}


def test_trainer_on_meta_leaves_the_arguments_as_they_were(tmp_path: Path) -> None:
    args = trl.GRPOConfig(output_dir=str(tmp_path), report_to=[], use_cpu=True, save_strategy="no", bf16=True,
                          per_device_train_batch_size=4, num_generations=4, max_completion_length=8, beta=0.0)
    before = dict(vars(args))
    trainer = memlab.trainer_on_meta(trl.GRPOTrainer, model=policy(True), args=args, reward_funcs=length_reward,
                                     train_dataset=Dataset.from_list(PROMPTS), processing_class=word_tokenizer())
    assert type(args) is trl.GRPOConfig and args.place_model_on_device is None and vars(args).keys() == before.keys()
    assert isinstance(trainer.args, trl.GRPOConfig) and trainer.args.place_model_on_device is False
    assert trainer.args is not args and memlab.Plan.from_training_arguments(trainer.args).micro_batch == 4


def test_trainer_on_meta_refusals(tmp_path: Path) -> None:
    args = trl.GRPOConfig(output_dir=str(tmp_path), report_to=[], use_cpu=True, save_strategy="no", beta=0.0)
    with pytest.raises(memlab.MemlabError, match="not on the meta device; build its trainer as usual"):
        memlab.trainer_on_meta(trl.GRPOTrainer, model=policy(False), args=args, reward_funcs=length_reward)
    with pytest.raises(memlab.MemlabError, match="takes a Trainer class first"):
        memlab.trainer_on_meta(policy(True), model=policy(True), args=args)  # type: ignore[arg-type]
    # a DPOTrainer without peft places the reference model itself: said, with what works
    dpo_args = trl.DPOConfig(output_dir=str(tmp_path / "dpo"), report_to=[], use_cpu=True, save_strategy="no")
    with pytest.raises(memlab.MemlabError, match="pass a peft_config"):
        memlab.trainer_on_meta(trl.DPOTrainer, model=policy(True), ref_model=policy(True), args=dpo_args,
                               train_dataset=Dataset.from_list(PAIRS), processing_class=word_tokenizer())
