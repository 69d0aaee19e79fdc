"""No Triton kernel is launched in a dry run: a launch given a fake tensor is skipped, and named in the estimate.

A Triton kernel is Python code that PyTorch's dispatcher never sees: ``kernel[grid](logits, out, ...)`` hands the
tensors' raw pointers to the GPU. Fake tensors have no memory, so a launch made with them inside a dry run is a real
launch on bad pointers: on an H100, ``memlab.estimate`` of TRL's ``SFTTrainer`` (whose entropy and token
log-probabilities go through TRL's fused Triton kernel on CUDA, ``trl/kernels/logprob_entropy.py``) ended in
``an illegal memory access was encountered`` and killed the process's CUDA context. Liger's and Unsloth's kernels are
launched the same way.

Such kernels write into tensors that PyTorch made before the launch (``torch.empty``: fake, and counted by the dry
run); the one buffer a launch takes itself is Triton's global scratch, which
:mod:`memlab.estimation.dryrun.triton_launches` knows or bounds from the launch (a declared table of the kernels
memlab users meet, the compiled kernel's metadata, the kernel's source) and counts around the skipped launch. While a
dry run's :class:`~memlab.estimation.dryrun.fake.FakeMode` is entered, :func:`start_skipping` wraps Triton's two
launch points (``KernelInterface.__getitem__``, the ``kernel[grid](...)`` of plain, autotuned and heuristic kernels
alike, and ``JITFunction.run``): a launch with a fake tensor among its arguments is not made, what it would have
taken is counted (:func:`~memlab.estimation.dryrun.triton_launches.take_around_launch`), and its kernel is named,
with how its bytes were known or what bounds them, in the estimate's notes (:func:`skipped_kernels_note`); a launch
with real tensors (another thread's training) runs as before. Nothing is imported: where Triton is not loaded
(every CPU-only install) the only kernels to guard are memlab's stand-ins for TRL's
(:class:`~memlab.estimation.cuda.branches.StandInKernel`, whose ``kernel[grid]`` is guarded the same way), launched
where a dry run for CUDA follows TRL's GPU branch.

Example:
    >>> names: set[str] = set()
    >>> with skip_fake_launches(names):
    ...     pass
    >>> print(skipped_kernels_note({"_forward_kernel"}))
    Triton kernels were not launched on fake tensors (_forward_kernel): the tensors they write into, made around them,
    are counted; not counted: _forward_kernel (at most its global scratch)
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch._subclasses.fake_tensor import is_fake

from memlab.estimation.cuda.branches import StandInKernel
from memlab.estimation.dryrun.triton_launches import Launch, LaunchCost, launch_cost, launches_note, take_around_launch

__all__ = ["skip_fake_launches", "skipped_kernels_note", "start_skipping", "stop_skipping"]

_lock = threading.Lock()
_sinks: list[set[str]] = []
"""The name sets of the guards entered now, innermost last: a skipped kernel is named in the innermost."""
_originals: dict[tuple[type, str], Any] = {}


def has_fake(values: Iterable[Any]) -> bool:
    """Whether ``values`` (a call's arguments, lists and tuples looked into) hold a fake or meta tensor: a call a
    dry run makes, which must not launch a real kernel.

    Example:
        >>> has_fake([1, (torch.empty(2, device="meta"),)]), has_fake([torch.zeros(2)])
        (True, False)
    """
    for value in values:
        if isinstance(value, torch.Tensor) and (value.is_meta or is_fake(value)):
            return True
        if isinstance(value, (list, tuple)) and has_fake(value):
            return True
    return False


def _skipped(launch: Launch) -> None:
    """Name the skipped launch's kernel in the innermost guard's sink, with what memlab made of its bytes, and take
    those bytes around it (outside the lock: the dry run's tracker sees the buffer)."""
    try:
        cost = launch_cost(launch)
    except Exception as error:  # noqa: BLE001 - a kernel object of a Triton memlab did not read: named, not counted
        cost = LaunchCost(None, "unknown", f"its global scratch ({type(error).__name__} reading the launch)")
    with _lock:
        if not _sinks:
            return
        sink = _sinks[-1]
        record = getattr(sink, "record", None)
        if record is not None:
            record(launch.name, cost)
        else:
            sink.add(launch.name)
    if cost.counted:
        take_around_launch(cost.counted, (*launch.args, *launch.kwargs.values()))


def _guarded_getitem(original: Callable[..., Any]) -> Callable[..., Any]:
    def getitem(self: Any, grid: Any) -> Callable[..., Any]:
        launch = original(self, grid)

        def launch_unless_fake(*args: Any, **kwargs: Any) -> Any:
            if has_fake(args) or has_fake(kwargs.values()):
                _skipped(Launch(self, grid, args, kwargs))
                return None
            return launch(*args, **kwargs)

        return launch_unless_fake

    return getitem


def _guarded_run(original: Callable[..., Any]) -> Callable[..., Any]:
    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        if has_fake(args) or has_fake(kwargs.values()):
            launched = {key: value for key, value in kwargs.items() if key not in ("grid", "warmup")}
            _skipped(Launch(self, kwargs.get("grid"), args, launched))
            return None
        return original(self, *args, **kwargs)

    return run


def _launch_points() -> list[tuple[type, str, Callable[[Callable[..., Any]], Callable[..., Any]]]]:
    jit = sys.modules.get("triton.runtime.jit")
    points: list[tuple[type, str, Callable[[Callable[..., Any]], Callable[..., Any]]]] = [
        (StandInKernel, "__getitem__", _guarded_getitem)]
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
    """The estimate's note naming the Triton kernels a dry run did not launch (None where there were none), and what
    their launches took themselves: counted, with how memlab knew it, or not counted, with its bound
    (:func:`~memlab.estimation.dryrun.triton_launches.launches_note`; ``names`` a
    :class:`~memlab.estimation.dryrun.triton_launches.SkippedKernels` carries the costs).

    Example:
        >>> skipped_kernels_note(["_rms_norm_forward"]).startswith("Triton kernels were not launched on fake tensors")
        True
        >>> skipped_kernels_note([]) is None
        True
    """
    listed = sorted(set(names))
    if not listed:
        return None
    said = launches_note(listed, getattr(names, "costs", {}))
    return (f"Triton kernels were not launched on fake tensors ({', '.join(listed)}): the tensors they write into, "
            f"made around them, are counted; {said}")
