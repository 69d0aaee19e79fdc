"""The OOM predicate on fake errors, and release of what a failed step's traceback holds."""

from __future__ import annotations

import builtins
import sys
import weakref
from collections.abc import Iterator

import pytest
import torch

from memlab.measure import is_oom_error, release_error, release_memory

OOM_MESSAGES = [
    "CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 15.78 GiB total capacity)",
    "CUDA error: out of memory",
    "HIP out of memory. Tried to allocate 20.00 MiB",
    "MPS backend out of memory (MPS allocated: 8.00 GB, other allocations: 1.00 GB)",
    "XPU out of memory. Tried to allocate 1.00 GiB",
    "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
    "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED. This error may appear if you passed in a non-contiguous input.",
    "[enforce fail at alloc_cpu.cpp:114] data. DefaultCPUAllocator: can't allocate memory: "
    "you tried to allocate 1099511627776 bytes. Error code 12 (Cannot allocate memory)",
    "memlab budget: out of memory: the step needs more than 1.0 KiB",
]


@pytest.mark.parametrize("message", OOM_MESSAGES)
def test_runtime_errors_with_oom_messages_are_oom(message: str) -> None:
    assert is_oom_error(RuntimeError(message))


def test_torch_and_python_oom_types_are_oom_whatever_the_message() -> None:
    assert is_oom_error(torch.OutOfMemoryError("anything"))
    assert is_oom_error(MemoryError())


@pytest.mark.parametrize(
    "error",
    [
        ValueError("shape mismatch"),
        RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x3 and 4x3)"),
        RuntimeError("CUDA error: device-side assert triggered"),
        KeyError("out of memory"),  # the words, but not an error from an allocator
        TypeError("forward() missing 1 required positional argument"),
        KeyboardInterrupt(),
    ],
)
def test_other_errors_are_not_oom(error: BaseException) -> None:
    assert not is_oom_error(error)


def test_oom_found_through_cause_and_context() -> None:
    try:
        try:
            raise torch.OutOfMemoryError("CUDA out of memory")
        except RuntimeError as inner:
            raise ValueError("loss failed") from inner
    except ValueError as outer:
        assert is_oom_error(outer)

    try:
        try:
            raise RuntimeError("CUBLAS_STATUS_ALLOC_FAILED")
        except RuntimeError:
            raise KeyError("while handling") from None  # context kept, only hidden from display
    except KeyError as outer:
        assert is_oom_error(outer)


def test_cyclic_chains_terminate() -> None:
    first, second = ValueError("a"), ValueError("b")
    first.__context__, second.__context__ = second, first
    assert not is_oom_error(first)


def test_exception_groups_are_searched() -> None:
    group_type = getattr(builtins, "ExceptionGroup", None)
    if group_type is None:
        pytest.skip("exception groups need Python 3.11")
    group = group_type("trials", [ValueError("x"), RuntimeError("CUDA out of memory")])
    assert is_oom_error(group)


def _allocate_and_fail(refs: list[weakref.ref[torch.UntypedStorage]]) -> None:
    activations = torch.empty(50 * 1024 * 1024 // 4)  # 50 MB held only by this frame
    refs.append(weakref.ref(activations.untyped_storage()))
    raise torch.OutOfMemoryError("CUDA out of memory (simulated)")


def test_release_frees_a_tensor_held_by_the_traceback() -> None:
    refs: list[weakref.ref[torch.UntypedStorage]] = []
    error: BaseException | None = None
    try:
        _allocate_and_fail(refs)
    except torch.OutOfMemoryError as caught:
        error = caught
    release_memory()
    assert refs[0]() is not None  # the traceback's frame still holds the 50 MB
    release_error(error)
    release_memory()
    assert refs[0]() is None
    assert error is not None and error.__traceback__ is None
    assert is_oom_error(error)  # type and message survive


def test_release_follows_the_cause_chain() -> None:
    refs: list[weakref.ref[torch.UntypedStorage]] = []
    error: BaseException | None = None
    try:
        try:
            _allocate_and_fail(refs)
        except torch.OutOfMemoryError as inner:
            raise RuntimeError("trial failed") from inner
    except RuntimeError as outer:
        error = outer
    release_error(error)
    release_memory()
    assert refs[0]() is None


@pytest.fixture
def restore_last_error() -> Iterator[None]:
    saved = {
        name: getattr(sys, name)
        for name in ("last_type", "last_value", "last_traceback", "last_exc")
        if hasattr(sys, name)
    }
    yield
    for name in ("last_type", "last_value", "last_traceback", "last_exc"):
        if name in saved:
            setattr(sys, name, saved[name])
        elif hasattr(sys, name):
            delattr(sys, name)


@pytest.mark.usefixtures("restore_last_error")
def test_release_forgets_the_interpreters_last_error() -> None:
    refs: list[weakref.ref[torch.UntypedStorage]] = []
    try:
        _allocate_and_fail(refs)
    except torch.OutOfMemoryError as caught:
        sys.last_type, sys.last_value, sys.last_traceback = type(caught), caught, caught.__traceback__
        if sys.version_info >= (3, 12):
            sys.last_exc = caught
    last = sys.last_value
    release_error(last)
    del last
    release_memory()
    assert sys.last_value is None and sys.last_traceback is None
    assert refs[0]() is None


@pytest.mark.usefixtures("restore_last_error")
def test_release_leaves_an_unrelated_last_error_alone() -> None:
    unrelated = ValueError("earlier")
    sys.last_value = unrelated
    release_error(RuntimeError("CUDA out of memory"))
    assert sys.last_value is unrelated


def test_release_of_none_and_release_memory_are_harmless() -> None:
    release_error(None)
    release_memory()
