"""What :func:`memlab.fit` was asked, as one object: :class:`FitRequest`, which every step of the search takes
instead of a list of positional arguments.

``fit`` builds it once (on a trainer, from what the trainer holds: its model, batch, loss, kind and plan) and checks
it (:meth:`FitRequest.checked`); the steps after it (:mod:`memlab.search.fitting.space` and those after it) trust it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from torch import nn

from memlab.errors import MemlabError
from memlab.estimation.cuda.gpus import GpuKind
from memlab.live.batch import Batch, count_rows
from memlab.options import RunOptions
from memlab.plan import Plan
from memlab.report import Trial
from memlab.trainer.entry import LiveTarget

__all__ = ["FitRequest"]


@dataclass(frozen=True)
class FitRequest:
    """Everything a search on a module was asked.

    ``model`` and ``batch`` are what runs (a trainer's model and batch where fit was given a trainer); ``batch_size``
    the effective batch (None: the batch's rows, until :meth:`checked`); ``space`` the user's restriction of the
    levers (None: the default space); ``dry_run``: rank by estimates alone; ``estimates``: prune a measured search
    with dry runs; ``max_trials``: at most this many plans measured (None: no limit); ``selective``: whether the
    fewest checkpointed blocks that fit are searched for (:func:`memlab.search.blocks.fewest_blocks`) where the best
    plan checkpoints every block; ``options``: the run's options, validated; ``kind``: a trainer kind's
    :class:`~memlab.trainer.entry.LiveTarget` whose step has its own runner and dry run (a GRPOTrainer's), else None;
    ``held``: ``held(trial) -> trial`` adds to each of the model's own dry runs what the trainer holds beside the model
    (a DPOTrainer's reference model: :func:`memlab.trainer.reference.with_reference`), else None; ``gpu``: the GPU
    kind a dry run is for (its space, its budget, its card figures), resolved by ``fit``, else None; ``first``: the
    plan a measured search runs first where the space holds it (a trainer as built, so that the report's first row
    is what ``memlab.measure(trainer)`` measures), else the search's own first.

    Example:
        >>> import torch
        >>> request = FitRequest(torch.nn.Linear(4, 1), torch.randn(6, 4), options=RunOptions(budget="1MiB"))
        >>> request.checked().batch_size, request.checked().rows
        (6, 6)
        >>> request.replace(max_trials=0).checked()
        Traceback (most recent call last):
        ...
        memlab.errors.MemlabError: max_trials=0 is not allowed; write a whole number >= 1, ...
    """

    model: nn.Module
    batch: Batch
    batch_size: int | None = None
    space: Mapping[str, Sequence[Any]] | None = None
    dry_run: bool = False
    estimates: bool = True
    max_trials: int | None = None
    selective: bool = True
    options: RunOptions = dataclasses.field(default_factory=RunOptions)
    kind: LiveTarget | None = None
    held: Callable[[Trial], Trial] | None = None
    gpu: GpuKind | None = None
    first: Plan | None = None

    def replace(self, **changes: Any) -> FitRequest:
        """The same request with ``changes`` (field names as keywords)."""
        return dataclasses.replace(self, **changes)

    @property
    def rows(self) -> int:
        """The rows of the batch given."""
        return count_rows(self.batch)

    def checked(self) -> FitRequest:
        """The request with its model, ``batch_size`` (the batch's rows where none was given) and ``max_trials``
        checked; a MemlabError saying what to write where one is wrong."""
        if not isinstance(self.model, nn.Module):
            raise MemlabError(f"model must be a torch nn.Module, not {type(self.model).__name__}")
        batch_size = self.rows if self.batch_size is None else self.batch_size
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise MemlabError(f"batch_size={batch_size!r} is not allowed; write a whole number >= 1, e.g. "
                              "batch_size=32")
        max_trials = self.max_trials
        if max_trials is not None and (isinstance(max_trials, bool) or not isinstance(max_trials, int)
                                       or max_trials < 1):
            raise MemlabError(
                f"max_trials={max_trials!r} is not allowed; write a whole number >= 1, e.g. max_trials=15, or None "
                "for no limit"
            )
        return self.replace(batch_size=batch_size)

    @property
    def effective_batch(self) -> int:
        """``batch_size`` of a checked request (:meth:`checked` fills it in)."""
        assert self.batch_size is not None, "FitRequest.checked() fills batch_size in"
        return self.batch_size
