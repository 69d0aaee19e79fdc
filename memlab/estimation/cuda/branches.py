"""Library code that picks its kernels by the tensors' device, answered as on the GPU a dry run emulates.

A dry run for a GPU this machine does not have keeps its fake tensors on the CPU's device
(:func:`~memlab.estimation.cuda.devices.kernels_device`), so a library that branches on ``tensor.device`` takes its CPU
path there, which can keep other memory than its GPU path. TRL 1.16 does so in the step of every trainer that scores
tokens (``trl/trainer/utils.py``, ``trl/kernels/chunked_logprob.py``): on CUDA with Triton, its log-probabilities and
entropy go through fused kernels (``selective_log_softmax_and_entropy``; the chunked LM head's tile kernels, fed only
the valid positions) and its fp32 gradient GEMMs through ``torch.addmm(..., out_dtype=torch.float32)``; elsewhere it
materializes the log-softmax, folds the tiles with torch ops and copies each tile to fp32. On an H100 a DPOTrainer's
step estimated along the CPU's path came out 1.40x the one the GPU ran (12.88 against 9.23 GB).

While :func:`gpu_branches` is entered (the CUDA emulation, :func:`~memlab.estimation.cuda.kernels.cuda_kernels`),
those choices answer as on a CUDA machine with Triton, in the dry run's thread only (another thread's real training
keeps its own answers):

- ``_use_triton(device)`` wherever TRL's modules hold it, and in ``trl.trainer.utils`` ``is_triton_available`` and
  ``_supports_trl_loss_kernel`` (TRL's own check, asked of the tensors as if they sat on CUDA);
- ``_addmm_fp32`` takes TRL's CUDA branch, the same ``torch.addmm`` into the fp32 accumulator;
- where Triton is not installed (any CPU-only machine), TRL's kernels are :class:`StandInKernel` objects and
  ``logprob_entropy`` is TRL's own module imported against a stand-in ``triton`` (:func:`standin_triton`). A launch
  of a stand-in on fake tensors is skipped and counted as any Triton launch in a dry run is
  (:mod:`memlab.estimation.dryrun.triton_guard` guards :class:`StandInKernel` too); TRL's host code, which makes every
  tensor the kernels write into, runs as on the GPU.

Liger Kernel does so in its fused linear cross-entropy (``liger_kernel/ops/fused_linear_cross_entropy.py``, 0.8.x):
``_can_use_mm_out`` reads the input's device, and on CUDA one ``(chunk, vocabulary)`` logits buffer is made before
the chunks and each chunk's logits written into it (``torch.mm(out=)``), where elsewhere each chunk makes its own
(two alive as the next replaces the last). While emulating, it answers as on CUDA.

Nothing stays changed afterwards: every attribute is put back, and the stand-in ``triton`` never stays in
``sys.modules``.

Example:
    >>> with gpu_branches():
    ...     pass
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import sys
import threading
import types
from collections.abc import Callable, Iterator
from typing import Any

import torch

from memlab.errors import MemlabError
from memlab.live.patching import patched

__all__ = ["StandInKernel", "gpu_branches", "standin_triton"]

_TRL_KERNELS = {
    "trl.kernels.chunked_logprob": ("_forward_kernel", "_backward_kernel"),
    "trl.kernels.chunked_divergence": ("_stats_kernel", "_jsd_kernel", "_backward_kernel"),
}
"""TRL 1.16's Triton kernels by module: written with ``_jit``, which leaves a plain function where Triton is missing."""

_state = threading.local()


def _emulating() -> bool:
    return getattr(_state, "depth", 0) > 0


class StandInKernel:
    """A Triton kernel where Triton is not installed: ``kernel[grid](...)`` as Triton writes a launch. Inside a dry
    run the launch is skipped (the guard wraps :meth:`__getitem__`, as it wraps Triton's own); anywhere else it refuses,
    since no kernel can run here.

    Example:
        >>> def fold(x_ptr, n):
        ...     pass
        >>> kernel = StandInKernel(fold)
        >>> kernel.fn is fold, kernel.__name__
        (True, 'fold')
    """

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self.__name__ = getattr(fn, "__name__", "a Triton kernel")
        self.__module__ = getattr(fn, "__module__", __name__)

    def __getitem__(self, grid: Any) -> Callable[..., Any]:
        def launch(*args: Any, **kwargs: Any) -> Any:
            raise MemlabError(
                f"{self.__name__} is a Triton kernel and Triton is not installed here: memlab stands it in only for a "
                "dry run (memlab.estimate for device='cuda'); run the step on a GPU machine with Triton"
            )

        return launch

    def run(self, *args: Any, grid: Any = None, **kwargs: Any) -> Any:
        return self[grid](*args, **kwargs)


