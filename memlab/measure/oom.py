"""Out-of-memory detection and release: recognise an OOM, then drop what the failed step still holds.

After an OOM the exception's traceback keeps every frame of the failed step alive, and the frames keep its
tensors (activations, gradients) alive; in a notebook ``sys.last_value`` keeps the traceback too. Until
those are cleared the memory looks leaked.
"""

from __future__ import annotations

import builtins
import gc
import sys
import traceback
from collections.abc import Iterator

import torch

__all__ = ["is_oom_error", "release_error", "release_memory"]

# Substrings of the messages that mean "out of memory" (after accelerate's ``should_reduce_batch_size``):
# CUDA, HIP, MPS and XPU say "... out of memory"; cuBLAS and cuDNN report a failed workspace allocation in
# their own words; the CPU allocator says it cannot allocate.
_OOM_MESSAGES = (
    "out of memory",
    "cublas_status_alloc_failed",
    "cudnn_status_not_supported",
    "defaultcpuallocator: can't allocate memory",
)


# Exception groups are built in from Python 3.11 on.
_GROUP: type[BaseException] | None = getattr(builtins, "BaseExceptionGroup", None)


def _chain(error: BaseException) -> Iterator[BaseException]:
    """``error``, its causes and contexts, and the members of exception groups; each once."""
    seen: set[int] = set()
    stack = [error]
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        for linked in (current.__cause__, current.__context__):
            if linked is not None:
                stack.append(linked)
        if _GROUP is not None and isinstance(current, _GROUP):
            stack.extend(getattr(current, "exceptions", ()))


def _is_oom_itself(error: BaseException) -> bool:
    if isinstance(error, (torch.OutOfMemoryError, MemoryError)):
        return True
    if not isinstance(error, RuntimeError):
        return False
    try:
        message = str(error).lower()
    except Exception:  # a broken __str__ says nothing about memory
        return False
    return any(text in message for text in _OOM_MESSAGES)


def is_oom_error(error: BaseException) -> bool:
    """True when ``error`` (or anything in its cause/context chain) means the device ran out of memory.

    That is ``torch.OutOfMemoryError`` (memlab's budget raises it too), Python's ``MemoryError``, and the
    ``RuntimeError`` messages that mean the same: "CUDA out of memory", "HIP out of memory", "MPS backend
    out of memory", "CUBLAS_STATUS_ALLOC_FAILED", "CUDNN_STATUS_NOT_SUPPORTED", "DefaultCPUAllocator: can't
    allocate memory". Pure: it only reads the exceptions.

    Example:
        >>> is_oom_error(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))
        True
        >>> is_oom_error(ValueError("shape mismatch"))
        False
    """
    return any(_is_oom_itself(linked) for linked in _chain(error))


def release_error(error: BaseException | None) -> None:
    """Drop the frames (and so the tensors) that a failed step's exception keeps alive.

    Clears every frame of the traceback of ``error`` and of its causes and contexts, detaches the
    tracebacks, and forgets ``sys.last_value``/``sys.last_traceback``/``sys.last_exc`` when they refer to
    this error. Frames still running (the caller's own) are left alone. The exception keeps its type and
    message.

    Example:
        >>> try:
        ...     raise RuntimeError("CUDA out of memory")
        ... except RuntimeError as caught:
        ...     error = caught
        >>> release_error(error)
        >>> error.__traceback__ is None
        True
    """
    if error is None:
        return
    chain = list(_chain(error))
    for linked in chain:
        if linked.__traceback__ is not None:
            traceback.clear_frames(linked.__traceback__)
            linked.__traceback__ = None
    ids = {id(linked) for linked in chain}
    last_value = getattr(sys, "last_value", None)
    last_exc = getattr(sys, "last_exc", None)
    if (last_value is not None and id(last_value) in ids) or (last_exc is not None and id(last_exc) in ids):
        sys.last_type = None  # type: ignore[assignment]
        sys.last_value = None  # type: ignore[assignment]
        sys.last_traceback = None  # type: ignore[assignment]
        if hasattr(sys, "last_exc"):
            sys.last_exc = None  # type: ignore[assignment]


def release_memory(*, collect: bool = True) -> None:
    """Collect garbage and, where CUDA is initialised, give the allocator's cached blocks back.

    ``collect=False`` skips the (slow, ~0.5 s with transformers loaded) full collection: a step that ended
    normally leaves its tensors to reference counting; only a failed one ties them into cycles through frames.
    Never initialises CUDA.

    Example:
        >>> release_memory()
    """
    if collect:
        gc.collect()
    if torch.cuda.is_initialized():
        torch.cuda.empty_cache()
