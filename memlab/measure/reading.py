"""A trial's memory reading: the tracker's breakdown, made true to the allocator where there is one."""

from __future__ import annotations

from dataclasses import dataclass, field

from memlab.measure.cuda import CudaPeak
from memlab.measure.tracker import CATEGORIES, MemoryTracker

__all__ = ["PeakReading", "read_peak"]


@dataclass
class PeakReading:
    """The peak of a step and where it went.

    Attributes:
        peak_bytes: the peak (the allocator's on CUDA, else the tracker's).
        breakdown: bytes per category at the peak; adds up to ``peak_bytes``.
        reserved_bytes: the CUDA caching allocator's reserved peak, else None.
        held_before_bytes: memory already allocated when the step began that tracking does not know (CUDA).
    """

    peak_bytes: int = 0
    breakdown: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CATEGORIES, 0))
    reserved_bytes: int | None = None
    held_before_bytes: int | None = None


def read_peak(tracker: MemoryTracker, allocator: CudaPeak | None, tracked_at_start: int = 0) -> PeakReading:
    """The reading of a tracked step: the tracker's breakdown, and on CUDA the allocator's peak, with what tracking
    did not see (rounding, workspaces, memory held before the step) under "other".

    Example:
        >>> import torch
        >>> tracker = MemoryTracker(baseline={"params": [torch.ones(4)]})
        >>> read_peak(tracker, None).breakdown["params"]
        16
    """
    breakdown = dict(tracker.breakdown)
    if allocator is None or not allocator.peak_allocated:
        return PeakReading(tracker.peak_bytes, breakdown)
    peak = allocator.peak_allocated
    known = sum(value for key, value in breakdown.items() if key != "other")
    breakdown["other"] = max(0, peak - known)
    return PeakReading(
        peak,
        breakdown,
        reserved_bytes=allocator.peak_reserved,
        held_before_bytes=max(0, allocator.start_allocated - tracked_at_start),
    )
