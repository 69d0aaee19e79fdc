"""The kinds of GPU a CUDA estimate made without one can answer for (``gpu=``, ``--gpu``): what each estimate
needs to know of the card it cannot see, in one place.

- the compute capability, which decides the attention kernels CUDA has (:mod:`memlab.estimation.cuda.attention`:
  flash attention needs sm80 or newer);
- the CUDA context of a training process on it (:mod:`memlab.estimation.cuda.context`), with where that figure comes
  from.

Example:
    >>> kind = gpu_kind("L4-24GB")
    >>> kind.device_name, kind.capability
    ('NVIDIA L4', (8, 9))
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from memlab.errors import MemlabError

__all__ = ["DEFAULT_GPU", "GPUS", "GpuKind", "capped", "gpu_kind"]


@dataclass(frozen=True)
class GpuKind:
    """A kind of GPU an estimate can answer for: its name (the ``gpu=`` keyword, ``--gpu``), the name torch gives
    the device, its compute capability, the CUDA context of a training process on it, and where that figure comes
    from; and its memory (``total_memory``), past which the caching allocator releases its cache.

    Example:
        >>> GPUS["A100-80GB"].capability, GPUS["A100-80GB"].device_name
        ((8, 0), 'NVIDIA A100-SXM4-80GB')
    """

    name: str
    device_name: str
    capability: tuple[int, int]
    context_bytes: int
    source: str
    memory_bytes: int


# Measured: an H100 80GB HBM3 (torch 2.11+cu130, CUDA 13.0, driver 580.159.04, lazy module loading), after a compare
# and fits over fp32, bf16, fp16, 8-bit AdamW and offload plans had loaded their kernels: the device's total memory
# (85,017,493,504 bytes) less what the process could hold (free + reserved = 84,205,043,712 bytes), alone on the GPU.
# benchmarks/results/gpu_acceptance-cuda-nvidia-h100-80gb-hbm3.json: device.gpu_memory_bytes less
# parts.restore.outcomes["fit with the default CUDA budget"].capacity.
_H100_CONTEXT = 85_017_493_504 - 84_205_043_712
_MEASURED = "measured on an H100 80GB HBM3, torch 2.11, CUDA 13.0"
# Assumed: no run on these kinds yet; the H100's figure (same driver stack). PyTorch's own measurement of a bare
# context (pytorch/pytorch#86509, CUDA 11.7) was 274 MiB with lazy loading and 636 MiB without: training loads more.
_ASSUMED = "assumed: the H100's figure, not yet measured on this GPU"

# Capabilities from NVIDIA's CUDA GPU list: Hopper 9.0, Ampere data-centre 8.0, Ada 8.9. Memory (what the card figure
# must fit when --gpu is the budget, and where the modelled allocator releases its cache): the H100's is torch's
# total_memory, measured (device.gpu_memory_bytes of the run above); the others the memory.total nvidia-smi reports
# for the board (MiB), not yet measured with memlab: it may hold a few hundred MiB more than torch can use.
_MIB = 2**20
GPUS: dict[str, GpuKind] = {
    kind.name: kind
    for kind in (
        GpuKind("H100-80GB", "NVIDIA H100 80GB HBM3", (9, 0), _H100_CONTEXT, _MEASURED, 85_017_493_504),
        GpuKind("H200-141GB", "NVIDIA H200", (9, 0), _H100_CONTEXT, _ASSUMED, 143_771 * _MIB),
        GpuKind("A100-80GB", "NVIDIA A100-SXM4-80GB", (8, 0), _H100_CONTEXT, _ASSUMED, 81_920 * _MIB),
        GpuKind("A100-40GB", "NVIDIA A100-SXM4-40GB", (8, 0), _H100_CONTEXT, _ASSUMED, 40_960 * _MIB),
        GpuKind("L40S-48GB", "NVIDIA L40S", (8, 9), _H100_CONTEXT, _ASSUMED, 46_068 * _MIB),
        GpuKind("RTX4090-24GB", "NVIDIA GeForce RTX 4090", (8, 9), _H100_CONTEXT, _ASSUMED, 24_564 * _MIB),
        GpuKind("L4-24GB", "NVIDIA L4", (8, 9), _H100_CONTEXT, _ASSUMED, 23_034 * _MIB),
    )
}
"""The GPU kinds an estimate knows, by name."""

DEFAULT_GPU = "H100-80GB"
"""The GPU an estimate for CUDA answers for unless told another (``gpu=``, ``--gpu``)."""


def gpu_kind(name: str | GpuKind | None = None) -> GpuKind:
    """The GPU kind called ``name`` (default :data:`DEFAULT_GPU`; a kind is returned as it is); a MemlabError
    listing the kinds otherwise.

    Example:
        >>> gpu_kind().name, gpu_kind("a100-80gb").device_name
        ('H100-80GB', 'NVIDIA A100-SXM4-80GB')
    """
    if isinstance(name, GpuKind):
        return name
    if name is None:
        return GPUS[DEFAULT_GPU]
    found = {key.lower(): kind for key, kind in GPUS.items()}.get(str(name).lower())
    if found is None:
        raise MemlabError(f"gpu={name!r} is not a GPU memlab knows; write one of {', '.join(GPUS)}")
    return found


def capped(kind: GpuKind | str | None, budget: int) -> GpuKind:
    """The GPU kind ``kind`` (a name, or the default) held to ``budget`` bytes of card: what a real cap on the
    caching allocator at that budget makes of it (:func:`memlab.measure.cuda.cap_cuda_memory`: the allocator may
    reserve the budget less the CUDA context). Replayed on it, the allocator's model gives its cached segments back
    and tries again before it runs out, as the capped allocator does. ``limits`` searches on it and then checks its
    answer on the whole card, since fragmentation can stop the release (:mod:`memlab.search.limits`). The kind itself
    where the budget is not below its memory.

    Example:
        >>> eight = capped("H100-80GB", 8 * 2**30)
        >>> eight.name, eight.memory_bytes == 8 * 2**30, eight.capability
        ('H100-80GB capped at 8 GiB', True, (9, 0))
        >>> capped(None, 10**12) is GPUS[DEFAULT_GPU]
        True
    """
    found = gpu_kind(kind)
    if budget >= found.memory_bytes:
        return found
    shown = f"{budget / 2**30:g} GiB" if budget % 2**20 == 0 else f"{budget:,} bytes"
    return replace(found, name=f"{found.name} capped at {shown}", memory_bytes=budget)