class _Anything(types.ModuleType):
    """``triton.language`` for a module that only names it: ``tl.constexpr`` in annotations, ``tl.float32`` in
    defaults. Kernel bodies, which use the rest, never run."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return type(name, (), {})


def standin_triton() -> types.ModuleType:
    """A ``triton`` package with what a module needs to be imported and to launch: ``jit`` (making
    :class:`StandInKernel` objects), ``cdiv``, ``next_power_of_2`` and a ``language`` that names anything.

    Example:
        >>> triton = standin_triton()
        >>> triton.cdiv(10, 4), triton.next_power_of_2(5), isinstance(triton.jit(lambda: None), StandInKernel)
        (3, 8, True)
    """
    package = types.ModuleType("triton")
    language = _Anything("triton.language")

    def jit(fn: Callable[..., Any] | None = None, **_options: Any) -> Any:
        return StandInKernel(fn) if fn is not None else StandInKernel

    package.jit = jit  # type: ignore[attr-defined]
    package.cdiv = lambda a, b: -(-a // b)  # type: ignore[attr-defined]
    package.next_power_of_2 = lambda n: 1 << max(int(n) - 1, 0).bit_length()  # type: ignore[attr-defined]
    package.language = language  # type: ignore[attr-defined]
    return package


@functools.cache
def _fused_logprob_entropy() -> Callable[..., Any] | None:
    """TRL's ``selective_log_softmax_and_entropy`` (``trl/kernels/logprob_entropy.py``, which imports Triton at its
    top), imported against :func:`standin_triton` and then taken out of ``sys.modules`` again, with the stand-in."""
    name = "trl.kernels.logprob_entropy"
    triton = standin_triton()
    stand_ins = {"triton": triton, "triton.language": triton.language}
    saved = {key: sys.modules.get(key) for key in (*stand_ins, name)}
    try:
        sys.modules.update(stand_ins)
        sys.modules.pop(name, None)
        module = importlib.import_module(name)
    except Exception:  # noqa: BLE001 - a TRL whose module needs more of Triton: its CPU branch stays
        return None
    finally:
        for key, value in saved.items():
            if value is None:
                sys.modules.pop(key, None)
            else:
                sys.modules[key] = value
    return getattr(module, "selective_log_softmax_and_entropy", None)


class _AsOnCuda:
    """A tensor as a library's device check sees it on the GPU: the tensor, but on CUDA."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self._tensor = tensor

    @property
    def device(self) -> torch.device:
        return torch.device("cuda")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tensor, name)


def _on_cuda(value: Any) -> Any:
    return _AsOnCuda(value) if isinstance(value, torch.Tensor) and value.device.type == "cpu" else value


def _wherever_held(name: str, original: Any, replacement: Any) -> list[tuple[Any, str, Any]]:
    """``replacement`` for ``original`` in every TRL module that holds it as ``name`` (TRL imports its helpers by
    name: ``chunked_divergence`` holds ``chunked_logprob``'s ``_use_triton`` and ``_addmm_fp32``)."""
    return [(holder, name, replacement) for key, holder in list(sys.modules.items())
            if key.startswith("trl.") and getattr(holder, name, None) is original]


def _liger_patches() -> list[tuple[Any, str, Any]]:
    """(owner, attribute, value while emulating) for Liger's fused linear cross-entropy, where it is loaded."""
    fused = sys.modules.get("liger_kernel.ops.fused_linear_cross_entropy")
    can_use = getattr(fused, "_can_use_mm_out", None)
    if not callable(can_use):
        return []

    def can_use_as_on_cuda(_input: torch.Tensor, weight: torch.Tensor) -> bool:
        if _emulating() and _input.device.type == "cpu":
            return bool(can_use(_on_cuda(_input), weight))
        return bool(can_use(_input, weight))

    return [(fused, "_can_use_mm_out", can_use_as_on_cuda)]


