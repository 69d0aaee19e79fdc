"""A GRPO estimate's card figure holds the reference model as its allocated peak does (beta > 0: TRL loads one)."""

from __future__ import annotations

from pathlib import Path

import memlab
from tests.trl_trainers import make_grpo_trainer


def test_the_reference_model_is_on_the_card_as_in_the_peak(tmp_path: Path) -> None:
    without = memlab.estimate(make_grpo_trainer(tmp_path / "a", beta=0.0), device="cuda", gpu="H100-80GB")
    trainer = make_grpo_trainer(tmp_path / "b", beta=0.1)
    held = [*trainer.ref_model.parameters(), *trainer.ref_model.buffers()]
    reference = sum(t.numel() * t.element_size() for t in held)
    with_reference = memlab.estimate(trainer, device="cuda", gpu="H100-80GB")
    assert without.status == with_reference.status == "ok"
    assert without.reserved_bytes is not None and with_reference.reserved_bytes is not None
    assert with_reference.peak_bytes - without.peak_bytes >= reference > 0  # its weights, under "other"
    assert with_reference.reserved_bytes - without.reserved_bytes == reference
    assert with_reference.reserved_bytes >= with_reference.peak_bytes
