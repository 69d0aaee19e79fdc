"""``Plan(expandable_segments=True)`` (DESIGN.md 2.4): a lever declared as every lever is; on a live CUDA trial the
allocator's expandable segments switched on and the process's setting put back after, failed or not; nothing
changed off CUDA. PyTorch's allocator setting is recorded here (this machine has no GPU): the trial's device is made
to read as CUDA, and every call of ``torch._C._accelerator_setAllocatorSettings`` is kept."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import memlab
from memlab import Plan
from memlab.errors import MemlabError
from memlab.plan import LEVERS, parse_grid
from memlab.runner.step import TrainingStep
from memlab.search.space import runs_as
from memlab.techniques.expandable_segments import ALREADY_NOTE, CPU_NOTE, SWITCHED_NOTE

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from models import lm_batch, tiny_llama  # noqa: E402

FAST: dict[str, Any] = {"steps": 1, "noise": 0, "progress": False}


class AllocatorRecorder:
    """Stand-ins for PyTorch's allocator setting and its getter: the settings strings set, in order."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, started_with: str = "") -> None:
        self.settings: list[str] = []
        self.now = started_with
        monkeypatch.setattr(torch._C, "_accelerator_setAllocatorSettings", self.set, raising=False)
        monkeypatch.setattr(torch._C, "_accelerator_getAllocatorSettings", lambda: self.now, raising=False)
        monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
        monkeypatch.delenv("PYTORCH_ALLOC_CONF", raising=False)

    def set(self, settings: str) -> None:
        self.settings.append(settings)
        self.now = settings


def on_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """The training step reads its model's device as CUDA (its tensors stay on the CPU: a step that runs fails)."""
    monkeypatch.setattr("memlab.runner.step.model_device", lambda model: torch.device("cuda", 0))


def test_the_lever_is_declared_as_every_switch_is() -> None:
    plan = Plan(expandable_segments=True)
    assert LEVERS["expandable_segments"].type == "bool" and LEVERS["expandable_segments"].default is False
    assert plan.label() == "xseg" and plan.describe() == "expandable segments"
    assert Plan(checkpointing=True, expandable_segments=True).label() == "ckpt xseg"
    assert [p.expandable_segments for p in parse_grid(["expandable_segments=off,on"])] == [False, True]
    with pytest.raises(MemlabError, match="write True or False"):
        Plan(expandable_segments="yes")
    # a CPU search runs the plan without them: the same step
    assert runs_as(plan, "cpu") == Plan() and runs_as(plan, "cuda") == plan


def test_a_cpu_trial_runs_the_same_step_and_says_so() -> None:
    model, batch = tiny_llama(), lm_batch(rows=2, length=8)
    plain, switched = memlab.compare(model, batch, [Plan(), Plan(expandable_segments=True)], **FAST).trials
    assert switched.status == "ok" and CPU_NOTE in switched.notes and CPU_NOTE not in plain.notes
    assert switched.peak_bytes == plain.peak_bytes and switched.breakdown == plain.breakdown


def test_a_cuda_trial_switches_them_on_and_puts_the_setting_back(monkeypatch: pytest.MonkeyPatch) -> None:
    recorder = AllocatorRecorder(monkeypatch)
    on_cuda(monkeypatch)
    step = TrainingStep(tiny_llama(), Plan(expandable_segments=True))
    assert recorder.settings == ["expandable_segments:True"], "switched on before the step's first allocation"
    assert SWITCHED_NOTE in step.notes
    step.close()
    assert recorder.settings == ["expandable_segments:True", "expandable_segments:False"]


