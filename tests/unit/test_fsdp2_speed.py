"""The FSDP2 dry run's two linear shortcuts (memlab.estimation.fsdp2_speed) give PyTorch's own results: the trial
and every module-level snapshot FSDPMemTracker took, for plans whose optimizer steps with foreach operators."""

from __future__ import annotations

import contextlib

import pytest
from transformers import LlamaConfig

from memlab import Plan
from memlab.estimation import fsdp2
from memlab.estimation.fsdp2 import fsdp2_dry_run

CONFIG = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=2, vocab_size=256)
BATCH = {"input_ids": (1, 32), "labels": (1, 32)}


@pytest.mark.parametrize(("plan", "gpus", "device"), [
    (Plan(), 4, "cuda"), (Plan(precision="bf16", checkpointing=True), 2, "cuda"), (Plan(), 3, "cpu")])
def test_the_shortcuts_give_pytorchs_own_trial_and_snapshots(monkeypatch: pytest.MonkeyPatch, plan: Plan,
                                                             gpus: int, device: str) -> None:
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

    fast = fsdp2_dry_run(LlamaConfig(**CONFIG), BATCH, plan, gpus, device=device, budget=10**9)
    monkeypatch.setattr(fsdp2, "fsdp_mem_tracker", FSDPMemTracker)
    monkeypatch.setattr(fsdp2, "strided_flag_once", contextlib.nullcontext)
    own = fsdp2_dry_run(LlamaConfig(**CONFIG), BATCH, plan, gpus, device=device, budget=10**9)
    assert fast[0].status == "ok" and len(fast[1]) > 10
    assert fast == own
