"""A dry run's garbage collection: only what the dry run made is walked, and the caller's collector is as it was
afterwards (memlab.estimation.dryrun.collector)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest
import torch
from torch import nn

from memlab.estimation.dryrun.collector import collect_only_new_objects
from memlab.estimation.estimate import estimate_plans
from memlab.plan import Plan


@pytest.fixture(autouse=True)
def _nothing_frozen() -> Iterator[None]:
    # tests/conftest.py freezes the session's objects before each test: these tests start from a heap as a user's
    # process has it, nothing frozen, and freeze it again afterwards
    gc.unfreeze()
    yield
    assert gc.get_freeze_count() == 0, "a test left objects frozen"
    gc.freeze()


def test_objects_made_before_are_frozen_and_given_back_and_new_garbage_is_still_collected() -> None:
    class Cycle:
        def __init__(self) -> None:
            self.me = self

    before = Cycle()
    with collect_only_new_objects():
        assert gc.get_freeze_count() > 0
        assert gc.is_tracked(before) and not any(obj is before for obj in gc.get_objects())  # out of every generation
        made = Cycle()
        alive = [made]
        del made
        alive.clear()
        assert gc.collect() > 0  # the cycle made inside is garbage the collector frees
    assert any(obj is before for obj in gc.get_objects())  # back in a generation: collected again as before


def test_an_error_inside_still_gives_every_object_back() -> None:
    with pytest.raises(ValueError, match="inside"), collect_only_new_objects():
        raise ValueError("inside")
    assert gc.get_freeze_count() == 0


def test_the_callers_own_frozen_objects_stay_frozen() -> None:
    theirs = [object()]
    gc.freeze()
    try:
        with collect_only_new_objects():
            made_inside = [object()]
        assert gc.get_freeze_count() > 0
        listed = gc.get_objects()
        assert not any(obj is theirs for obj in listed), "memlab unfroze the caller's frozen objects"
        assert any(obj is made_inside for obj in listed)  # and froze nothing of its own
    finally:
        gc.unfreeze()


def test_a_dry_run_runs_with_the_objects_before_it_frozen_and_unfreezes_them() -> None:
    seen: list[int] = []

    def loss_fn(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
        seen.append(gc.get_freeze_count())
        return model(batch).sum()

    report = estimate_plans(nn.Linear(8, 4), torch.randn(2, 8), [Plan()], loss_fn=loss_fn, device="cpu")
    assert report.trials[0].status == "ok"
    assert seen and min(seen) > 0
