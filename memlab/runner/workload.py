"""What a kind of run (training, inference) adds to the one runner: a :class:`Workload`.

The runner (:class:`~memlab.runner.core.Runner`) owns everything trials share: the session that captures the model
and gives it back bit-exact, the warm-up, the tracked step and its breakdown, the timed steps, the record of a trial,
the events, Ctrl-C and the A B A B re-measurement of a close race. A workload says only what differs, as PyTorch's
``FSDPMemTracker`` adds to ``MemTracker`` only what FSDP changes:

- which plans it takes, and what it refuses before the model is touched (:meth:`Workload.check_plans`,
  :meth:`Workload.check`);
- how a plan is put on the model and taken off, and what one step is: an :class:`Attempt`;
- which categories the memory tracker charges, and what it counts before a step (:meth:`Attempt.baseline`);
- how a finished record becomes a trial, in its speed units (:meth:`Workload.to_trial`).

The training workload is :class:`~memlab.runner.training.TrainingWorkload`; inference adds its own in
:mod:`memlab.inference.run`.
"""

from __future__ import annotations

import statistics
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, Literal, Protocol, TypeVar

import torch
from torch import nn

from memlab.live.batch import Batch
from memlab.live.device import measured_allocator_notes
from memlab.live.quiet import without_paths
from memlab.measure.oom import is_oom_error
from memlab.measure.probes import Probe
from memlab.measure.reading import PeakReading
from memlab.measure.timeline import Recording
from memlab.measure.tracker import CATEGORIES, MemoryTracker
from memlab.options import RunOptions
from memlab.report.timeline import Timeline

__all__ = ["Attempt", "RunContext", "RunnablePlan", "StepKind", "TrialRecord", "Workload"]

StepKind = Literal["warmup", "tracked", "timed"]
"""Which of a trial's steps runs: a warm-up step, the tracked step (the memory breakdown) or a timed step."""


class RunnablePlan(Protocol):
    """What the runner needs of any workload's plan: a label (events, progress, notes) and rows per step."""

    def label(self) -> str: ...

    def rows_per_step(self, batch_rows: int) -> int: ...


PlanT = TypeVar("PlanT", bound=RunnablePlan)
RecordT = TypeVar("RecordT", bound="TrialRecord")
TrialT = TypeVar("TrialT")


@dataclass(frozen=True)
class RunContext:
    """What a workload runs on: the live model, its batch (``rows`` rows), the run's options, the device's probe and
    the clock steps are timed with."""

    model: nn.Module
    batch: Batch
    options: RunOptions
    probe: Probe
    clock: Callable[[], float] = time.perf_counter
    rows: int = 0

    @property
    def device(self) -> torch.device:
        """The device trials run on (the probe's)."""
        return self.probe.device


class TrialRecord:
    """What one trial has found so far, whatever the workload; its workload turns it into a trial at the end,
    whatever stopped it. A workload with more to record (inference: prefill and decode times) subclasses it.

    Example:
        >>> record = TrialRecord("plan", held_before_bytes=0)
        >>> record.fail(MemoryError("out of memory")); record.status, record.error
        ('oom', 'MemoryError: out of memory')
    """

    def __init__(self, plan: Any, held_before_bytes: int, categories: tuple[str, ...] = CATEGORIES) -> None:
        self.plan = plan
        self.categories = categories
        self.status = "error"
        self.error: str | None = None
        self.reading = PeakReading(breakdown=dict.fromkeys(categories, 0))
        self.held_before_bytes = held_before_bytes
        # What the plan's levers kept in host memory at the most, by their own accounting, and the host budget.
        self.host_bytes = 0
        self.host_budget: int | None = None
        self.step_times: list[float] = []
        self.notes: list[str] = []
        # The tracked step as it went (memlab.measure.timeline), once it has run.
        self.recording: Recording | None = None
        # On CUDA, the allocator's own snapshot of the tracked step (torch.cuda.memory._snapshot()).
        self.allocator_snapshot: dict[str, Any] | None = None
        # A compiled plan's first warm-up step, which compiles: never part of the step time.
        self.compile_seconds: float | None = None

    @property
    def ok(self) -> bool:
        """Whether the trial ran to the end."""
        return self.status == "ok"

    @property
    def step_time(self) -> float | None:
        """The median timed step in seconds (None unless the trial ran to the end and timed steps)."""
        return statistics.median(self.step_times) if self.ok and self.step_times else None

    def fail(self, error: BaseException) -> None:
        """Record the error that stopped the trial (out of memory, or any other): its type and first line, with the
        machine's paths cut to their last part (the report is shown in notebooks that are shared)."""
        self.status = "oom" if is_oom_error(error) else "error"
        message = without_paths(str(error)).strip().splitlines()
        first_line = message[0] if message else ""
        self.error = f"{type(error).__name__}: {first_line}" if first_line else type(error).__name__

    def trial_fields(self, *, device: torch.device, budget: int | None, rss_bytes: int | None) -> dict[str, Any]:
        """The fields every kind of trial has, from what was recorded (the workload adds its speeds).

        Example:
            >>> TrialRecord("plan", 0).trial_fields(device=torch.device("cpu"), budget=None, rss_bytes=None)["status"]
            'error'
        """
        return {
            "plan": self.plan,
            "status": self.status,
            "peak_bytes": int(self.reading.peak_bytes),
            "breakdown": {k: v for k, v in self.reading.breakdown.items() if k in self.categories},
            "step_time_s": self.step_time,
            "device": str(device),
            "error": self.error,
            "budget": budget,
            "reserved_bytes": self.reading.reserved_bytes,
            "context_bytes": self.reading.context_bytes,
            "rss_bytes": rss_bytes,
            "preexisting_bytes": self.held_before_bytes,
            "notes": tuple(dict.fromkeys((*self.notes, *(measured_allocator_notes(device.type)
                                                         if self.reading.reserved_bytes is not None else ())))),
            "step_times": tuple(self.step_times) if self.ok else (),
            "timeline": self.timeline(device),
            "host_bytes": self.host_bytes,
            "host_budget": self.host_budget,
            "compile_seconds": self.compile_seconds,
        }

    def timeline(self, device: torch.device) -> Timeline | None:
        """The tracked step's timeline, its peak the reading's (None where no tracked step ran)."""
        if self.recording is None or len(self.recording) == 0:
            return None
        return Timeline.from_recording(
            self.recording, peak_bytes=int(self.reading.peak_bytes),
            breakdown={k: v for k, v in self.reading.breakdown.items() if k in self.categories}, device=str(device),
            allocator_snapshot=self.allocator_snapshot,
        )


