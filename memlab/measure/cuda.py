"""CUDA probes: the caching allocator's peak over a region, what the driver holds beside it (the CUDA context), and
a real cap on the allocator that leaves the context room within a memory budget.

Only ``torch`` is imported and nothing here touches CUDA until a function is called, so importing this
module on a CPU-only machine is free.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
from collections.abc import Iterator
from types import TracebackType

import torch

from memlab.live.device import DeviceLike, cuda_capacity, cuda_device

__all__ = ["CudaPeak", "cap_cuda_memory", "cuda_card_capacity", "cuda_context_bytes"]


def cuda_context_bytes(device: DeviceLike) -> int:
    """What the driver holds on ``device`` for this process beyond torch's caching allocator: the CUDA context (its
    loaded kernel modules, per-thread stacks) and what libraries take outside the allocator. With the allocator's
    reserve it is what nvidia-smi shows for the process, and what an out-of-memory error is about.

    Where ``pynvml`` (nvidia-ml-py) is importable and NVML lists this process on the device, the figure is this
    process's own: its used memory there (as nvidia-smi lists it per process) less ``torch.cuda.memory_reserved``.
    Otherwise it is the device's used memory (``torch.cuda.mem_get_info``: total less free) less the reserve, which
    also counts every other process on the same GPU as this one's context: on a shared GPU that figure is too large.

    Example:
        >>> cuda_context_bytes("cuda")  # doctest: +SKIP
        551550976
    """
    resolved = cuda_device(device)
    reserved = int(torch.cuda.memory_reserved(resolved))
    used = _process_used_bytes(resolved)
    if used is None:
        free, total = torch.cuda.mem_get_info(resolved)
        used = int(total) - int(free)
    return max(0, used - reserved)


def cuda_card_capacity(device: DeviceLike) -> int:
    """The most the card figure of this process can reach on ``device``, the default budget of a search there: what
    the process can have allocated (:func:`~memlab.live.device.cuda_capacity`) and its CUDA context beside it.
    Capped at this budget less the context (:func:`cap_cuda_memory`), the allocator can take what is free.

    Example:
        >>> cuda_card_capacity("cuda")  # doctest: +SKIP
        85017493504
    """
    return cuda_capacity(device) + cuda_context_bytes(device)


def _process_used_bytes(device: torch.device) -> int | None:
    """This process's memory on ``device`` as NVML counts it; None without pynvml (or on ROCm), when NVML fails, or
    when it does not list this process (in a container, NVML may list the host's process ids)."""
    if torch.version.hip or importlib.util.find_spec("pynvml") is None:
        return None
    import pynvml

    try:
        pynvml.nvmlInit()  # counted by NVML, and left initialised, as torch.cuda's own NVML readers do
        # NVML names a GPU "GPU-<uuid>"; torch's uuid is the same 8-4-4-4-12 hex, without the prefix.
        uuid = f"GPU-{torch.cuda.get_device_properties(device).uuid}".encode()
        processes = pynvml.nvmlDeviceGetComputeRunningProcesses(pynvml.nvmlDeviceGetHandleByUUID(uuid))
    except pynvml.NVMLError:
        return None
    pid = os.getpid()
    used = [process.usedGpuMemory for process in processes if process.pid == pid]
    return int(used[0]) if used and used[0] is not None else None

class CudaPeak:
    """The CUDA caching allocator's peak over a ``with`` block (synchronised at both ends).

    ``start_allocated`` is what was allocated on entry; ``peak_allocated`` and ``peak_reserved`` are the
    allocator's maxima over the block (``torch.cuda.max_memory_allocated`` / ``max_memory_reserved`` after
    a reset on entry), so they include what was already allocated on entry. The values are read on exit even when
    the block raises. ``context`` is what the driver holds beside the allocator after the block
    (:func:`cuda_context_bytes`: the kernels the block loaded are in it), read when first asked for after the block
    (None before), so that a probe whose context nobody reads (``memlab.watch``'s, once per step) costs nothing more.

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
        self._exited = False
        self._context: int | None = None

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
        self._exited = True

    @property
    def context(self) -> int | None:
        """What the driver holds beside the allocator after the block (read once, when first asked for)."""
        if self._exited and self._context is None:
            self._context = cuda_context_bytes(self.device)
        return self._context


@contextlib.contextmanager
def cap_cuda_memory(budget: int | None, device: DeviceLike) -> Iterator[None]:
    """Hold this process to ``budget`` bytes on ``device`` for the block, as a card of that size would; ``None`` does
    nothing.

    The budget is what the card shows for the process: the caching allocator's reserve and the CUDA context beside
    it (:func:`cuda_context_bytes`, read on entry). So the allocator is capped at ``budget`` less the context, by
    ``torch.cuda.set_per_process_memory_fraction((budget - context) / total_memory)`` (at most 1.0): an
    allocation that would take the allocator's reserved memory past it raises ``torch.OutOfMemoryError``,
    like a smaller GPU. Unused cached blocks are given back first so that they do not count against the
    budget. On exit, error or not, the fraction the process had before (1.0 unless someone set another)
    comes back. (Kernels first loaded inside the block add to the context after the cap is set.)

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
    getter = getattr(torch.cuda, "get_per_process_memory_fraction", None)  # torch >= 2.7 has it
    previous = getter(resolved) if getter is not None else 1.0
    torch.cuda.empty_cache()
    fraction = min(1.0, max(0.0, float(budget - cuda_context_bytes(resolved)) / float(total)))
    torch.cuda.set_per_process_memory_fraction(fraction, resolved)
    try:
        yield
    finally:
        torch.cuda.set_per_process_memory_fraction(float(previous), resolved)
