"""memlab.apply on a TRL trainer: the models TRL prepares with its accelerator in ``__init__`` (a reference model, the
reward models among a GRPOTrainer's reward functions) follow the plan's precision in ``train()``, as the policy does.
accelerate wraps a prepared model's forward in autocast under bf16; ``train()`` prepares the policy again for the
plan, these never, so they ran in the precision the trainer was built with (a DPOTrainer built in fp32 and applied
bf16 peaked 1.8x over its estimate: tests/kinds/dpo/test_dpo.py). Tiny Llamas on CPU."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

trl = pytest.importorskip("trl")
from transformers import LlamaConfig, LlamaForSequenceClassification  # noqa: E402
from trl_trainers import make_grpo_trainer, word_tokenizer  # noqa: E402

import memlab  # noqa: E402


def reward_model() -> LlamaForSequenceClassification:
    torch.manual_seed(1)
    return LlamaForSequenceClassification(LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                                      num_attention_heads=2, num_key_value_heads=2, vocab_size=64,
                                                      max_position_embeddings=128, pad_token_id=0, num_labels=1))


def autocast_seen(model: Any, seen: list[bool]) -> Any:
    """A hook inside the model's forward (where accelerate's autocast is entered), recording whether it is on."""
    return model.get_decoder().register_forward_pre_hook(
        lambda module, args: seen.append(torch.is_autocast_enabled("cpu")))


@pytest.mark.parametrize(("built", "plan"), [("fp32", memlab.Plan(precision="bf16")), ("bf16", memlab.Plan())])
def test_reward_and_reference_models_follow_the_plans_precision(tmp_path: Path, built: str, plan: Any) -> None:
    reward = reward_model()
    trainer = make_grpo_trainer(tmp_path, beta=0.04, bf16=built == "bf16", reward_funcs=[reward],
                                reward_processing_classes=[word_tokenizer()])
    models = {"reward": trainer.reward_funcs[0], "reference": trainer.ref_model}
    forwards = {name: vars(model).get("forward") for name, model in models.items()}
    seen: dict[str, list[bool]] = {name: [] for name in models}
    hooks = [autocast_seen(model, seen[name]) for name, model in models.items()]
    with memlab.apply(trainer, plan):
        trainer.train()
    for hook in hooks:
        hook.remove()
    for name in models:  # each ran in the plan's precision, and has its own forward back
        assert seen[name] and set(seen[name]) == {plan.precision == "bf16"}, (name, seen[name])
        assert vars(models[name]).get("forward") is forwards[name], name
