"""A trainer's packed micro-batches get the attention mask a real step builds (memlab/estimation/dryrun/masks.py).

On an H100 (/work/shared/gpu-runs/2026-11-26-h100-turn7, part sft_peft: TRL's SFTTrainer with packing and LoRA, one
row of 8 x 1024 tokens), ``memlab.estimate(trainer)`` held 201,326,592 bytes of activations fewer than the measured
step: the packed rows' block-diagonal mask (8192 x 8192 booleans, 64 MiB, held from the forward to the last layer's
backward) and the additive bf16 copy scaled_dot_product_attention makes of it (128 MiB). transformers builds that mask
where the ``position_ids`` restart inside a row; the dry run answered "not packed" for the fake ``position_ids``
because it looked for them only in a dict batch, not in a trainer's micro-batches (``StepBatches``).
"""

from __future__ import annotations

import pytest
import torch

import memlab
from memlab import Plan
from memlab.live.batch import StepBatches

transformers = pytest.importorskip("transformers")


def _packed(rows: int = 2, lengths: tuple[int, ...] = (96, 64, 96)) -> dict[str, torch.Tensor]:
    """One row per micro-batch row of packed sequences, as a padding-free collator gives them."""
    total = sum(lengths)
    tokens = torch.randint(3, 256, (rows, total))
    positions = torch.cat([torch.arange(length) for length in lengths]).repeat(rows, 1)
    return {"input_ids": tokens, "labels": tokens.clone(), "position_ids": positions}


@pytest.mark.parametrize("plan", [Plan(), Plan(checkpointing=True)], ids=lambda plan: plan.label())
def test_a_trainers_packed_micro_batches_are_estimated_with_their_mask(plan: Plan) -> None:
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
        vocab_size=256, max_position_embeddings=512))
    batch = _packed()
    as_trainer = StepBatches(lambda rows, steps: [batch] * steps, rows=2)
    plain = memlab.estimate(model, batch, plan, device="cpu")
    trainer = memlab.estimate(model, as_trainer, plan, device="cpu")
    measured = memlab.measure(model, batch, plan, steps=1, warmup=1, noise=0, progress=False)
    assert plain.status == trainer.status == measured.status == "ok", (plain.error, trainer.error, measured.error)
    assert trainer.peak_bytes == plain.peak_bytes, (trainer.peak_bytes, plain.peak_bytes)
    # The real step's peak, its (256, 256) boolean mask (64 KiB) included: within 4 KiB, as for an unpacked batch
    # (tests/estimation/cuda/test_kernels.py).
    step = measured.peak_bytes - measured.preexisting_bytes
    assert abs(trainer.peak_bytes - step) <= 4096, (trainer.peak_bytes, step)
    import transformers.masking_utils as masking_utils

    assert masking_utils.find_packed_sequence_indices.__name__ == "find_packed_sequence_indices"  # put back
