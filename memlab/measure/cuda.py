"""CUDA probes: the caching allocator's peak over a region, and a real cap on it for a memory budget.

Only ``torch`` is imported and nothing here touches CUDA until a function is called, so importing this
module on a CPU-only machine is free.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from types import TracebackType

import torch

from memlab.measure.device import DeviceLike, cuda_device

__all__ = ["CudaPeak", "cap_cuda_memory"]

class CudaPeak:
    """The CUDA caching allocator's peak over a ``with`` block (synchronised at both ends).

    ``start_allocated`` is what was allocated on entry; ``peak_allocated`` and ``peak_reserved`` are the
    allocator's maxima over the block (``torch.cuda.max_memory_allocated`` / ``max_memory_reserved`` after
    a reset on entry), so they include what was already allocated on entry. The values are read on exit
    even when the block raises.

    Example:
        >>> with CudaPeak(torch.device("cuda")) as probe:  # doctest: +SKIP
        ...     x = torch.empty(1024, 1024, device="cuda")
        >>> probe.peak_allocated - probe.start_allocated  # doctest: +SKIP
        4194304
    """

    def __init__(self, device: DeviceLike) -> None:
        self.device = device
        self.start_allocated = 0
        self.peak_allocated = 0
        self.peak_reserved = 0

    def __enter__(self) -> CudaPeak:
        device = self.device = cuda_device(self.device)
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        self.start_allocated = torch.cuda.memory_allocated(device)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        device = self.device
        torch.cuda.synchronize(device)
        self.peak_allocated = torch.cuda.max_memory_allocated(device)
        self.peak_reserved = torch.cuda.max_memory_reserved(device)


@contextlib.contextmanager
def cap_cuda_memory(budget: int | None, device: DeviceLike) -> Iterator[None]:
    """Cap the CUDA caching allocator at ``budget`` bytes on ``device`` for the block; ``None`` does nothing.

    The cap is ``torch.cuda.set_per_process_memory_fraction(budget / total_memory)`` (at most 1.0): an
    allocation that would take the allocator's reserved memory past it raises ``torch.OutOfMemoryError``,
    like a smaller GPU. Unused cached blocks are given back first so that they do not count against the
    budget. On exit, error or not, the fraction the process had before (1.0 unless someone set another)
    comes back.

    Example:
        >>> with cap_cuda_memory(2 * 1024**3, torch.device("cuda")):  # doctest: +SKIP
        ...     torch.empty(3 * 1024**3, dtype=torch.uint8, device="cuda")
        Traceback (most recent call last):
        ...
        torch.OutOfMemoryError: CUDA out of memory. ...
    """
    if budget is None:
        yield
        return
    resolved = cuda_device(device)
    total = torch.cuda.get_device_properties(resolved).total_memory
    fraction = min(1.0, max(0.0, float(budget) / float(total)))
    getter = getattr(torch.cuda, "get_per_process_memory_fraction", None)  # torch >= 2.7 has it
    previous = getter(resolved) if getter is not None else 1.0
    torch.cuda.empty_cache()
    torch.cuda.set_per_process_memory_fraction(fraction, resolved)
    try:
        yield
    finally:
        torch.cuda.set_per_process_memory_fraction(float(previous), resolved)
