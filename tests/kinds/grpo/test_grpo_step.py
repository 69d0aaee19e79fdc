"""TRL's GRPOTrainer measured as it runs and estimated on fake tensors (issue 59): generation (the longest prompts,
full-length completions), the reference log-probs where beta != 0 (a reference model, or the peft model with its
adapters off), the old policy's where the config computes them, then forward, backward and the optimizer over one
optimizer step's generations, each phase on the timeline, the estimate's phases within 5% of the measured ones; the
trainer, its models, datasets, RNG and reward functions as they were afterwards. Tiny Llamas on CPU."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

pytest.importorskip("trl")
pytest.importorskip("peft")
import trl  # noqa: E402
from datasets import Dataset  # noqa: E402
from peft import LoraConfig  # noqa: E402
from test_trainer_contract import llama, tokenizer  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

import memlab  # noqa: E402
from memlab import MemlabError  # noqa: E402
from tests.trl_trainers import phase_peaks  # noqa: E402

FAST: dict[str, Any] = {"steps": 1, "warmup": 0, "noise": 0, "progress": False}
COMPLETION = 8


class LengthReward:
    """A reward function that keeps the completion lengths it was shown (what a trial generated)."""

    __name__ = "length_reward"

    def __init__(self) -> None:
        self.seen: list[int] = []

    def __call__(self, completions: list[Any], completion_ids: list[list[int]], **_: Any) -> list[float]:
        self.seen.extend(len(ids) for ids in completion_ids)
        return [float(len(completion)) for completion in completions]


def prompts(count: int = 6) -> Dataset:
    """Prompts of 3 to 3 + count - 1 words: the last is the longest."""
    return Dataset.from_list([{"prompt": " ".join(f"w{(i + j) % 60}" for j in range(3 + i))} for i in range(count)])


def grpo(tmp_path: Any, setup: str = "no reference", reward: Any = None, **settings: Any) -> trl.GRPOTrainer:
    """``setup``: "no reference" (beta=0), "reference" (beta>0: TRL loads a reference model from the policy's
    path), "peft" (beta>0 with a peft_config: the reference is the base with adapters off)."""
    config = dict(output_dir=str(tmp_path / "out"), report_to=[], use_cpu=True, save_strategy="no", max_steps=1,
                  per_device_train_batch_size=2, num_generations=2, max_completion_length=COMPLETION,
                  disable_tqdm=True, bf16=False, seed=0, beta=0.0 if setup == "no reference" else 0.1)
    config.update(settings)
    model = llama()
    if setup == "reference":
        model.save_pretrained(tmp_path / "policy")
        model = LlamaForCausalLM.from_pretrained(tmp_path / "policy")
    peft = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]) if setup == "peft" else None
    return trl.GRPOTrainer(model=model, reward_funcs=reward or LengthReward(), args=trl.GRPOConfig(**config),
                           train_dataset=prompts(), processing_class=tokenizer(), peft_config=peft)


def _held(trainer: Any) -> dict[str, Any]:
    """What the trainer holds, by identity, with copies of what its methods write."""
    names = ("args", "model", "ref_model", "train_dataset", "data_collator", "reward_funcs", "_metrics", "_logs",
             "generation_config", "generation_kwargs", "state", "optimizer")
    held = {name: getattr(trainer, name) for name in names}
    held["reward_items"] = list(trainer.reward_funcs)
    held["attributes"] = set(vars(trainer))
    held["contents"] = copy.deepcopy({"metrics": trainer._metrics, "logs": trainer._logs,
                                      "state": vars(trainer.state), "kwargs": trainer.generation_kwargs,
                                      "min_new_tokens": trainer.generation_config.min_new_tokens})
    # As bytes, not tensors: a measurement counts the process's other tensors as held memory, and an estimate
    # answers for the step alone.
    held["weights"] = _bytes(trainer.model)
    if trainer.ref_model is not None:
        held["reference"] = _bytes(trainer.ref_model)
    held["rng"] = _rng()
    return held


def _bytes(model: Any) -> dict[str, bytes]:
    return {k: v.detach().numpy().tobytes() for k, v in model.state_dict().items()}


def _rng() -> bytes:
    return bytes(torch.get_rng_state().numpy().tobytes())


def _same(trainer: Any, held: dict[str, Any]) -> None:
    now = _held(trainer)
    for name in ("args", "model", "ref_model", "train_dataset", "data_collator", "reward_funcs", "_metrics", "_logs",
                 "generation_config", "generation_kwargs", "state", "optimizer"):
        assert now[name] is held[name], name
    assert now["reward_items"] == held["reward_items"] and now["attributes"] == held["attributes"]
    assert repr(now["contents"]) == repr(held["contents"])
    assert now["weights"] == held["weights"]
    if "reference" in held:
        assert now["reference"] == held["reference"]
        assert all(p.grad is None for p in trainer.ref_model.parameters())
    assert now["rng"] == held["rng"]


@pytest.mark.parametrize("setup", ["no reference", "reference", "peft"])
def test_grpo_step_measured_as_it_runs(tmp_path: Any, setup: str) -> None:
    reward = LengthReward()
    trainer = grpo(tmp_path, setup, reward)
    held = _held(trainer)
    own = memlab.Plan.from_trainer(trainer)
    assert (own.adapter == "lora") == (setup == "peft")
    trial = memlab.measure(trainer, **FAST)
    assert trial.status == "ok", trial.error
    assert trial.plan == own and trial.rows_per_step == 2
    # The worst case: the longest prompt (row 5), both completions full length in every step.
    assert "rows 5, 8 tokens" in " ".join(trial.notes) and "max_completion_length=8" in " ".join(trial.notes)
    assert reward.seen and set(reward.seen) == {COMPLETION}
    names = [name for name, _, _ in trial.timeline.phases]
    expected = ["generation", *(["reference"] if setup != "no reference" else []), "forward", "backward", "optimizer"]
    assert names == expected
    assert trial.timeline.peak.phase in expected and trial.timeline.peak.bytes == trial.peak_bytes

    estimated = memlab.estimate(trainer)  # for CUDA, as a user calls it
    assert estimated.status == "ok" and estimated.estimated and estimated.plan == own, estimated.error
    assert [name for name, _, _ in estimated.timeline.phases] == ["generation", "forward", "backward", "optimizer"]
    measured_phases, estimated_phases = phase_peaks(trial.timeline), phase_peaks(estimated.timeline)
    for phase in ("generation", "forward", "backward"):
        ratio = estimated_phases[phase] / measured_phases[phase]
        assert abs(ratio - 1) <= 0.05, (phase, measured_phases[phase], estimated_phases[phase])
    assert abs(estimated.peak_bytes / trial.peak_bytes - 1) <= 0.05
    assert estimated.timeline.peak.phase == trial.timeline.peak.phase
    assert estimated.peak_bytes == estimated.timeline.peak.bytes == sum(estimated.breakdown.values())
    held["rng"] = _rng()  # the runner puts the process's RNG back: compare with it after
    _same(trainer, held)


def test_grpo_plans_keep_the_generations_of_a_step_and_name_the_old_policy(tmp_path: Any) -> None:
    """Two accumulation steps of 2 generations, each generation reused twice (num_iterations=2): TRL computes the
    old policy's log-probs. Plan() is all 4 generations in one micro-batch; the trainer as set up two of 2."""
    trainer = grpo(tmp_path, gradient_accumulation_steps=2, num_iterations=2)
    held = _held(trainer)
    whole, as_set_up = memlab.compare(trainer, plans=[memlab.Plan(), memlab.Plan.from_trainer(trainer)],
                                      **FAST).trials
    assert whole.status == as_set_up.status == "ok", (whole.error, as_set_up.error)
    assert (whole.plan.micro_batch, whole.plan.accumulation, whole.rows_per_step) == (4, 1, 4)
    assert (as_set_up.plan.micro_batch, as_set_up.plan.accumulation, as_set_up.rows_per_step) == (2, 2, 4)
    names = [name for name, _, _ in as_set_up.timeline.phases]
    assert names[:2] == ["generation", "old-policy"] and names.count("forward") == 2
    assert as_set_up.timeline.phases[-1][0] == "optimizer"
    held["rng"] = _rng()
    _same(trainer, held)


