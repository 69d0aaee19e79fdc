"""A dry run's garbage collection: none on its own, and the process's thresholds back afterwards
(memlab.runner.collection)."""

from __future__ import annotations

import gc
import threading

import pytest
import torch
from torch import nn

from memlab.estimation.estimate import estimate_plans
from memlab.plan import Plan
from memlab.runner.collection import without_full_collections


def _full_collections_on_their_own() -> bool:
    return gc.get_threshold()[2] < 1 << 20 or gc.get_threshold()[0] < 1 << 20


def test_no_collection_inside_and_the_thresholds_back_after() -> None:
    before = gc.get_threshold()
    with without_full_collections():
        young, middle, full = gc.get_threshold()
        assert middle == before[1] and not _full_collections_on_their_own()

        class Cycle:
            def __init__(self) -> None:
                self.me = self

        Cycle()
        assert gc.collect() > 0  # an explicit collection still frees the cycle
    assert gc.get_threshold() == before


def test_an_error_inside_still_puts_the_thresholds_back() -> None:
    before = gc.get_threshold()
    with pytest.raises(ValueError, match="inside"), without_full_collections():
        raise ValueError("inside")
    assert gc.get_threshold() == before


def test_nested_and_in_two_threads_the_last_to_end_puts_them_back() -> None:
    before = gc.get_threshold()
    entered, release = threading.Event(), threading.Event()

    def other_dry_run() -> None:
        with without_full_collections():
            entered.set()
            release.wait(10)

    thread = threading.Thread(target=other_dry_run)
    with without_full_collections():
        with without_full_collections():
            pass
        assert not _full_collections_on_their_own()  # the inner one's end changed nothing
        thread.start()
        assert entered.wait(10)
    assert not _full_collections_on_their_own(), "ended while the other thread's dry run runs"
    release.set()
    thread.join(10)
    assert gc.get_threshold() == before


def test_a_dry_run_runs_without_full_collections() -> None:
    seen: list[bool] = []

    def loss_fn(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
        seen.append(_full_collections_on_their_own())
        return model(batch).sum()

    before = gc.get_threshold()
    report = estimate_plans(nn.Linear(8, 4), torch.randn(2, 8), [Plan()], loss_fn=loss_fn, device="cpu")
    assert report.trials[0].status == "ok"
    assert seen and not any(seen)
    assert gc.get_threshold() == before

