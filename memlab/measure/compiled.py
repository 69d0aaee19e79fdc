"""A compiled step's memory: what memlab's tracker cannot see, read from the allocator.

Dynamo runs a function eagerly while a ``TorchDispatchMode`` is on the stack (unless the mode says it ignores
compile internals), and the kernels a compiled step runs allocate their buffers past the dispatcher. So a compiled
step is tracked by :class:`CompiledStepTracker`, a :class:`~memlab.measure.tracker.MemoryTracker` that lets dynamo
run its compiled code (it still sees the weights, the optimizer's state and step, and each gradient the step marks),
and its peak is the allocator's: CUDA's statistics (:class:`~memlab.measure.cuda.CudaPeak`), or on the CPU
:class:`CpuAllocatorPeak`, every allocation and free the CPU allocator reports to ``torch.profiler``. What the
tracker did not see is counted under "other" (:func:`compiled_reading`).

Example:
    >>> import torch
    >>> with CompiledStepTracker() as tracker, CpuAllocatorPeak(tracker.live_bytes) as peak:
    ...     x = torch.ones(1024)
    ...     del x
    >>> peak.peak_allocated >= 4096
    True
"""

from __future__ import annotations

from types import TracebackType
from typing import Any

from memlab.live.compat import profiled_allocations
from memlab.measure.reading import PeakReading
from memlab.measure.tracker import MemoryTracker

__all__ = ["CompiledStepTracker", "CpuAllocatorPeak", "compiled_reading"]


class CompiledStepTracker(MemoryTracker):
    """A memory tracker under which dynamo runs compiled code (``ignore_compile_internals``): the step's own
    operators outside compiled regions are charged as usual; the compiled kernels' buffers are not seen."""

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True


class CpuAllocatorPeak:
    """The CPU allocator's peak over a ``with`` block: ``start_bytes`` (what was live on entry, as the caller counts
    it) plus the most the block's allocations, less its frees, ever held, from ``torch.profiler``'s memory events.

    ``peak_allocated`` is 0 where this torch's profiler gives no allocation events (the tracker's peak stands then).
    """

    peak_reserved: int | None = None
    context: int | None = None

    def __init__(self, start_bytes: int) -> None:
        self.start_bytes = start_bytes
        self.peak_allocated = 0
        self._profile: Any = None

    def __enter__(self) -> CpuAllocatorPeak:
        import torch

        self._profile = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True)
        self._profile.__enter__()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        profile, self._profile = self._profile, None
        profile.__exit__(exc_type, exc, tb)
        events = profiled_allocations(profile)
        if not events:
            return
        live = most = 0
        for _, size in events:
            live += size
            most = max(most, live)
        self.peak_allocated = self.start_bytes + most


def compiled_reading(tracker: MemoryTracker, allocator: Any) -> PeakReading:
    """The reading of a compiled step: the allocator's peak (``allocator.peak_allocated``, where it has one), the
    tracker's categories, and what the tracker did not see (the compiled kernels' buffers: activations, gradients
    being made) under "other".

    Example:
        >>> import torch
        >>> tracker = MemoryTracker(baseline={"params": [torch.ones(4)]})
        >>> class Peak: peak_allocated, peak_reserved, context = 100, None, None
        >>> compiled_reading(tracker, Peak()).breakdown["other"]
        84
    """
    breakdown = dict(tracker.breakdown)
    peak = int(getattr(allocator, "peak_allocated", 0) or 0)
    if peak <= tracker.peak_bytes:
        return PeakReading(max(peak, tracker.peak_bytes), breakdown)
    known = sum(value for key, value in breakdown.items() if key != "other")
    breakdown["other"] = max(0, peak - known)
    return PeakReading(peak, breakdown, reserved_bytes=getattr(allocator, "peak_reserved", None),
                       context_bytes=getattr(allocator, "context", None))