def test_a_generation_batch_of_several_steps_holds_the_peak_measured_and_estimated(tmp_path: Any) -> None:
    """steps_per_generation=8: each generation makes 16 completions, of which one optimizer step trains on 2; with
    wide attention heads (head_dim 512) their KV cache outweighs the training step, and the peak is in generation."""
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=4, num_key_value_heads=4, head_dim=512, vocab_size=64,
                                         max_position_embeddings=128, pad_token_id=0))
    args = trl.GRPOConfig(output_dir=str(tmp_path), report_to=[], use_cpu=True, save_strategy="no", max_steps=1,
                          per_device_train_batch_size=2, num_generations=2, max_completion_length=16,
                          steps_per_generation=8, disable_tqdm=True, bf16=False, seed=0, beta=0.0)
    trainer = trl.GRPOTrainer(model=model, reward_funcs=LengthReward(), args=args, train_dataset=prompts(),
                              processing_class=tokenizer())
    measured = memlab.measure(trainer, **FAST)
    estimated = memlab.estimate(trainer)
    assert measured.status == estimated.status == "ok", (measured.error, estimated.error)
    # 8 prompts asked of 6: the longest (row 5) stands in for the 2 missing.
    assert measured.rows_per_step == 2 and "6 longest prompt(s) (rows 0, 1, 2, 3, 4, 5, 8 tokens" in measured.notes[0]
    assert measured.timeline.peak.phase == estimated.timeline.peak.phase == "generation"
    measured_phases, estimated_phases = phase_peaks(measured.timeline), phase_peaks(estimated.timeline)
    for phase in ("generation", "forward", "backward"):
        assert abs(estimated_phases[phase] / measured_phases[phase] - 1) <= 0.05, phase
    assert measured_phases["generation"] > 1.2 * measured_phases["backward"]
    assert estimated.peak_bytes == estimated.timeline.peak.bytes == sum(estimated.breakdown.values())


