"""lora_dropout and lora_alpha: measured, estimated, exported and read back from a user's peft model, on tiny models."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from models import assert_same, fingerprint, lm_batch, tiny_llama

import memlab
from memlab.errors import MemlabError
from memlab.export.accelerate import accelerate_script
from memlab.plan import Plan, parse_grid
from memlab.trainer.source import TrainerSource

LORA = Plan(adapter="lora", lora_rank=4)
DROPOUT = LORA.replace(lora_dropout=0.05)


def test_the_plan_checks_and_normalises_them() -> None:
    assert Plan(lora_dropout=0.05, lora_alpha=8) == Plan()  # mean nothing without an adapter
    assert DROPOUT.lora_dropout == 0.05 and DROPOUT.label() == "lora r4 drop0.05"
    assert LORA.replace(lora_alpha=16).label() == "lora r4 alpha16"
    for bad in (-0.1, 1.0, "0.05", True):
        with pytest.raises(MemlabError, match="write"):
            LORA.replace(lora_dropout=bad)
    with pytest.raises(MemlabError, match="whole number"):
        LORA.replace(lora_alpha=0.5)
    grid = parse_grid(["lora_dropout=0,0.05", "lora_alpha=auto,32"], base=LORA)
    assert [(p.lora_dropout, p.lora_alpha) for p in grid] == [(0.0, None), (0.0, 32), (0.05, None), (0.05, 32)]


def test_dropout_on_the_adapter_input_keeps_its_mask_for_backward_measured_and_estimated() -> None:
    model, batch = tiny_llama(), lm_batch(rows=4, length=32)
    before = fingerprint(model)
    report = memlab.compare(model, batch, [LORA, DROPOUT], steps=1, warmup=0, noise=0)
    assert_same(before, fingerprint(model))
    plain, dropped = report.trials
    assert plain.status == dropped.status == "ok"
    assert dropped.breakdown["activations"] > plain.breakdown["activations"]
    assert dropped.breakdown["params"] == plain.breakdown["params"]

    shapes = {"input_ids": (4, 32), "labels": (4, 32)}
    estimated = [memlab.estimate(model, shapes, plan, device="cpu") for plan in (LORA, DROPOUT)]
    assert estimated[1].peak_bytes > estimated[0].peak_bytes
    # The estimate on fake tensors sees the same extra bytes the CPU measured (within a tenth).
    measured_extra = dropped.peak_bytes - plain.peak_bytes
    estimated_extra = estimated[1].peak_bytes - estimated[0].peak_bytes
    assert measured_extra > 0 and abs(estimated_extra - measured_extra) <= 0.1 * measured_extra


def test_alpha_scales_the_adapters_and_costs_no_memory() -> None:
    model, batch = tiny_llama(), lm_batch(rows=2, length=8)
    applied = memlab.apply(model, LORA.replace(lora_alpha=32))
    try:
        adapted = [m for m in model.modules() if isinstance(getattr(m, "scaling", None), dict) and m.scaling]
        scalings = {m.scaling["default"] for m in adapted}
        assert scalings == {32 / 4}
        applied.step(batch)
    finally:
        applied.undo()
    report = memlab.compare(model, batch, [LORA, LORA.replace(lora_alpha=32)], steps=1, warmup=0, noise=0)
    assert report.trials[0].peak_bytes == report.trials[1].peak_bytes


def test_every_export_carries_them() -> None:
    plan = DROPOUT.replace(lora_alpha=32)
    config = plan.to_peft_config()
    assert (config.r, config.lora_alpha, config.lora_dropout) == (4, 32, 0.05)
    assert LORA.to_peft_config().lora_alpha == 8  # auto: twice the rank
    code = plan.to_code()
    namespace: dict[str, Any] = {}
    lora_line = next(line for line in code.splitlines() if "LoraConfig(" in line and "get_peft_model" in line)
    exec("from peft import LoraConfig\nconfig = " + lora_line.split("get_peft_model(model, ", 1)[1][:-1], namespace)
    assert (namespace["config"].lora_alpha, namespace["config"].lora_dropout) == (32, 0.05)
    script = accelerate_script(plan)
    assert "lora_alpha=32" in script and "lora_dropout=0.05" in script
    with pytest.raises(MemlabError, match="get_peft_model"):
        plan.to_training_arguments()


def test_a_users_peft_model_reports_its_own_settings(tmp_path: Any) -> None:
    from peft import LoraConfig, get_peft_model
    from trainers import make_trainer

    trainer = make_trainer(tmp_path)
    config = LoraConfig(r=8, lora_alpha=32, lora_dropout=0.05, target_modules="all-linear")
    trainer.model = get_peft_model(trainer.model, config)
    plan = TrainerSource.plan_of(trainer)
    assert (plan.adapter, plan.lora_rank, plan.lora_alpha, plan.lora_dropout) == ("lora", 8, 32, 0.05)
    trainer.model = get_peft_model(make_trainer(tmp_path).model, LoraConfig(r=4, lora_alpha=8))
    plan = TrainerSource.plan_of(trainer)
    assert (plan.lora_rank, plan.lora_alpha, plan.lora_dropout) == (4, None, 0.0)  # alpha twice the rank: auto


def test_the_panel_offers_them() -> None:
    from memlab.frontends.jupyter.panel_core import PanelCore
    from memlab.options import RunOptions

    panel = PanelCore(torch.nn.Linear(4, 1), torch.randn(8, 4), RunOptions())
    assert (panel.controls["lora_alpha"].value, panel.controls["lora_dropout"].value) == ("auto", 0.0)
    assert "twice the rank" in panel.controls["lora_alpha"].tooltip
    panel.controls["adapter"].value = "lora"
    panel.controls["lora_dropout"].value = 0.05
    assert (panel.plan().lora_alpha, panel.plan().lora_dropout) == (None, 0.05)  # auto: the plan's None
    panel.controls["lora_alpha"].value = 64
    assert panel.plan().label() == "lora alpha64 drop0.05"
