"""Memory probes: CPU/meta tracking by category, CUDA allocator peaks and caps, OOM detection and release."""

from __future__ import annotations

from memlab.measure.cuda import CudaPeak, cap_cuda_memory
from memlab.measure.oom import is_oom_error, release_error, release_memory
from memlab.measure.tracker import CATEGORIES, MemoryTracker

__all__ = [
    "CATEGORIES",
    "CudaPeak",
    "MemoryTracker",
    "cap_cuda_memory",
    "is_oom_error",
    "release_error",
    "release_memory",
]
