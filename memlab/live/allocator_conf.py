"""The caching allocator's settings of this process, as PyTorch reads them from the environment: whether CUDA runs
with expandable segments, and the lines that turn them on. Read by live runs (what a measured trial says of its
allocator) and by the estimates and the search (which allocator to model); the model itself is
:mod:`memlab.estimation.cuda.allocator`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

__all__ = [
    "ENVIRONMENT_LINE",
    "MEASURED_EXPANDABLE_NOTE",
    "PYTHON_LINE",
    "expandable_segments_configured",
    "measured_allocator_notes",
]

ENVIRONMENT_LINE = "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
"""The shell line that turns expandable segments on for the processes it starts."""

PYTHON_LINE = 'import os; os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"'
"""The Python line that turns them on, run before torch first touches CUDA (the allocator reads it once)."""


def expandable_segments_configured(environ: Mapping[str, str] | None = None) -> bool:
    """Whether a CUDA process started with ``environ`` (default: this process's environment) runs the caching
    allocator with expandable segments: ``expandable_segments:True`` in ``PYTORCH_CUDA_ALLOC_CONF``, or where that
    is not set in ``PYTORCH_ALLOC_CONF`` (read in that order by ``CUDAAllocatorConfig::instance``; the last
    setting of a key wins). A setting changed later with ``torch.cuda.memory._set_allocator_settings`` is not seen.

    Example:
        >>> expandable_segments_configured({"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:64,expandable_segments:True"})
        True
        >>> expandable_segments_configured({"PYTORCH_ALLOC_CONF": "expandable_segments:True"})
        True
        >>> expandable_segments_configured({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"})
        False
    """
    environ = os.environ if environ is None else environ
    conf = environ.get("PYTORCH_CUDA_ALLOC_CONF")
    if conf is None:
        conf = environ.get("PYTORCH_ALLOC_CONF", "")
    setting = False
    for item in conf.split(","):
        key, _, value = item.partition(":")
        if key.strip() == "expandable_segments":
            setting = value.strip() == "True"
    return setting


MEASURED_EXPANDABLE_NOTE = (
    "reserved_bytes measured with the allocator's expandable segments (expandable_segments:True in this process's "
    "PYTORCH_CUDA_ALLOC_CONF): a process started without them reserves more"
)
"""The note of a CUDA trial measured in a process whose allocator has expandable segments."""


def measured_allocator_notes(device_type: str, environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """What a trial measured on ``device_type`` says of the allocator it ran with: on CUDA with expandable segments
    (:func:`expandable_segments_configured`), :data:`MEASURED_EXPANDABLE_NOTE`; nothing for PyTorch's default.

    Example:
        >>> measured_allocator_notes("cuda", {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}) == (
        ...     MEASURED_EXPANDABLE_NOTE,)
        True
        >>> measured_allocator_notes("cuda", {}), measured_allocator_notes("cpu", {"PYTORCH_ALLOC_CONF": "x"})
        ((), ())
    """
    configured = device_type == "cuda" and expandable_segments_configured(environ)
    return (MEASURED_EXPANDABLE_NOTE,) if configured else ()
