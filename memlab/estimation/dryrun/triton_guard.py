"""No Triton kernel is launched in a dry run: a launch given a fake tensor is skipped, and named in the estimate.

A Triton kernel is Python code that PyTorch's dispatcher never sees: ``kernel[grid](logits, out, ...)`` hands the
tensors' raw pointers to the GPU. Fake tensors have no memory, so a launch made with them inside a dry run is a real
launch on bad pointers: on an H100, ``memlab.estimate`` of TRL's ``SFTTrainer`` (whose entropy and token
log-probabilities go through TRL's fused Triton kernel on CUDA, ``trl/kernels/logprob_entropy.py``) ended in
``an illegal memory access was encountered`` and killed the process's CUDA context. Liger's and Unsloth's kernels are
launched the same way.

Such kernels write into tensors that PyTorch made before the launch (``torch.empty``: fake, and counted by the dry
run), so a launch that is skipped loses no allocation; only what the kernel takes inside itself is not seen, as for
any other operator (:data:`memlab.estimation.dryrun.fake.BLIND_SPOTS`). While a dry run's
:class:`~memlab.estimation.dryrun.fake.FakeMode` is entered, :func:`start_skipping` wraps Triton's two launch
points (``KernelInterface.__getitem__``, the ``kernel[grid](...)`` of plain, autotuned and heuristic kernels alike,
and ``JITFunction.run``): a launch with a fake tensor among its arguments does nothing and its kernel's name is
kept for the estimate's notes (:func:`skipped_kernels_note`); a launch with real tensors (another thread's
training) runs as before. Nothing is imported: where Triton is not loaded (every CPU-only install) there is nothing
to guard.

Example:
    >>> names: set[str] = set()
    >>> with skip_fake_launches(names):
    ...     pass
    >>> print(skipped_kernels_note({"_forward_kernel"}))
    Triton kernels were not launched on fake tensors (_forward_kernel): the tensors they write into are counted, what
    they take inside is not
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch._subclasses.fake_tensor import is_fake

__all__ = ["skip_fake_launches", "skipped_kernels_note", "start_skipping", "stop_skipping"]

_lock = threading.Lock()
_sinks: list[set[str]] = []
"""The name sets of the guards entered now, innermost last: a skipped kernel is named in the innermost."""
_originals: dict[tuple[type, str], Any] = {}


def _has_fake(args: Iterable[Any]) -> bool:
    for value in args:
        if isinstance(value, torch.Tensor) and (value.is_meta or is_fake(value)):
            return True
        if isinstance(value, (list, tuple)) and _has_fake(value):
            return True
    return False


def _kernel_name(kernel: Any) -> str:
    # An autotuned or heuristic kernel holds the JITFunction (``fn``), which holds the Python function (``fn``).
    for _ in range(4):
        name = getattr(kernel, "__name__", None)
        if isinstance(name, str):
            return name
        kernel = getattr(kernel, "fn", None)
        if kernel is None:
            break
    return "a Triton kernel"


def _skipped(kernel: Any) -> None:
    with _lock:
        if _sinks:
            _sinks[-1].add(_kernel_name(kernel))


def _guarded_getitem(original: Callable[..., Any]) -> Callable[..., Any]:
    def getitem(self: Any, grid: Any) -> Callable[..., Any]:
        launch = original(self, grid)

        def launch_unless_fake(*args: Any, **kwargs: Any) -> Any:
            if _has_fake(args) or _has_fake(kwargs.values()):
                _skipped(self)
                return None
            return launch(*args, **kwargs)

        return launch_unless_fake

    return getitem


def _guarded_run(original: Callable[..., Any]) -> Callable[..., Any]:
    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        if _has_fake(args) or _has_fake(kwargs.values()):
            _skipped(self)
            return None
        return original(self, *args, **kwargs)

    return run


def _launch_points() -> list[tuple[type, str, Callable[[Callable[..., Any]], Callable[..., Any]]]]:
    jit = sys.modules.get("triton.runtime.jit")
    points: list[tuple[type, str, Callable[[Callable[..., Any]], Callable[..., Any]]]] = []
    interface = getattr(jit, "KernelInterface", None)
    if isinstance(interface, type) and "__getitem__" in vars(interface):
        points.append((interface, "__getitem__", _guarded_getitem))
    function = getattr(jit, "JITFunction", None)
    if isinstance(function, type) and "run" in vars(function):
        points.append((function, "run", _guarded_run))
    return points


def start_skipping(names: set[str]) -> None:
    """From now on, a Triton launch given a fake (or meta) tensor is skipped and its kernel named in ``names``, until
    :func:`stop_skipping` with the same set. Nested calls share one patch, which the last stop takes away. Plain
    functions rather than only a context manager, so that what enters them (the dry run's
    :class:`~memlab.estimation.dryrun.fake.FakeMode`) holds no generator and stays copyable.

    Example:
        >>> seen: set[str] = set()
        >>> start_skipping(seen); stop_skipping(seen)
    """
    with _lock:
        if not _sinks:
            for owner, attribute, guard in _launch_points():
                original = vars(owner)[attribute]
                _originals[(owner, attribute)] = original
                setattr(owner, attribute, guard(original))
        _sinks.append(names)


def stop_skipping(names: set[str]) -> None:
    """Undo the :func:`start_skipping` that took ``names`` (the launch points come back with the last one).

    Example:
        >>> stop_skipping(set())  # never started: nothing to undo
    """
    with _lock:
        at = next((index for index, sink in enumerate(_sinks) if sink is names), None)
        if at is None:
            return
        del _sinks[at]
        if not _sinks:
            for (owner, attribute), original in _originals.items():
                setattr(owner, attribute, original)
            _originals.clear()


@contextlib.contextmanager
def skip_fake_launches(names: set[str]) -> Iterator[None]:
    """While entered, a Triton launch given a fake (or meta) tensor is skipped and its kernel named in ``names``
    (:func:`start_skipping`). Does nothing where Triton is not imported.

    Example:
        >>> seen: set[str] = set()
        >>> with skip_fake_launches(seen):
        ...     pass
        >>> seen
        set()
    """
    start_skipping(names)
    try:
        yield
    finally:
        stop_skipping(names)


def skipped_kernels_note(names: Iterable[str]) -> str | None:
    """The estimate's note naming the Triton kernels a dry run did not launch (None where there were none).

    Example:
        >>> skipped_kernels_note([]) is None
        True
    """
    listed = sorted(set(names))
    if not listed:
        return None
    return (f"Triton kernels were not launched on fake tensors ({', '.join(listed)}): the tensors they write into are "
            "counted, what they take inside is not")