def test_a_reward_function_that_raises_is_named(tmp_path: Any) -> None:
    def strict_reward(completions: list[Any], **_: Any) -> list[float]:
        raise ValueError("expected a number in the completion")

    trainer = grpo(tmp_path, reward=strict_reward)
    held = _held(trainer)
    with pytest.raises(MemlabError, match=r"the reward function 'strict_reward' raised ValueError: expected a number"):
        memlab.measure(trainer, **FAST)
    held["rng"] = _rng()
    _same(trainer, held)


def test_a_dataset_without_prompts_is_refused_before_anything_runs(tmp_path: Any) -> None:
    trainer = grpo(tmp_path)
    trainer.train_dataset = Dataset.from_list([{"question": "w1 w2"}, {"question": "w3"}])
    held = _held(trainer)
    with pytest.raises(MemlabError, match=r"row 0 of the GRPOTrainer's train_dataset has no 'prompt' \(\['question'\]\)"
                                          r".*Dataset.from_list\(\[\{'prompt': text\}"):
        memlab.measure(trainer, **FAST)
    _same(trainer, held)


def test_the_estimate_calls_no_cuda_and_leaves_the_rng(tmp_path: Any) -> None:
    """DESIGN 2.4: no real CUDA call under a dry run, the generation's included (CUDA made to look initialised)."""
    from test_dryrun_no_cuda import check_route

    trainer = grpo(tmp_path, "peft")
    estimated, _ = check_route(lambda: memlab.estimate(trainer, device="cuda"), trainer.model)
    assert estimated.status == "ok", estimated.error
    assert estimated.timeline.phases[0][0] == "generation"


