"""memlab.panel(trainer): a real widget panel on a tiny Trainer, its buttons clicked from Python."""

from __future__ import annotations

from typing import Any

import pytest
import torch

pytest.importorskip("datasets")
pytest.importorskip("ipywidgets")
from trainers import LENGTHS, make_trainer  # noqa: E402

import memlab  # noqa: E402
from memlab import MemlabError  # noqa: E402


def test_a_trainer_panel_runs_the_worst_batch_applies_to_the_trainer_and_undoes(tmp_path: Any) -> None:
    trainer = make_trainer(tmp_path, steps=2)
    args_before, model = trainer.args, trainer.model
    weights_before = {name: p.detach().clone() for name, p in model.named_parameters()}
    p = memlab.panel(trainer, steps=1, warmup=0, noise=0)
    try:
        assert p.trainer is trainer and p.model is model
        assert p.controls["micro_batch"].value == 2  # the trainer's own settings
        worst = p.batch.micro_batches(None, 1)[0]  # micro-batches the trainer collates, the costliest first
        assert worst["input_ids"].shape[-1] == max(LENGTHS)  # its dataset's worst batch
        assert "worst batch" in p.status.value
        p.run_button.click()
        assert [t.status for t in p.report] == ["ok"]

        p.controls["checkpointing"].value = True
        p.controls["accumulation"].value = 2
        p.apply_button.click()
        assert p.applied is not None and p.applied.active and "train()" in p.status.value
        assert trainer.args.gradient_checkpointing and trainer.args.gradient_accumulation_steps == 2
        assert not p.undo_button.disabled
        trainer.train()  # trains with the applied setting

        p.undo_button.click()
        assert p.applied is None and p.undo_button.disabled
        assert trainer.args is args_before and not trainer.args.gradient_checkpointing
        for name, param in model.named_parameters():
            assert torch.equal(param, weights_before[name]), name  # undo gives the weights back bit-exact
    finally:
        p.close()


def test_a_trainer_panel_takes_a_batch_and_a_model_panel_still_needs_one(tmp_path: Any) -> None:
    trainer = make_trainer(tmp_path, steps=1)
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(2)])
    p = memlab.panel(trainer, batch, steps=1, warmup=0, noise=0)
    try:
        assert p.batch is batch
    finally:
        p.close()
    with pytest.raises(MemlabError, match="no batch was given"):
        memlab.panel(torch.nn.Linear(2, 1))
