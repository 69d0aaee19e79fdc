"""Training and inference run on one runner: the same warm-up rule, warm device types and events, with the
workloads saying only what differs."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest
import torch
from torch import nn

import memlab
from memlab.events import StepFinished
from memlab.inference.run import InferenceRunner, InferenceWorkload
from memlab.options import RunOptions
from memlab.runner import core
from memlab.runner.core import EXTRA_WARMUP_LIMIT, Runner, runner_for
from memlab.runner.training import TrainingWorkload
from memlab.runner.trial import TrialRunner

PACKAGE = Path(memlab.__file__).parent


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


def _never_steady_clock() -> object:
    """Each reading is three times the last: no two warm-up steps ever take about the same time."""
    now = {"t": 1.0}

    def clock() -> float:
        now["t"] *= 3.0
        return now["t"]

    return clock


def test_both_runners_are_the_one_runner_configured_with_a_workload() -> None:
    for runner, workload in ((TrialRunner, TrainingWorkload), (InferenceRunner, InferenceWorkload)):
        assert issubclass(runner, Runner) and runner.workload_type is workload
        own = [name for name, value in vars(runner).items() if inspect.isfunction(value) or isinstance(value, property)]
        assert own == [], f"{runner.__name__} defines {own}: runner logic belongs in memlab.runner.core.Runner"


@pytest.mark.parametrize(
    ("plan", "runner", "options"),
    [
        (memlab.Plan(), TrialRunner, RunOptions(loss_fn=lambda m, b: m(b).sum(), steps=1, noise=0, warmup=1)),
        (memlab.InferencePlan(), InferenceRunner, RunOptions(steps=1, noise=0, warmup=1)),
    ],
)
def test_a_cold_process_warms_up_by_the_same_rule_for_training_and_inference(
    monkeypatch: pytest.MonkeyPatch, plan: object, runner: type[Runner], options: RunOptions  # type: ignore[type-arg]
) -> None:
    monkeypatch.setattr(core, "_WARM_DEVICE_TYPES", set())
    events: list[object] = []
    trial = runner(_mlp(), torch.randn(4, 4), options.replace(callback=events.append),
                   clock=_never_steady_clock()).run(plan)  # type: ignore[arg-type]
    warmups = [event for event in events if isinstance(event, StepFinished) and event.kind == "warmup"]
    assert trial.status == "ok"
    assert len(warmups) == 1 + EXTRA_WARMUP_LIMIT  # the requested step, then the one extra limit
    assert core._WARM_DEVICE_TYPES == {"cpu"}  # one set of warm device types, whichever workload ran first
    events.clear()
    runner(_mlp(), torch.randn(4, 4), options.replace(callback=events.append)).run(plan)  # type: ignore[arg-type]
    assert sum(isinstance(e, StepFinished) and e.kind == "warmup" for e in events) == 1  # now warm: as requested


def test_the_plan_type_chooses_the_runner_once() -> None:
    assert runner_for([memlab.Plan()]) is TrialRunner
    assert runner_for(memlab.InferencePlan()) is InferenceRunner
    assert runner_for([memlab.InferencePlan(), memlab.Plan()]) is InferenceRunner  # the first plan decides
    assert runner_for(None) is None and runner_for([]) is None


def test_the_runner_never_imports_the_inference_mode() -> None:
    imported = []
    for path in sorted((PACKAGE / "runner").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                imported += [(path.name, node.module)]
            elif isinstance(node, ast.Import):
                imported += [(path.name, alias.name) for alias in node.names]
    assert [(name, module) for name, module in imported if module.startswith("memlab.inference")] == []


def test_a_dry_run_tracks_a_requests_first_step_and_warms_a_training_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """On fake tensors nothing is timed: a request leaves no state, so its first step is the tracked one (a warm-up
    before it doubled a GRPO estimate's generation); training's first step still makes the optimizer state first."""
    from transformers import LlamaConfig

    from memlab.estimation.dryrun.single_gpu import dry_run_inference, dry_run_plans
    from memlab.inference.step import InferenceStep
    from memlab.runner.step import TrainingStep

    calls = {"request": 0, "training": 0}

    def counting(kind: str, original: object) -> object:
        def call(self: object, *args: object, **kwargs: object) -> object:
            calls[kind] += 1
            return original(self, *args, **kwargs)  # type: ignore[operator]
        return call

    monkeypatch.setattr(InferenceStep, "__call__", counting("request", InferenceStep.__call__))
    monkeypatch.setattr(TrainingStep, "__call__", counting("training", TrainingStep.__call__))
    config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                         vocab_size=64)
    request = dry_run_inference(config, {"input_ids": (1, 8)}, memlab.InferencePlan(new_tokens=2), device="cpu")
    assert request[0].status == "ok" and calls["request"] == 1
    training = dry_run_plans(config, {"input_ids": (2, 8), "labels": (2, 8)}, [memlab.Plan()], device="cpu")
    assert training[0].status == "ok" and training[0].breakdown["optimizer"] > 0 and calls["training"] == 2
