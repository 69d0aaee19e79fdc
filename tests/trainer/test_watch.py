"""``memlab.watch`` reads what the trainer's own numbers and memlab's trials read, defined the same way: its rate over a
whole ``train()`` is the Trainer's ``train_samples_per_second``, a step's own rate leaves out the time between steps,
and on CPU a step's peak counts everything the process holds, as a measured trial's does (issue 84 item 8: notebook
14 showed 72 / 305 / 94 samples/s per step beside TRL's 14.35, and a plan drawn at 6.3 MiB "trained at" 4.2)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("datasets")
from test_trainer import dataset, trainer  # noqa: E402
from transformers import TrainerCallback  # noqa: E402

import memlab  # noqa: E402

PAUSE_S = 0.3
"""What a callback after the watch's does between steps (a reporter's upload, a slow logger): far longer than a tiny
model's step, so that a rate with it and a rate without it cannot be mistaken for each other."""


class SlowBetweenSteps(TrainerCallback):  # type: ignore[misc]
    """Time spent in ``train()`` after each step has ended, outside every step."""

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        time.sleep(PAUSE_S)


def test_the_rate_of_a_whole_train_is_the_trainers_and_a_steps_own_leaves_the_time_between_steps_out(
        tmp_path: Path) -> None:
    t = trainer(tmp_path, max_steps=3, logging_steps=3)
    t.add_callback(SlowBetweenSteps())
    watched = memlab.watch(t, show=False)
    try:
        output = t.train()
    finally:
        watched.remove()
    trainers = output.metrics["train_samples_per_second"]
    assert watched.samples == 3 * 2 and watched.train_time_s >= 3 * PAUSE_S
    # The same definition, each timed by its own clock over (almost) the same span of train().
    assert watched.samples_per_s == pytest.approx(trainers, rel=0.15)
    # Each step's own rate counts its own time alone: the pauses after it are not in it.
    steps_alone = watched.samples / sum(record.step_time_s for record in watched.steps)
    assert all(record.step_time_s < PAUSE_S for record in watched.steps)
    assert steps_alone > 2 * watched.samples_per_s


class KeepsAStepsTensor(TrainerCallback):  # type: ignore[misc]
    """What a step leaves alive for the next ones (as a GRPOTrainer's generations are), made inside each step."""

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes
        self.kept: list[torch.Tensor] = []

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.kept.append(torch.ones(self.nbytes // 4))


def test_a_cpu_steps_peak_counts_what_the_process_holds_and_what_earlier_steps_left(tmp_path: Path) -> None:
    """A tensor the notebook holds before ``train()`` counts under "other" in every step, and what a step leaves alive
    counts in the steps after it, as the allocator would count both on a GPU and as a measured trial counts them."""
    size = 4 * 2**20  # far more than the tiny model's step: no step's own variation hides it
    t = trainer(tmp_path, data=dataset([8] * 20), max_steps=3, logging_steps=3)
    keeping = KeepsAStepsTensor(size)
    t.add_callback(keeping)
    held = torch.ones(size // 4)  # the notebook's own tensor, alive through train()
    watched = memlab.watch(t, show=False)
    try:
        t.train()
    finally:
        watched.remove()
    first, second, third = watched.steps
    assert all(record.categories["other"] >= size for record in watched.steps)
    # the tensor step 1 left is in step 2's peak, steps 1 and 2's in step 3's (the steps are otherwise alike)
    assert second.peak_bytes - first.peak_bytes >= size
    assert third.peak_bytes - second.peak_bytes == pytest.approx(size, rel=0.05)
    assert held.numel() and len(keeping.kept) == 3


def test_a_watched_step_and_a_measured_trial_of_the_trainer_read_the_same_peak(tmp_path: Path) -> None:
    """The trainer as built, trained under the watch and measured by ``memlab.measure``: one step of the same rows,
    the same quantity (everything the process holds at the step's peak), within what the Trainer's own step adds
    (its gradient clipping's norms)."""
    t = trainer(tmp_path, data=dataset([16] * 20), max_steps=2, logging_steps=2)
    held = torch.ones(2**20)  # what the notebook holds beside the trainer: counted by both
    watched = memlab.watch(t, show=False)
    try:
        t.train()
    finally:
        watched.remove()
    measured = memlab.measure(t, steps=1, noise=0, progress=False)
    assert measured.status == "ok" and watched.peak_bytes is not None
    assert watched.peak_bytes == pytest.approx(measured.peak_bytes, rel=0.05), (watched.peak.categories,
                                                                               measured.breakdown)
    assert held.numel()
