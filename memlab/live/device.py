"""Facts about devices that techniques and probes both need: where a model lives, what a GPU can run.

Only ``torch`` is imported, and nothing here initialises CUDA unless CUDA is asked about.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["DeviceLike", "cuda_bf16_supported", "cuda_capacity", "cuda_device", "model_device", "synchronize"]

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
    return torch.cuda.get_device_properties(resolved).major >= 8


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