def test_accumulation_over_generation_rounds_and_plans_that_change_the_generations(tmp_path: Any) -> None:
    """steps_per_generation=1 with 2 accumulation steps: TRL generates 2 completions twice per optimizer step, and the
    trial does the same (two generation phases, 4 rows trained); a plan of other than 4 rows is refused."""
    trainer = grpo(tmp_path, gradient_accumulation_steps=2, steps_per_generation=1)
    trial = memlab.measure(trainer, **FAST)
    assert trial.status == "ok" and trial.rows_per_step == 4, trial.error
    names = [name for name, _, _ in trial.timeline.phases]
    assert names == ["generation", "generation", "forward", "backward", "forward", "backward", "optimizer"]
    for plan, call in ((memlab.Plan(micro_batch=8), memlab.measure), (memlab.Plan(micro_batch=1), memlab.estimate)):
        with pytest.raises(MemlabError, match=r"trains on its 4 generations per optimizer step.*Plan\(accumulation=k"):
            call(trainer, plan)


def test_completions_are_full_length_even_where_the_policy_ends_at_once(tmp_path: Any) -> None:
    """A policy that always puts the end-of-sequence token first (its logit raised by a hook of the user's) would
    generate one-token completions; the trial's worst case generates max_completion_length tokens all the same, and
    the trainer's own generation keeps ending at once afterwards."""
    reward = LengthReward()
    trainer = grpo(tmp_path, reward=reward)
    eos = trainer.processing_class.eos_token_id

    def ends_at_once(module: Any, inputs: Any, logits: torch.Tensor) -> torch.Tensor:
        return logits + 1e4 * torch.nn.functional.one_hot(torch.tensor(eos), logits.shape[-1])

    hook = trainer.model.lm_head.register_forward_hook(ends_at_once)
    try:
        trial = memlab.measure(trainer, **FAST)
        assert trial.status == "ok", trial.error
        assert reward.seen and set(reward.seen) == {COMPLETION}
        reward.seen.clear()
        trainer.model.eval()
        trainer._generate_and_score_completions([{"prompt": "w1 w2"}] * 2)
        assert set(reward.seen) == {1}  # the trainer as it was: no completion forced
    finally:
        hook.remove()


def test_the_generation_holds_a_peft_policys_adapters_in_their_own_dtype(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bf16 policy with peft's LoRA (its adapters kept in fp32, as peft keeps them): the generation's dry run runs
    the weights as TRL generates with them, each in its own dtype (it cast the adapters to bf16)."""
    import memlab.estimation.dryrun.single_gpu as single_gpu

    model = llama().to(torch.bfloat16)
    config = dict(output_dir=str(tmp_path / "out"), report_to=[], use_cpu=True, save_strategy="no", max_steps=1,
                  per_device_train_batch_size=2, num_generations=2, max_completion_length=COMPLETION,
                  disable_tqdm=True, bf16=False, seed=0, beta=0.0)
    trainer = trl.GRPOTrainer(model=model, reward_funcs=LengthReward(), args=trl.GRPOConfig(**config),
                              train_dataset=prompts(), processing_class=tokenizer(),
                              peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    dtypes = {parameter.dtype for parameter in trainer.model.parameters()}
    assert dtypes == {torch.bfloat16, torch.float32}, dtypes
    held = sum(tensor.numel() * tensor.element_size()  # what a dry run counts as params: buffers too (rotary's)
               for tensor in (*trainer.model.parameters(), *trainer.model.buffers()))
    generations: list[Any] = []
    real = single_gpu.dry_run_inference

    def recorded(*args: Any, **kwargs: Any) -> Any:
        report = real(*args, **kwargs)
        generations.extend(report.trials)
        return report

    monkeypatch.setattr(single_gpu, "dry_run_inference", recorded)
    estimated = memlab.estimate(trainer, device="cpu")
    assert estimated.status == "ok", estimated.error
    assert len(generations) == 1 and generations[0].breakdown["params"] == held, (generations, held)
    assert {parameter.dtype for parameter in trainer.model.parameters()} == dtypes  # the trainer's model untouched
    assert "memlab_held_as_loaded" not in vars(trainer.model)
