"""Facts about devices that techniques and probes both need: where a model lives, what a GPU can run, and the CUDA
caching allocator's settings as this process's environment gives them (expandable segments, and the lines that turn
them on: read by live runs, the estimates and the search; :mod:`memlab.estimation.cuda.allocator` models them).

Only ``torch`` is imported, and nothing here initialises CUDA unless CUDA is asked about.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

import torch
from torch import nn

__all__ = [
    "ENVIRONMENT_LINE",
    "MEASURED_EXPANDABLE_NOTE",
    "PYTHON_LINE",
    "DeviceLike",
    "bf16_capable",
    "cuda_bf16_supported",
    "cuda_capacity",
    "cuda_device",
    "expandable_segments_configured",
    "expandable_segments_in_use",
    "measured_allocator_notes",
    "model_device",
    "switch_expandable_segments_on",
    "synchronize",
]

DeviceLike = torch.device | str | int


def model_device(model: nn.Module) -> torch.device:
    """The device of the model's first parameter (CPU for a model without parameters).

    Example:
        >>> model_device(nn.Linear(2, 2))
        device(type='cpu')
    """
    for parameter in model.parameters():
        return parameter.device
    return torch.device("cpu")


def cuda_device(device: DeviceLike) -> torch.device:
    """``"cuda"``, ``0``, ``"cuda:1"`` -> a CUDA device with its index (the current one if none).

    Example:
        >>> cuda_device("cuda:1")
        device(type='cuda', index=1)
    """
    resolved = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    if resolved.type != "cuda":
        raise ValueError(f"{resolved} is not a CUDA device; write torch.device('cuda') or 'cuda:0'")
    if resolved.index is None:
        resolved = torch.device("cuda", torch.cuda.current_device())
    return resolved


def bf16_capable(capability: tuple[int, int]) -> bool:
    """Whether an NVIDIA GPU of compute ``capability`` runs bfloat16 natively: 8.0 (Ampere) or newer. Older GPUs (a
    T4, 7.5) emulate it slowly, and their kernels take no bf16 (flash attention, the memory-efficient kernel's
    bf16): the one rule for a live GPU (:func:`cuda_bf16_supported`) and a GPU an estimate is for.

    Example:
        >>> bf16_capable((7, 5)), bf16_capable((8, 0)), bf16_capable((12, 0))
        (False, True, True)
    """
    return tuple(capability) >= (8, 0)


def cuda_bf16_supported(device: DeviceLike | None = None) -> bool:
    """True when ``device`` (default: the current CUDA device) runs bfloat16 natively (compute capability
    >= 8.0, or any ROCm GPU); False without CUDA. Emulated bf16 on older GPUs counts as unsupported: it is slow.

    Example:
        >>> cuda_bf16_supported("cuda") in (True, False)
        True
    """
    if not torch.cuda.is_available():
        return False
    if torch.version.hip:
        return True
    resolved = cuda_device("cuda" if device is None else device)
    properties = torch.cuda.get_device_properties(resolved)
    return bf16_capable((properties.major, properties.minor))


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA); nothing to wait for elsewhere.

    Example:
        >>> synchronize(torch.device("cpu"))
    """
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def cuda_capacity(device: DeviceLike) -> int:
    """The most this process can have allocated on ``device``: what the driver has free plus what torch's caching
    allocator already holds (its tensors, the user's included, and its cache). A trial's peak counts everything the
    process has allocated, so this is what a default budget must compare it with.

    Example:
        >>> cuda_capacity("cuda")  # doctest: +SKIP
        84987740160
    """
    resolved = cuda_device(device)
    free, _ = torch.cuda.mem_get_info(resolved)
    return int(free) + int(torch.cuda.memory_reserved(resolved))


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
    return bool(_expandable_setting(conf))


def _expandable_setting(conf: str) -> bool | None:
    """``expandable_segments`` in an allocator settings string (the last one wins); None where it is not named."""
    setting = None
    for item in conf.split(","):
        key, _, value = item.partition(":")
        if key.strip() == "expandable_segments":
            setting = value.strip() == "True"
    return setting


def expandable_segments_in_use(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this process's caching allocator makes its new segments expandable now: the setting PyTorch last
    parsed where the installed torch says it and names the key (:func:`memlab.live.compat.allocator_settings`:
    ``torch.cuda.memory._set_allocator_settings`` after start included), else the environment's
    (:func:`expandable_segments_configured`).

    Example:
        >>> expandable_segments_in_use({}) in (True, False)
        True
    """
    from memlab.live.compat import allocator_settings

    parsed = _expandable_setting(allocator_settings() or "")
    return expandable_segments_configured(environ) if parsed is None else parsed


def switch_expandable_segments_on() -> Callable[[], None] | None:
    """Make the CUDA caching allocator's new segments expandable now, in this process, where they are not already
    (:func:`expandable_segments_in_use`), and return what switches them off again (PyTorch's default); None where the
    process already makes them (it is left as it is). PyTorch's own runtime setting
    (:func:`memlab.live.compat.set_allocator_settings`) works after CUDA started and changes only the segments made
    after it: the ones already reserved (the model's weights) stay as they were.

    Example:
        >>> undo = switch_expandable_segments_on()  # doctest: +SKIP
        >>> undo is None or undo()  # doctest: +SKIP
    """
    from memlab.live.compat import set_allocator_settings

    if expandable_segments_in_use():
        return None
    set_allocator_settings("expandable_segments:True")

    def switch_off() -> None:
        set_allocator_settings("expandable_segments:False")

    return switch_off


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
