"""Issue 57 item 3 on CUDA: a model cast to bf16 in place reserves no more over the whole ``measure`` call than its
steps do, and ``apply`` leaves none of the fp32 weights' segments cached. Skipped without CUDA."""

from __future__ import annotations

import pytest
import torch
from models import lm_batch, tiny_llama

import memlab

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

SEGMENT = 2 * 2**20  # the allocator's rounding of a large segment


def test_the_whole_call_reserves_what_the_steps_do() -> None:
    model = tiny_llama(layers=4, width=1024).cuda()  # fp32 weights of 16 MiB and more: each its own segment
    batch = {k: v.cuda() for k, v in lm_batch(rows=2, length=128).items()}
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    trial = memlab.measure(model, batch, memlab.Plan(weights="bf16"), steps=1, warmup=1, noise=0, progress=False)
    whole = torch.cuda.max_memory_reserved()
    assert trial.status == "ok", trial.error
    assert whole <= trial.reserved_bytes + SEGMENT, (whole, trial.reserved_bytes)
    assert next(model.parameters()).dtype == torch.float32


def test_apply_leaves_no_fp32_segment_cached() -> None:
    model = tiny_llama(layers=4, width=1024).cuda()
    torch.cuda.empty_cache()
    applied = memlab.apply(model, memlab.Plan(weights="bf16"))
    try:
        reserved = torch.cuda.memory_reserved()
        torch.cuda.empty_cache()  # nothing left to give back: the cast gave back every freed fp32 segment
        assert torch.cuda.memory_reserved() == reserved
    finally:
        applied.undo()
