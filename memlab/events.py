"""Progress events: plain frozen dataclasses that the core hands to a callback while trials run.

The core (``measure``, ``compare``, ``fit``) calls ``callback(event)`` with one of these; front ends (the tqdm
bar, the live figure, the widget panel) only render what they receive and never reach back into the core.

Example:
    >>> from memlab.plan import Plan
    >>> seen: list[Event] = []
    >>> callback: Callback = seen.append
    >>> callback(TrialStarted(plan=Plan(), index=0, total=2))
    >>> seen[0].total
    2
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from memlab.plan import Plan
from memlab.report import Trial

__all__ = [
    "Callback", "Event", "MemorySample", "StepFinished", "TrialFinished", "TrialSettled", "TrialStarted", "STEP_KINDS"
]

STEP_KINDS = ("warmup", "tracked", "timed")


@dataclass(frozen=True)
class TrialStarted:
    """A trial of ``plan`` begins; it is trial ``index`` (from 0) of ``total``.

    Example:
        >>> TrialStarted(plan=Plan(checkpointing=True), index=0, total=3).plan.label()
        'ckpt'
    """

    plan: Plan
    index: int
    total: int


@dataclass(frozen=True)
class StepFinished:
    """One optimizer step of a trial is done.

    Args:
        plan: the plan being tried.
        index: which trial (from 0).
        step: the step number within its kind (from 0).
        kind: ``"warmup"`` (not timed), ``"tracked"`` (memory breakdown, not timed) or ``"timed"``.
        seconds: wall-clock seconds the step took.
        loss: the step's loss as a float, or None where it was not read.
        live_bytes: memory live at the end of the step, or None where unknown.
        peak_bytes: peak memory so far in this trial, or None where unknown.

    Example:
        >>> StepFinished(Plan(), index=0, step=1, kind="timed", seconds=0.5, loss=2.3,
        ...              live_bytes=None, peak_bytes=1024).kind
        'timed'
    """

    plan: Plan
    index: int
    step: int
    kind: str
    seconds: float
    loss: float | None
    live_bytes: int | None
    peak_bytes: int | None


@dataclass(frozen=True)
class MemorySample:
    """Live memory of the running trial ``index`` at ``seconds`` since the trial started.

    Example:
        >>> MemorySample(Plan(), index=0, seconds=0.25, live_bytes=4096).live_bytes
        4096
    """

    plan: Plan
    index: int
    seconds: float
    live_bytes: int


@dataclass(frozen=True)
class TrialFinished:
    """Trial ``index`` of ``total`` is done (``ok``, ``oom`` or ``error``): its result is ``trial``.

    Example:
        >>> from memlab.report import Trial
        >>> t = Trial(Plan(), status="oom", peak_bytes=0, breakdown={}, step_time_s=None,
        ...           samples_per_s=None, tokens_per_s=None, device="cpu")
        >>> TrialFinished(trial=t, index=1, total=2).trial.status
        'oom'
    """

    trial: Trial
    index: int
    total: int


@dataclass(frozen=True)
class TrialSettled:
    """Trial ``index`` was timed again in turn with its close rivals (A B A B) and its runs pooled: ``trial``
    replaces what its :class:`TrialFinished` and its re-runs' said (the re-runs each send TrialStarted and
    TrialFinished with the same ``index``).

    Example:
        >>> from memlab.report import Trial
        >>> t = Trial(Plan(), "ok", 10, {}, 0.5, 16.0, None, "cpu")
        >>> TrialSettled(trial=t, index=0, total=2).index
        0
    """

    trial: Trial
    index: int
    total: int


Event = TrialStarted | StepFinished | MemorySample | TrialFinished | TrialSettled
"""Any progress event."""

Callback = Callable[[Event], None]
"""What the core calls with each event; it should return quickly and must not raise."""
