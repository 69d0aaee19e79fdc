"""Tiny TRL trainers with ``use_liger_kernel=True`` on CPU, for tests/estimation/dryrun/test_liger.py (and its
subprocess under another liger-kernel release): a Llama or Qwen2 built from its config (nothing is downloaded), wide
enough in its MLP that Liger's kernels move the step's peak, and trainers that call Liger's chunked losses.

TRL 1.16's trainers call none of Liger's losses (``use_liger_kernel`` brings Liger's layer kernels; the loss is TRL's
fused LM head). TRL 0.26.2's did: :class:`LigerLossGRPOTrainer` and :class:`LigerLossDPOTrainer` are TRL 1.16's
trainers whose ``compute_loss`` is TRL 0.26.2's ``compute_liger_loss`` (GRPO) and ``_compute_loss_liger`` (DPO, for a
decoder-only model on TRL 1.16's right-padded batch: no truncation, no padding-free rows), copied from that release.
"""

from __future__ import annotations

import gc
from typing import Any

import torch
import trl
from datasets import Dataset
from trl_trainers import length_reward, word_tokenizer


def causal_lm(family: str = "llama", layers: int = 4) -> Any:
    """A Llama or Qwen2 of 256 hidden units and 2,048 in its MLP over the word tokenizer's 64 tokens: its MLP's and
    norms' activations hold most of a step's peak, which Liger's SwiGLU and RMSNorm change."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    shape = dict(hidden_size=256, intermediate_size=2048, num_hidden_layers=layers, num_attention_heads=4,
                 num_key_value_heads=4, vocab_size=64, max_position_embeddings=1024, pad_token_id=0)
    if family == "qwen2":
        return Qwen2ForCausalLM(Qwen2Config(**shape))
    return LlamaForCausalLM(LlamaConfig(**shape))


def _common(tmp_path: Any, liger: bool, settings: dict[str, Any]) -> dict[str, Any]:
    # gradient checkpointing off (TRL's default is on): each layer's activations held, Liger's kernels' share too
    return {**dict(output_dir=str(tmp_path), report_to=[], use_cpu=True, save_strategy="no", max_steps=2,
                   disable_tqdm=True, bf16=False, seed=0, use_liger_kernel=liger, gradient_checkpointing=False),
            **settings}


def _words(count: int, start: int) -> str:
    return " ".join(f"w{(start + j) % 60}" for j in range(count))


def sft_trainer(tmp_path: Any, liger: bool = True, family: str = "llama", **settings: Any) -> trl.SFTTrainer:
    """Four rows a step of 512 tokens and fewer (padded: the real step builds its attention mask as the dry run
    does), two steps (the second holds the optimizer's state)."""
    rows = [{"input_ids": [(i + j) % 60 + 3 for j in range(512 - 8 * i)]} for i in range(8)]
    config = trl.SFTConfig(**_common(tmp_path, liger, {"per_device_train_batch_size": 4, "max_length": None,
                                                       **settings}))
    return trl.SFTTrainer(model=causal_lm(family), args=config, train_dataset=Dataset.from_list(rows),
                          processing_class=word_tokenizer())


def _pairs() -> Dataset:
    return Dataset.from_list([{"prompt": _words(200 + i, i), "chosen": _words(150 + i, 3 * i),
                               "rejected": _words(140 + 2 * i, 7 * i)} for i in range(4)])


def dpo_trainer(tmp_path: Any, liger: bool = True, family: str = "llama", trainer_class: Any = None,
                **settings: Any) -> trl.DPOTrainer:
    """Two preference pairs a step and a reference model held apart."""
    config = trl.DPOConfig(**_common(tmp_path, liger, {"per_device_train_batch_size": 2, **settings}))
    return (trainer_class or trl.DPOTrainer)(model=causal_lm(family), ref_model=causal_lm(family), args=config,
                                             train_dataset=_pairs(), processing_class=word_tokenizer())


def grpo_trainer(tmp_path: Any, liger: bool = True, family: str = "llama", trainer_class: Any = None,
                 **settings: Any) -> trl.GRPOTrainer:
    """Four completions of exactly 32 tokens (``min_new_tokens``: the estimate's full-length completions, so the
    watched step is the one estimated) to prompts of about 100 tokens, no reference (beta 0)."""
    completion = settings.pop("max_completion_length", 32)
    config = trl.GRPOConfig(**_common(tmp_path, liger, {
        "per_device_train_batch_size": 4, "num_generations": 4, "max_completion_length": completion, "beta": 0.0,
        "generation_kwargs": {"min_new_tokens": completion}, **settings}))
    prompts = Dataset.from_list([{"prompt": _words(100 + i, i)} for i in range(4)])
    return (trainer_class or trl.GRPOTrainer)(model=causal_lm(family), reward_funcs=length_reward, args=config,
                                              train_dataset=prompts, processing_class=word_tokenizer())


class LigerLossGRPOTrainer(trl.GRPOTrainer):
    """TRL 1.16's GRPOTrainer with TRL 0.26.2's Liger loss: the backbone's last hidden states of the completion
    tokens into ``LigerFusedLinearGRPOLoss`` with the LM head's weight (``compute_liger_loss``)."""

    def __init__(self, *args: Any, compiled: bool = True, **kwargs: Any) -> None:
        from liger_kernel.chunked_loss import LigerFusedLinearGRPOLoss

        super().__init__(*args, **kwargs)
        self.liger_grpo_loss = LigerFusedLinearGRPOLoss(
            beta=self.beta, epsilon_low=self.epsilon_low, epsilon_high=self.epsilon_high,
            temperature=self.temperature, use_ref_model=self.beta != 0.0, loss_type=self.loss_type,
            max_completion_length=self.max_completion_length, compiled=compiled)

    def compute_loss(self, model: Any, inputs: Any, return_outputs: bool = False,
                     num_items_in_batch: Any = None) -> Any:
        unwrapped = self.accelerator.unwrap_model(model)
        completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
        input_ids = torch.cat([inputs["prompt_ids"], completion_ids], dim=1)
        attention_mask = torch.cat([inputs["prompt_mask"], completion_mask], dim=1)
        keep = completion_ids.size(1)
        base = unwrapped.get_base_model() if hasattr(unwrapped, "get_base_model") else unwrapped
        hidden = base.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
        hidden = hidden[:, :-1, :][:, -keep:, :]
        loss, _metrics = self.liger_grpo_loss(
            _input=hidden, lin_weight=base.lm_head.weight, selected_token_ids=completion_ids,
            attention_mask=completion_mask, advantages=inputs["advantages"], bias=base.lm_head.bias,
            old_per_token_logps=inputs.get("old_per_token_logps"),
            ref_per_token_logps=inputs.get("ref_per_token_logps"))
        return loss / self.current_gradient_accumulation_steps


class LigerLossDPOTrainer(trl.DPOTrainer):
    """TRL 1.16's DPOTrainer with TRL 0.26.2's Liger loss: the policy's and the reference's last hidden states into
    ``LigerFusedLinearDPOLoss`` with both LM heads' weights (``_compute_loss_liger``), the reference fused too."""

    def __init__(self, *args: Any, compiled: bool = True, **kwargs: Any) -> None:
        from liger_kernel.chunked_loss import LigerFusedLinearDPOLoss

        super().__init__(*args, **kwargs)
        self.dpo_loss_fn = LigerFusedLinearDPOLoss(ignore_index=-100, beta=self.args.beta, use_ref_model=True,
                                                   average_log_prob=False, loss_type="sigmoid", compiled=compiled)

    def compute_loss(self, model: Any, inputs: Any, return_outputs: bool = False,
                     num_items_in_batch: Any = None) -> Any:
        unwrapped = self.accelerator.unwrap_model(model)
        input_ids, attention_mask = inputs["input_ids"], inputs["attention_mask"]
        hidden = unwrapped.get_decoder()(input_ids, attention_mask=attention_mask,
                                         use_cache=False).last_hidden_state[:, :-1]
        reference = self.accelerator.unwrap_model(self.ref_model)
        ref_hidden = reference.get_decoder()(input_ids, attention_mask=attention_mask,
                                             use_cache=False).last_hidden_state[:, :-1]
        labels = torch.where(inputs["completion_mask"] != 0, input_ids, -100)[:, 1:]
        head, ref_head = unwrapped.get_output_embeddings(), reference.get_output_embeddings()
        loss, _outputs = self.dpo_loss_fn(head.weight, hidden, labels, bias=head.bias, ref_input=ref_hidden,
                                          ref_weight=ref_head.weight, ref_bias=ref_head.bias)
        return loss


def watched_peak(trainer: Any, launched: list[str] | None = None) -> int:
    """``trainer.train()`` on this CPU under ``memlab.watch``: its highest step peak. Liger's Triton kernels run as
    NumPy stand-ins (:func:`liger_cpu.liger_on_cpu`), and the module globals Liger's patches set are put back after."""
    from liger_cpu import liger_globals_kept, liger_on_cpu

    import memlab

    with liger_globals_kept(), liger_on_cpu(launched):
        watched = memlab.watch(trainer, show=False)
        try:
            trainer.train()
        finally:
            watched.remove()
    assert watched.peak_bytes is not None
    return int(watched.peak_bytes)


def estimated_step(trainer: Any) -> tuple[int, Any]:
    """``memlab.estimate(trainer)`` for this CPU: its peak and the estimate. A reference model held apart counts in
    both the estimate and :func:`watched_peak` (``memlab.watch`` counts all the process holds, as a GPU's allocator
    does), so the trainer estimated must be dropped before another is watched."""
    import memlab

    estimate = memlab.estimate(trainer, device="cpu")
    assert estimate.status == "ok", estimate.error
    return estimate.peak_bytes, estimate


def _compare_losses(folder: Any) -> dict[str, Any]:
    """Liger's GRPO and DPO losses (called as TRL 0.26.2 called them, Liger's model patches off) estimated and
    watched under the installed release, and what an estimate asking for its patches says: run by
    tests/estimation/dryrun/test_liger.py in a process whose path puts another release first."""
    import importlib.metadata
    from pathlib import Path

    from memlab.errors import MemlabError

    folder = Path(folder)
    result: dict[str, Any] = {"version": importlib.metadata.version("liger-kernel")}
    makers = {"grpo loss": lambda path: grpo_trainer(path, liger=False, trainer_class=LigerLossGRPOTrainer),
              "dpo loss": lambda path: dpo_trainer(path, liger=False, trainer_class=LigerLossDPOTrainer)}
    for name, make in makers.items():
        estimated, estimate = estimated_step(make(folder / name.replace(" ", "_") / "estimated"))
        notes = list(estimate.notes)
        del estimate
        gc.collect()  # the estimated trainer gone before the next is watched (watch counts all the process holds)
        watched = watched_peak(make(folder / name.replace(" ", "_") / "watched"))
        result[name] = {"estimated": estimated, "watched": watched, "notes": notes}
    try:
        import memlab

        memlab.estimate(sft_trainer(folder / "patches", liger=True, max_steps=1), device="cpu")
        result["patches"] = "estimated"
    except MemlabError as error:
        result["patches"] = str(error)
    return result


if __name__ == "__main__":
    import json
    import sys

    print(json.dumps(_compare_losses(sys.argv[1])))
