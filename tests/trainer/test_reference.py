"""A preference trainer's reference model per GPU (memlab.trainer.reference), and a DPOTrainer estimated sharded.

A preference trainer's reference model added to an estimate of the policy's step as each GPU holds it
(memlab.trainer.reference): whole on one GPU and under ZeRO-1/2, its share under FSDP2 and ZeRO-3, and under FSDP2
all of it gathered (in the mixed-precision dtype) at the peak, as TRL 1.16's prepare_fsdp / prepare_deepspeed
set it up.

TRL's DPOTrainer estimated sharded over GPUs (issue 59): its fused LM head reads ``lm_head.weight`` without
calling ``lm_head``, which shares an FSDP2 group with the final norm (PyTorch's FSDPMemTracker failed on it with a
KeyError naming FSDPLinear); the reference model counted as TRL prepares it for each engine. Tiny Llamas on CPU."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from memlab.estimation.sharded.fsdp2 import DETAIL, ShardedTrial
from memlab.plan import Plan
from memlab.report import Trial
from memlab.sizes import format_bytes
from memlab.trainer.reference import reference_bytes, with_reference

pytest.importorskip("trl")
pytest.importorskip("peft")
from test_dpo import _held, _same, dpo  # noqa: E402

import memlab  # noqa: E402

REFERENCE = torch.nn.Sequential(torch.nn.Linear(10, 10), torch.nn.LayerNorm(10))  # 110 + 20 floats: 520 bytes
WHOLE = 520


def sharded(strategy: str, gpus: int = 4, precision: str = "fp32") -> ShardedTrial:
    detail = dict.fromkeys(DETAIL, 0) | {"sharded_params": 300, "activations": 700}
    return ShardedTrial(Plan(precision=precision), "ok", 1000, {"params": 300, "activations": 700, "other": 0},
                        None, None, None, "cuda", gpus=gpus, strategy=strategy, detail=detail)


def trainer(reference: torch.nn.Module | None = REFERENCE) -> SimpleNamespace:
    return SimpleNamespace(model=torch.nn.Linear(2, 2), ref_model=reference)


def test_the_reference_is_counted_whole_on_one_gpu() -> None:
    trial = with_reference(Trial(Plan(), "ok", 1000, {"params": 1000, "other": 0}, None, None, None, "cuda"),
                           trainer())
    assert trial.peak_bytes == 1000 + WHOLE and trial.breakdown["other"] == WHOLE


@pytest.mark.parametrize("strategy", ["zero2", "zero1", "ddp"])
def test_zero_off_engines_hold_the_whole_reference_on_each_gpu(strategy: str) -> None:
    trial = with_reference(sharded(strategy), trainer())
    assert trial.peak_bytes == 1000 + WHOLE
    assert "whole on each GPU" in trial.notes[-1]


def test_zero3_holds_a_share_of_the_reference() -> None:
    trial = with_reference(sharded("zero3"), trainer())
    assert trial.peak_bytes == 1000 + WHOLE // 4
    assert trial.detail["sharded_params"] == 300 + WHOLE // 4
    assert sum(trial.detail.values()) == trial.peak_bytes == sum(trial.breakdown.values())


@pytest.mark.parametrize(("precision", "gathered"), [("fp32", WHOLE), ("bf16", 260)])
def test_fsdp2_holds_a_share_and_gathers_the_whole_reference_in_the_policys_dtype(precision: str,
                                                                                  gathered: int) -> None:
    trial = with_reference(sharded("fsdp2", precision=precision), trainer())
    assert trial.peak_bytes == 1000 + WHOLE // 4 + gathered
    assert trial.detail["unsharded_params"] == gathered
    assert sum(trial.detail.values()) == trial.peak_bytes == sum(trial.breakdown.values())
    assert "gathered for its forward" in trial.notes[-1]


def test_a_trainer_without_a_separate_reference_is_unchanged() -> None:
    base = sharded("fsdp2")
    assert with_reference(base, trainer(None)) is base
    same = trainer()
    same.ref_model = same.model
    assert with_reference(base, same) is base


def test_reference_bytes_counts_each_storage_once_and_a_meta_model_at_what_it_will_hold() -> None:
    tied = torch.nn.Linear(3, 3, bias=False)
    both = torch.nn.ModuleList([tied, tied])
    assert reference_bytes(both) == 36
    with torch.device("meta"):  # a reference built to be estimated (memlab.trainer_on_meta): 12 fp32 values
        meta = torch.nn.Linear(3, 3)
        assert reference_bytes(meta) == 48
        assert reference_bytes(torch.nn.ModuleList([meta, meta])) == 48  # a tied weight once, by identity


@pytest.mark.parametrize("setup", ["reference", "precomputed", "peft"])
def test_dpo_is_estimated_sharded_with_fsdp2_and_zero3(tmp_path: Any, setup: str) -> None:
    trainer = dpo(tmp_path, setup)
    held = _held(trainer)
    one = memlab.estimate(trainer)
    assert one.status == "ok", one.error
    for strategy in ("fsdp2", "zero3"):
        trial = memlab.estimate(trainer, gpus=2, strategy=strategy)
        assert trial.status == "ok", (strategy, trial.error)
        assert trial.gpus == 2 and trial.strategy == strategy
        assert sum(trial.breakdown.values()) == trial.peak_bytes == sum(trial.detail.values())
        load = next(note for note in trial.notes if note.startswith("the load"))
        assert ("the reference model: " in load) == (setup == "reference")  # TRL prepares it before the policy
        # each GPU's activations are the one-GPU step's (the same micro-batch on every GPU)
        assert trial.detail["activations"] == pytest.approx(one.breakdown["activations"], rel=0.05)
    _same(trainer, held)


def test_the_sharded_reference_is_each_gpus_share_and_fsdp2_gathers_it(tmp_path: Any) -> None:
    trainer = dpo(tmp_path, "reference")
    whole = reference_bytes(trainer.ref_model)
    share = -(-whole // 2)
    notes = {}
    for strategy in ("fsdp2", "zero3", "zero2"):
        trial = memlab.estimate(trainer, gpus=2, strategy=strategy)
        assert trial.status == "ok", trial.error
        notes[strategy] = next(note for note in trial.notes if "reference model" in note)
    assert f"{format_bytes(share)} share" in notes["fsdp2"]
    assert f"gathered for its forward ({format_bytes(whole)})" in notes["fsdp2"]
    assert f"{format_bytes(share)} share" in notes["zero3"] and "a module at a time" in notes["zero3"]
    assert f"reference model's {format_bytes(whole)} under other" in notes["zero2"]
    assert "whole on each GPU" in notes["zero2"]


def test_a_copy_held_while_running_holds_the_gathered_bytes_only_during_its_forward() -> None:
    from memlab.measure.tracker import MemoryTracker
    from memlab.trainer.reference import held_while_running

    module = torch.nn.Linear(4, 4)
    held_while_running(module, 1 << 20)
    held_while_running(module, 1 << 20)  # hooked once
    with MemoryTracker(device="cpu") as tracker:
        module(torch.zeros(2, 4))
    assert (1 << 20) <= tracker.peak_bytes < (1 << 20) + 4096
    assert tracker.live_bytes < 4096


def test_an_fsdp2_estimate_holds_the_gathered_reference_while_its_forward_runs(tmp_path: Any) -> None:
    # Asked with strategy="fsdp2" or read from the trainer's fsdp= arguments alike (test_trainer_fsdp2_ranks.py checks
    # the launched trainer against its ranks); under ZeRO-3 the reference is gathered a module at a time instead.
    trainer = dpo(tmp_path, "reference")
    asked = memlab.estimate(trainer, gpus=2, strategy="fsdp2")
    trainer.args.fsdp, trainer.args.fsdp_config = True, {"version": 2}
    read = memlab.estimate(trainer, gpus=2)
    assert asked.status == read.status == "ok", (asked.error, read.error)
    assert asked.peak_bytes == read.peak_bytes
    whole = reference_bytes(trainer.ref_model)
    note = next(note for note in read.notes if "reference model" in note)
    assert f"all of it gathered for its forward ({format_bytes(whole)}), held in the step while" in note
    assert read.detail["activations"] >= whole  # the dry run held it, under activations


def test_where_no_loss_runs_the_reference_under_fsdp2_its_gathered_whole_is_counted_at_the_peak(tmp_path: Any) -> None:
    # A GRPOTrainer computes its reference's log-probs as it generates, not in its loss; a composed estimate (an
    # adapter plan) runs the step on one GPU: neither dry run holds the gathered reference, so it is added at the peak.
    from test_grpo_step import grpo

    policy = grpo(tmp_path / "grpo", "reference")
    trial = memlab.estimate(policy, gpus=2, strategy="fsdp2", device="cpu")
    assert trial.status == "ok", trial.error
    gathered = reference_bytes(policy.ref_model)
    note = next(note for note in trial.notes if "reference model" in note)
    assert f"gathered for its forward ({format_bytes(gathered)}), counted at the step's peak" in note
    trainer = dpo(tmp_path / "dpo", "reference")
    memlab.estimate(trainer, gpus=2, strategy="fsdp2")  # its loss runs the reference: held in the step
    composed = memlab.estimate(trainer, memlab.Plan.from_trainer(trainer).replace(adapter="lora"), gpus=2,
                               strategy="fsdp2")
    assert composed.status == "ok", composed.error
    assert "counted at the step's peak" in next(note for note in composed.notes if "reference model" in note)
