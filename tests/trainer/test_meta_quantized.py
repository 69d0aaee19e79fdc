"""A QLoRA (or 8-bit) trainer asked before its weights exist (issue 83): ``memlab.model_on_meta(config, dtype=...,
quantization_config=BitsAndBytesConfig(...))`` builds the policy on the meta device as ``from_pretrained`` loads it
(transformers' own quantizer puts bitsandbytes' layers in place), ``memlab.trainer_on_meta`` builds TRL's trainer
around it (TRL casts the adapters itself), and ``memlab.estimate(trainer, gpu=...)`` answers what it answers for the
same trainer built around the real 4-bit weights loaded from a checkpoint.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import peft
import pytest
import torch
import trl
from datasets import Dataset
from transformers import AutoModelForCausalLM, BitsAndBytesConfig, Qwen2Config

import memlab
from tests.trl_trainers import length_reward, word_tokenizer

CONFIG = Qwen2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, vocab_size=64, max_position_embeddings=256, pad_token_id=0,
                     tie_word_embeddings=False)
NF4 = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                         bnb_4bit_compute_dtype=torch.float16)
INT8 = BitsAndBytesConfig(load_in_8bit=True)
PROMPTS = [{"prompt": " ".join(f"w{(i + j) % 60}" for j in range(6 + i))} for i in range(8)]
PAIRS = [{"prompt": " ".join(f"w{(i + j) % 60}" for j in range(4 + i)),
          "chosen": " ".join(f"w{(i * 3 + j) % 60}" for j in range(6 + i % 4)),
          "rejected": " ".join(f"w{(i * 7 + j) % 60}" for j in range(3 + i % 5))} for i in range(8)]
TEXTS = [{"text": " ".join(f"w{(i * 5 + j) % 60}" for j in range(10 + 3 * i))} for i in range(8)]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("qwen2")
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(CONFIG, dtype=torch.float16).save_pretrained(folder)
    return folder


def _lora() -> peft.LoraConfig:
    return peft.LoraConfig(r=8, lora_alpha=16, target_modules="all-linear")


def _common(folder: Path) -> dict[str, Any]:
    return dict(output_dir=str(folder), report_to=[], use_cpu=True, save_strategy="no", max_steps=1,
                disable_tqdm=True, bf16=True, seed=0, gradient_checkpointing=True)


def _trainer(kind: str, model: Any, folder: Path) -> Any:
    keywords: dict[str, Any] = dict(processing_class=word_tokenizer(), peft_config=_lora())
    if kind == "grpo":
        args: Any = trl.GRPOConfig(**_common(folder), per_device_train_batch_size=4, num_generations=4,
                                   max_completion_length=24, beta=0.0, optim="paged_adamw_8bit")
        keywords.update(reward_funcs=length_reward, train_dataset=Dataset.from_list(PROMPTS))
        cls: Any = trl.GRPOTrainer
    elif kind == "dpo":
        args = trl.DPOConfig(**_common(folder), per_device_train_batch_size=2)
        keywords.update(train_dataset=Dataset.from_list(PAIRS))
        cls = trl.DPOTrainer
    else:
        args = trl.SFTConfig(**_common(folder), per_device_train_batch_size=2, packing=True, max_length=48)
        keywords.update(train_dataset=Dataset.from_list(TEXTS))
        cls = trl.SFTTrainer
    meta = next(model.parameters()).device.type == "meta"
    return memlab.trainer_on_meta(cls, model=model, args=args, **keywords) if meta else cls(model=model, args=args,
                                                                                             **keywords)


def _close(meta: int | None, real: int | None) -> bool:
    assert meta is not None and real is not None
    return abs(meta - real) <= 0.01 * real


@pytest.mark.parametrize(("kind", "quantization"), [("grpo", NF4), ("dpo", NF4), ("sft", NF4), ("sft", INT8)])
def test_a_quantized_trainer_on_meta_is_estimated_as_with_its_real_weights(
    checkpoint: Path, tmp_path: Path, kind: str, quantization: BitsAndBytesConfig
) -> None:
    real = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float16, quantization_config=quantization)
    policy = memlab.model_on_meta(CONFIG, dtype=torch.float16, quantization_config=quantization)
    assert {p.device.type for p in policy.parameters()} == {"meta"}
    assert [type(m).__name__ for m in policy.modules()] == [type(m).__name__ for m in real.modules()]
    built = _trainer(kind, real, tmp_path / "real")
    on_meta = _trainer(kind, policy, tmp_path / "meta")
    trainable = {(name, p.dtype) for name, p in on_meta.model.named_parameters() if p.requires_grad}
    assert trainable == {(name, p.dtype) for name, p in built.model.named_parameters() if p.requires_grad}
    assert {dtype for _, dtype in trainable} == {torch.bfloat16}  # TRL's own cast of a quantized model's adapters
    estimated = memlab.estimate(on_meta, gpu="T4-16GB")
    measured_path = memlab.estimate(built, gpu="T4-16GB")
    assert estimated.status == measured_path.status == "ok", (estimated.error, measured_path.error)
    assert _close(estimated.peak_bytes, measured_path.peak_bytes)
    assert _close(estimated.reserved_bytes, measured_path.reserved_bytes)
    assert abs(estimated.breakdown["params"] - measured_path.breakdown["params"]) <= 0.01 * measured_path.peak_bytes
    assert not any("quantized to 4-bit for this plan" in note for note in estimated.notes), estimated.notes


def test_model_on_meta_loads_as_from_pretrained_and_refuses_what_it_cannot(checkpoint: Path) -> None:
    real = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.bfloat16)
    policy = memlab.model_on_meta(CONFIG, dtype=torch.bfloat16)
    assert {(n, p.dtype) for n, p in policy.named_parameters()} == {(n, p.dtype) for n, p in real.named_parameters()}
    assert not getattr(policy, "is_loaded_in_4bit", False)
    with pytest.raises(memlab.MemlabError, match=r"already loaded .* memlab.model_on_meta\(model.config"):
        memlab.model_on_meta(real, dtype=torch.bfloat16)
    with pytest.raises(memlab.MemlabError, match="write only dtype"):
        memlab.model_on_meta(CONFIG, device_map="auto")
    with pytest.raises(memlab.MemlabError, match=r"was given the class Qwen2ForCausalLM; write model=memlab.model_on"):
        memlab.trainer_on_meta(trl.SFTTrainer, model=type(real), args=trl.SFTConfig(output_dir="x", use_cpu=True))
    with pytest.raises(memlab.MemlabError, match="bnb_4bit_quant_type='nf5' is not one bitsandbytes has"):
        memlab.model_on_meta(CONFIG, quantization_config={"load_in_4bit": True, "bnb_4bit_quant_type": "nf5"})


def test_a_load_that_quantizes_nothing_is_one_error() -> None:
    from transformers import BertConfig

    tiny = BertConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                      vocab_size=64)
    skip = BitsAndBytesConfig(load_in_4bit=True, llm_int8_skip_modules=["bert", "cls"])
    with pytest.raises(memlab.MemlabError, match="a 4-bit load quantizes no layer of this Bert"):
        memlab.model_on_meta(tiny, quantization_config=skip)