class Attempt(ABC):
    """One plan put on the model by its workload: what one step is, and how the plan comes off again."""

    @abstractmethod
    def step(self, tracker: MemoryTracker | None, kind: StepKind) -> float | None:
        """Run one step (with a tracker, its allocations are charged to their categories); the loss, if any."""

    @abstractmethod
    def baseline(self) -> dict[str, list[torch.Tensor | None]]:
        """Tensors alive before a step, by category, besides the batch and memory held before ("other")."""

    def steady(self) -> bool:
        """Whether the steps after the warm-up's so far are steady-state (training: once optimizer state exists)."""
        return True

    warms_state = True
    """Whether a first step leaves state the next one starts from (training's optimizer state, a GradScaler's scale):
    where it leaves none, a dry run, which times nothing, tracks the first step without a warm-up before it."""

    def host_bytes(self) -> int:
        """The most host memory the plan's levers held at once over the steps so far, by their own accounting."""
        return 0

    @property
    def compiles(self) -> bool:
        """Whether the step runs under ``torch.compile``: its first warm-up step compiles (timed apart), and its peak
        is read from the allocator (:mod:`memlab.measure.compiled`)."""
        return False

    @abstractmethod
    def take_off(self) -> None:
        """Take the plan off the model (the session then restores values and structure)."""


class Workload(ABC, Generic[PlanT, RecordT, TrialT]):
    """What a kind of run adds to the runner (see the module's description). A workload is made per runner, on
    its :class:`RunContext`.

    Example:
        >>> from memlab.runner.training import TrainingWorkload
        >>> TrainingWorkload.categories
        ('params', 'grads', 'optimizer', 'activations', 'other')
    """

    categories: tuple[str, ...] = CATEGORIES
    """The memory tracker's categories ("other" among them)."""

    def __init__(self, context: RunContext) -> None:
        self.context = context

    @classmethod
    def check_model(cls, model: nn.Module) -> None:
        """A clear error for a model this workload cannot run, before anything else is looked at."""

    @classmethod
    def check_options(cls, options: RunOptions) -> None:
        """A clear error for an option that means nothing to this workload."""

    @classmethod
    @abstractmethod
    def check_plans(cls, plans: Any) -> list[PlanT]:
        """The plans as a non-empty list of this workload's plans; a clear error for anything else."""

    def check(self, plan: PlanT) -> None:
        """A clear error, before anything runs, for a plan this model or batch cannot run."""

    def copies_parameters(self, plan: PlanT) -> bool:
        """Whether ``plan`` changes the trainable weights, so that the session must copy them first."""
        return False

    @abstractmethod
    def new_record(self, plan: PlanT, held_before_bytes: int) -> RecordT:
        """An empty record of a trial of ``plan``."""

    @abstractmethod
    def put_on(self, plan: PlanT, record: RecordT) -> Attempt:
        """Put ``plan`` on the model (notes about it go to ``record``)."""

    @abstractmethod
    def to_trial(self, record: RecordT, *, budget: int | None, rss_bytes: int | None) -> TrialT:
        """The finished record as a trial, with this workload's speeds."""

