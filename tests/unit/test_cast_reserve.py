"""The card figure of a model cast to bf16 in place (``Plan(weights="bf16")`` on an fp32 model; issue 57 item 3).

The H200 run measured Phi-3's and Mistral's pure bf16 rows (an fp32 model that memlab casts) at a reserved peak of
1.24 and 1.18 times the trial's own step reserve: ``max_memory_reserved`` over the whole ``measure`` call took in
memlab's teardown, which cast the trained weights back to fp32 beside the step's optimizer state, in new segments
(the step's cached blocks, half the copies' size, could not hold them). The step releases its state first now, and
the weights lever gives the cache back after its cast and around its undo (``torch.cuda.empty_cache`` on a live
CUDA model; the allocator's model is told instead on a dry run), so that the whole call reserves no more than the
step: what the estimate gives.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from memlab import Plan
from memlab.estimation.cuda.allocator import MIB
from memlab.estimation.dryrun.reserved import ReservedTrace
from memlab.options import RunOptions
from memlab.runner.trial import TrialRunner
from memlab.techniques import weights

RUN = Path(__file__).parents[2] / "benchmarks" / "results" / "gpu_acceptance-cuda-nvidia-h200-heldout-loads.json"


def _replayed(plan: Plan) -> ReservedTrace:
    """A trial of ``plan`` on an fp32 model of four 16 MiB layers (each its own segment), followed by the
    allocator's model from placement to the trial's end."""
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(2048, 2048, bias=False) for _ in range(4)])
    batch = torch.randn(64, 2048)
    trace = ReservedTrace(torch.device("cpu"))
    runner = TrialRunner(model, batch, RunOptions(loss_fn=lambda m, b: m(b).float().pow(2).mean(), steps=1),
                         listener=trace.listen)
    with runner.session(), trace.trial(model, batch):
        trace.pause()
        trial = runner.run(plan)
    assert trial.status == "ok", trial.error
    assert model[0].weight.dtype == torch.float32  # the plan came off
    return trace


def test_taking_pure_bf16_off_reserves_no_more_than_the_step() -> None:
    trace = _replayed(Plan(weights="bf16"))
    assert trace.reserved_bytes is not None and trace.call_reserved_bytes is not None
    # Before: the undo's fp32 copies took new segments beside the optimizer state (230 MiB where the step reserved 214).
    assert trace.call_reserved_bytes == trace.reserved_bytes, (trace.call_reserved_bytes / MIB,
                                                               trace.reserved_bytes / MIB)


def test_the_cast_gives_the_cache_back_only_to_a_model_on_a_dry_run(monkeypatch: pytest.MonkeyPatch) -> None:
    called: list[str] = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: called.append("cuda"))
    told: list[str] = []
    model = nn.Linear(8, 8)
    with weights.modelled_release(lambda: told.append("model")):
        undo = weights.cast_weights(model, Plan(weights="bf16"))
        assert undo is not None
        undo()
    assert told == ["model"] * 3 and called == []  # after the cast, before and after the undo; never CUDA
    undo = weights.cast_weights(model, Plan(weights="bf16"))  # a CPU model: nothing to give back
    assert undo is not None
    undo()
    assert called == []


def _h200_row(model: str) -> dict[str, Any]:
    rows = json.loads(RUN.read_text())["parts"]["heldout"]["rows"]
    return next(row for row in rows if row["model"] == model and row["plan"] == "bf16-weights"
                and row["length"] == 512)


@pytest.mark.parametrize("family", ["phi3", "mistral"])
def test_the_h200_step_reserve_of_a_cast_model(family: str) -> None:
    """The H200's pure bf16 rows at 2 x 512 ran an fp32 model that memlab cast: estimated with that load, the
    reserve is within 5% of the trial's own (its steps': ``trial.reserved_bytes``). The row's whole-call figure
    (``reserved_peak_bytes``) also held the old teardown, which this memlab no longer does."""
    from transformers import AutoConfig

    import memlab

    row = _h200_row(family)
    fields = dict(row["config"])
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    config.architectures = [row["architecture"]]
    batch = {name: tuple(shape) for name, shape in row["batch_shapes"].items()}
    trial = memlab.estimate(config, batch, Plan(weights="bf16"), device="cuda", load={"dtype": torch.float32})
    assert trial.status == "ok", trial.error
    measured = row["trial"]["reserved_bytes"]
    assert abs(trial.reserved_bytes / measured - 1) <= 0.05, trial.reserved_bytes / measured
    assert row["reserved_peak_bytes"] > 1.15 * measured  # the old whole call's teardown, for the record