def test_the_setting_is_put_back_when_the_trial_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    recorder = AllocatorRecorder(monkeypatch)
    on_cuda(monkeypatch)
    step = TrainingStep(tiny_llama(), Plan(expandable_segments=True))
    with pytest.raises((RuntimeError, AssertionError)):  # the batch cannot go to a CUDA device here: the step fails
        step(lm_batch(rows=2, length=8))
    assert recorder.now == "expandable_segments:True"
    step.close()  # what the runner does with a failed trial's step (Attempt.take_off, in its finally)
    assert recorder.settings[-1] == "expandable_segments:False"
    # a plan whose other technique refuses it while it goes on: taken off at once, the setting put back
    recorder.settings.clear()
    with pytest.raises(MemlabError):
        TrainingStep(tiny_llama(layers=2), Plan(expandable_segments=True, checkpointing=5))
    assert recorder.settings == ["expandable_segments:True", "expandable_segments:False"]


def test_a_process_that_runs_with_them_is_measured_as_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    recorder = AllocatorRecorder(monkeypatch, started_with="expandable_segments:True")
    on_cuda(monkeypatch)
    step = TrainingStep(tiny_llama(), Plan(expandable_segments=True))
    step.close()
    assert recorder.settings == [] and ALREADY_NOTE in step.notes
    # the environment alone says so on a torch without the getter (2.11)
    recorder = AllocatorRecorder(monkeypatch)
    monkeypatch.delattr(torch._C, "_accelerator_getAllocatorSettings")
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    TrainingStep(tiny_llama(), Plan(expandable_segments=True)).close()
    assert recorder.settings == []


def test_a_plan_without_them_and_a_dry_run_change_no_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    recorder = AllocatorRecorder(monkeypatch)
    on_cuda(monkeypatch)
    TrainingStep(tiny_llama(), Plan()).close()
    assert recorder.settings == []
    monkeypatch.undo()
    recorder = AllocatorRecorder(monkeypatch)
    trial = memlab.estimate(tiny_llama(), lm_batch(rows=2, length=8), Plan(expandable_segments=True), device="cuda")
    assert trial.status == "ok" and recorder.settings == [], "a dry run never touches the real allocator"


def _llama_config() -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
                       vocab_size=32000)


def test_the_plans_lever_decides_the_allocator_its_estimate_assumes() -> None:
    from memlab.estimation.dryrun.reserved import EXPANDABLE_NOTE
    from memlab.estimation.estimate import estimate_plans

    shapes = {"input_ids": (4, 256), "labels": (4, 256)}
    keyword = memlab.estimate(_llama_config(), shapes, Plan(), device="cuda", gpu="H200-141GB",
                              expandable_segments=True)
    lever = memlab.estimate(_llama_config(), shapes, Plan(expandable_segments=True), device="cuda", gpu="H200-141GB")
    both = memlab.estimate(_llama_config(), shapes, Plan(expandable_segments=True), device="cuda", gpu="H200-141GB",
                           expandable_segments=True)
    default = memlab.estimate(_llama_config(), shapes, Plan(), device="cuda", gpu="H200-141GB")
    assert lever.reserved_bytes == keyword.reserved_bytes == both.reserved_bytes
    assert lever.peak_bytes == default.peak_bytes and lever.reserved_bytes < default.reserved_bytes
    assert EXPANDABLE_NOTE in lever.notes and EXPANDABLE_NOTE not in default.notes
    # several plans in one dry run (what fit and the CLI's --try make): each plan's own allocator, as estimated alone
    for model in (_llama_config(), tiny_llama(layers=4, width=64)):  # a config carried from a few layers; a live model
        plain, switched = estimate_plans(model, shapes, [Plan(), Plan(expandable_segments=True)], device="cuda",
                                         gpu="H200-141GB").trials
        alone = [memlab.estimate(model, shapes, Plan(), device="cuda", gpu="H200-141GB", expandable_segments=on)
                 for on in (False, True)]
        assert plain.reserved_bytes == alone[0].reserved_bytes and EXPANDABLE_NOTE not in plain.notes
        assert switched.reserved_bytes == alone[1].reserved_bytes != plain.reserved_bytes
        assert EXPANDABLE_NOTE in switched.notes and switched.peak_bytes == plain.peak_bytes