def _trl_patches() -> list[tuple[Any, str, Any]]:
    """(owner, attribute, value while emulating) for the TRL modules loaded; none where TRL is not imported."""
    chunked = sys.modules.get("trl.kernels.chunked_logprob")
    utils = sys.modules.get("trl.trainer.utils")
    if chunked is None or not callable(getattr(chunked, "_use_triton", None)):
        return []
    use_triton = chunked._use_triton

    def use_triton_as_on_cuda(device: torch.device) -> bool:
        return True if _emulating() and device.type == "cpu" else use_triton(device)

    patches = _wherever_held("_use_triton", use_triton, use_triton_as_on_cuda)
    triton = sys.modules.get("triton") or standin_triton()
    for key, names in _TRL_KERNELS.items():
        kernels = sys.modules.get(key)
        if kernels is None:
            continue
        if not hasattr(kernels, "triton"):
            patches.append((kernels, "triton", triton))
        for name in names:
            kernel = getattr(kernels, name, None)
            if isinstance(kernel, types.FunctionType):  # Triton missing: TRL's `_jit` left the function itself
                patches.append((kernels, name, StandInKernel(kernel)))
    addmm = getattr(chunked, "_addmm_fp32", None)
    if callable(addmm):
        def addmm_as_on_cuda(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
            if (_emulating() and acc.device.type == "cpu" and getattr(chunked, "_MM_OUT_DTYPE", False)
                    and a.dtype in (torch.float16, torch.bfloat16)):
                torch.addmm(acc, a, b, out_dtype=torch.float32, out=acc)  # TRL's CUDA branch
            else:
                addmm(acc, a, b)

        patches += _wherever_held("_addmm_fp32", addmm, addmm_as_on_cuda)
    if utils is not None:
        patches += _utils_patches(utils)
    return patches


def _utils_patches(utils: Any) -> list[tuple[Any, str, Any]]:
    patches: list[tuple[Any, str, Any]] = []
    supports = getattr(utils, "_supports_trl_loss_kernel", None)
    available = getattr(utils, "is_triton_available", None)
    if not callable(supports) or not callable(available):
        return patches
    fused = getattr(utils, "_fused_logprob_entropy", None) or _fused_logprob_entropy()
    if fused is None:
        return patches

    def supports_as_on_cuda(logits: torch.Tensor, index: torch.Tensor | None = None,
                            row_mask: torch.Tensor | None = None) -> bool:
        if _emulating():
            return bool(supports(_on_cuda(logits), _on_cuda(index), _on_cuda(row_mask)))
        return bool(supports(logits, index, row_mask))

    def available_as_on_cuda(*args: Any, **kwargs: Any) -> bool:
        return True if _emulating() else bool(available(*args, **kwargs))

    patches += [(utils, "_supports_trl_loss_kernel", supports_as_on_cuda),
                (utils, "is_triton_available", available_as_on_cuda)]
    if not hasattr(utils, "_fused_logprob_entropy"):
        patches.append((utils, "_fused_logprob_entropy", fused))
    return patches


_lock = threading.Lock()
_entered = 0
_patches = contextlib.ExitStack()


@contextlib.contextmanager
def gpu_branches() -> Iterator[None]:
    """While entered, the libraries' device branches this module knows answer as on CUDA with Triton in this thread
    (the module's docstring says which). Nested and concurrent dry runs share one set of patches, which the last to
    leave takes away.

    Example:
        >>> with gpu_branches():
        ...     _emulating()
        True
    """
    global _entered
    with _lock:
        if _entered == 0:
            for owner, attribute, value in (*_trl_patches(), *_liger_patches()):
                _patches.enter_context(patched(owner, **{attribute: value}))
        _entered += 1
    _state.depth = getattr(_state, "depth", 0) + 1
    try:
        yield
    finally:
        _state.depth -= 1
        with _lock:
            _entered -= 1
            if _entered == 0:
                _patches.close()
