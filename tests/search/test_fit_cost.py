"""fit's cost (issue 60): how many plans it measures, with the estimates pruning, on its own benchmark's model."""

from __future__ import annotations

import pytest
import torch
from models import mlp_batch, mlp_loss, tiny_mlp

import memlab
from benchmarks import common
from benchmarks.fit_vs_grid import SIZES
from memlab.search import MAX_TRIALS


def _selective_setup() -> tuple[torch.nn.Module, torch.Tensor, dict, dict, int]:
    model, batch = tiny_mlp(blocks=8, width=64), mlp_batch(rows=512, width=64)
    options = dict(loss_fn=mlp_loss, steps=1, warmup=0, noise=0, progress=False)
    space = {"micro_batch": [512], "precision": ["fp32"], "optimizer": ["adamw"]}
    peaks = {k: memlab.measure(model, batch, memlab.Plan(checkpointing=k), **options).peak_bytes for k in (0, 8)}
    return model, batch, options, space, (peaks[0] + peaks[8]) // 2


def test_selective_checkpointing_trials_count_against_max_trials() -> None:
    # plain does not fit, every block checkpointed does: the bisection over blocks comes after the search
    model, batch, options, space, budget = _selective_setup()
    report = memlab.fit(model, batch, budget=budget, space=space, max_trials=2, **options)
    assert [t.plan.checkpointing for t in report.trials] == [False, True]
    report = memlab.fit(model, batch, budget=budget, space=space, max_trials=3, **options)
    assert len(report.trials) == 3 and report.best is not None


def test_estimates_narrow_the_bisection_over_blocks() -> None:
    model, batch, options, space, budget = _selective_setup()
    report = memlab.fit(model, batch, budget=budget, space=space, **options)
    selective = [t for t in report.trials if t.plan.checkpointing not in (False, True)]
    # without estimates a bisection over 8 blocks measures 3; the estimates point at the boundary and its neighbour
    assert 1 <= len(selective) <= 2, [(t.label, t.peak_bytes, budget) for t in report.trials]
    fewest = min(t.plan.checkpointing for t in selective if t.status == "ok" and t.peak_bytes <= budget)
    assert memlab.measure(model, batch, memlab.Plan(checkpointing=fewest - 1), **options).peak_bytes > budget
    unguided = memlab.fit(model, batch, budget=budget, space=space, estimates=False, **options)
    assert min(t.plan.checkpointing for t in unguided.trials
               if t.plan.checkpointing not in (False, True) and t.status == "ok" and t.peak_bytes <= budget) == fewest


@pytest.mark.slow
def test_fit_measures_at_most_15_plans_on_its_benchmark() -> None:
    # benchmarks/fit_vs_grid.py --small: its Llama, batch and budget (0.6 x the plain plan's peak), default space
    size = SIZES["small"]
    model = common.llama_model(hidden=size.hidden, layers=size.layers, heads=size.heads, vocab=size.vocab,
                               positions=size.length)
    batch = common.lm_batch(vocab=size.vocab, rows=size.batch_size, length=size.length)
    plain = memlab.measure(model, batch, memlab.Plan(), steps=1, warmup=1, noise=0, progress=False)
    budget = int(0.6 * plain.peak_bytes)
    report = memlab.fit(model, batch, budget=budget, batch_size=size.batch_size, steps=1, warmup=1, noise=0,
                        progress=False)
    assert report.best is not None and report.best.peak_bytes <= budget
    assert len(report.trials) <= MAX_TRIALS == 15
    assert len(report.trials) + len(report.skipped) >= 64  # the default space: 4 micro-batches x 2^4 levers
