"""accumulation: micro-batches whose gradients add up to the full batch's, on every tiny model of the suite."""

from __future__ import annotations

import pytest
from models import (
    MODELS,
    optimizer_gradients,
    relative_error,
)

import memlab


@pytest.mark.parametrize("name", sorted(MODELS))
def test_accumulation_gives_the_full_batch_gradient(name):
    build, make_batch, loss_fn = MODELS[name]
    model, batch = build(), make_batch(rows=8)
    full = optimizer_gradients(model, batch, memlab.Plan(micro_batch=8, accumulation=1), loss_fn)
    for micro_batch, accumulation in ((2, 4), (4, 2)):
        plan = memlab.Plan(micro_batch=micro_batch, accumulation=accumulation)
        accumulated = optimizer_gradients(model, batch, plan, loss_fn)
        assert len(accumulated) == len(full)
        assert relative_error(accumulated, full) < 1e-4, plan.label()
