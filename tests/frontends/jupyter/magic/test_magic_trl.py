"""``%%memfit trainer`` and ``memlab.panel(trainer)`` on TRL's GRPOTrainer and DPOTrainer (issue 59), in a real
IPython shell and with real widgets: the trainer's own step measured (a GRPO step's generation first on the
timeline), searched, estimated, applied and undone; the trainer, its models and datasets the same objects after.
Tiny Llamas on CPU."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

pytest.importorskip("trl")
pytest.importorskip("ipywidgets")
from IPython.core.error import UsageError  # noqa: E402
from IPython.core.interactiveshell import InteractiveShell  # noqa: E402
from test_magic import magic_shell  # noqa: E402
from trl_trainers import make_dpo_trainer, make_grpo_trainer  # noqa: E402

import memlab  # noqa: E402
from memlab.frontends.jupyter.magic.run import APPLIED_NAME  # noqa: E402

FAST = "--steps 1 --warmup 0 --noise 0 --quiet"


@pytest.fixture(scope="module")
def shell() -> Iterator[InteractiveShell]:
    yield from magic_shell()


def _held(trainer: Any) -> dict[str, Any]:
    held = {name: getattr(trainer, name) for name in ("args", "model", "train_dataset", "data_collator")}
    held["weights"] = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    held["split"] = (trainer.args.per_device_train_batch_size, trainer.args.gradient_accumulation_steps)
    return held


def _same(trainer: Any, held: dict[str, Any]) -> None:
    for name in ("args", "model", "train_dataset", "data_collator"):
        assert getattr(trainer, name) is held[name], name
    assert (trainer.args.per_device_train_batch_size, trainer.args.gradient_accumulation_steps) == held["split"]
    state = trainer.model.state_dict()
    assert all(torch.equal(state[k], v) for k, v in held["weights"].items())


def _phases(trial: memlab.Trial) -> list[str]:
    assert trial.timeline is not None
    return list(dict.fromkeys(name for name, _, _ in trial.timeline.phases))


def test_memfit_on_a_grpo_trainer_measures_searches_estimates_and_applies(shell: InteractiveShell,
                                                                          tmp_path: Any) -> None:
    trainer = make_grpo_trainer(tmp_path, per_device_train_batch_size=4, num_generations=2)
    held = _held(trainer)
    shell.user_ns["grpo"] = trainer
    report = shell.run_cell_magic("memfit", f"grpo --try accumulation=1,2 {FAST}", "\n")
    assert [(t.plan.label(), t.status) for t in report] == [("mb4x1", "ok"), ("mb2x2", "ok")], \
        [t.error for t in report]
    assert all(_phases(t)[:1] == ["generation"] and t.rows_per_step == 4 for t in report)
    assert any("longest prompt" in note for note in report.trials[0].notes)
    _same(trainer, held)

    budget = int(max(t.peak_bytes for t in report) * 4)
    searched = shell.run_cell_magic("memfit", f"grpo --budget {budget}B --max-trials 2 --apply {FAST}", "\n")
    assert searched.best is not None and searched.best.rows_per_step == 4
    applied = shell.user_ns[APPLIED_NAME]
    best = searched.best.plan
    assert applied.plan == (best if best.micro_batch else best.replace(micro_batch=4 // best.accumulation))
    applied.undo()
    _same(trainer, held)

    estimated = shell.run_cell_magic("memfit", "grpo --dry-run --quiet", "\n")
    assert [t.status for t in estimated] == ["ok"] and estimated.trials[0].estimated
    assert _phases(estimated.trials[0])[0] == "generation"
    with pytest.raises(UsageError, match="GRPOTrainer.*drop --gpus"):
        shell.run_cell_magic("memfit", "grpo --dry-run --gpus 2 --quiet", "\n")
    shell.user_ns["prompts"] = {"input_ids": torch.ones(2, 4, dtype=torch.long)}
    with pytest.raises(UsageError, match="leave the batch out"):
        shell.run_cell_magic("memfit", f"grpo prompts {FAST}", "\n")
    _same(trainer, held)


def test_the_panel_on_a_grpo_trainer_runs_its_step_and_draws_its_phases(tmp_path: Any) -> None:
    trainer = make_grpo_trainer(tmp_path, beta=0.1)  # a reference model: its log-probs are a phase
    held = _held(trainer)
    p = memlab.panel(trainer, steps=1, warmup=0, noise=0)
    try:
        assert p.trainer is trainer and p.controls["micro_batch"].value == 2
        assert "longest prompt" in p.status.value
        p.run_button.click()
        p.controls["accumulation"].value = 2
        p.controls["micro_batch"].value = 1
        p.run_button.click()
        assert [(t.plan.micro_batch, t.plan.accumulation, t.status) for t in p.report] == [(2, 1, "ok"),
                                                                                         (1, 2, "ok")], \
            [t.error for t in p.report]
        assert all(_phases(t)[:2] == ["generation", "reference"] for t in p.report)
        drawn = p.timeline.drawing.value
        assert "generation" in drawn and "reference" in drawn  # the picked plan's step, its phases shaded
        p.apply_button.click()
        assert p.applied is not None and trainer.args.gradient_accumulation_steps == 2
        p.undo_button.click()
        assert p.applied is None
        _same(trainer, held)
    finally:
        p.close()


def test_memfit_and_the_panel_on_a_dpo_trainer(shell: InteractiveShell, tmp_path: Any) -> None:
    trainer = make_dpo_trainer(tmp_path)
    held = _held(trainer)
    shell.user_ns["dpo"] = trainer
    report = shell.run_cell_magic("memfit", f"dpo --try checkpointing=off,on {FAST}", "\n")
    assert [t.status for t in report] == ["ok", "ok"], [t.error for t in report]
    assert report.trials[0].rows_per_step == 2
    estimated = shell.run_cell_magic("memfit", "dpo --dry-run --quiet", "\n")
    assert estimated.trials[0].status == "ok"
    p = memlab.panel(trainer, steps=1, warmup=0, noise=0)
    try:
        p.run_button.click()
        assert [t.status for t in p.report] == ["ok"], p.report.trials[0].error
        p.controls["checkpointing"].value = True
        p.apply_button.click()
        assert p.applied is not None and trainer.args.gradient_checkpointing
        p.undo_button.click()
    finally:
        p.close()
    _same(trainer, held)
