"""A trial's memory reading: the tracker's breakdown, made true to the allocator where there is one."""

from __future__ import annotations

from dataclasses import dataclass, field

from memlab.measure.cuda import CudaPeak
from memlab.measure.tracker import CATEGORIES, MemoryTracker

__all__ = ["PeakReading", "read_failed_peak", "read_peak"]


@dataclass
class PeakReading:
    """The peak of a step and where it went.

    Attributes:
        peak_bytes: the peak (the allocator's on CUDA, else the tracker's).
        breakdown: bytes per category at the peak; adds up to ``peak_bytes``.
        reserved_bytes: the CUDA caching allocator's reserved peak, else None.
        context_bytes: what the driver holds beside the allocator at the end (the CUDA context), else None.
    """

    peak_bytes: int = 0
    breakdown: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CATEGORIES, 0))
    reserved_bytes: int | None = None
    context_bytes: int | None = None


def read_peak(tracker: MemoryTracker, allocator: CudaPeak | None) -> PeakReading:
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
    return PeakReading(peak, breakdown, reserved_bytes=allocator.peak_reserved, context_bytes=allocator.context)


def read_failed_peak(reading: PeakReading, allocator: CudaPeak | None) -> PeakReading:
    """The reading of a step that failed untracked (an out-of-memory in the first warm-up step, on CUDA): the
    allocator's peak, when it is more than what was known, all of it under "other" (what held it is unknown).

    Example:
        >>> read_failed_peak(PeakReading(10, {"params": 10}), None).peak_bytes
        10
    """
    if allocator is None or allocator.peak_allocated <= reading.peak_bytes:
        return reading
    return PeakReading(allocator.peak_allocated, {"other": allocator.peak_allocated}, allocator.peak_reserved,
                       allocator.context)
