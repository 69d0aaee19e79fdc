"""What a Triton launch that a dry run skipped would have taken beyond its arguments, counted where memlab knows it.

A Triton kernel allocates nothing through PyTorch but one buffer: its *global scratch*. Triton's launcher
(``CudaLauncher.__call__`` in ``triton/backends/nvidia/driver.py``) asks the allocator set by ``triton.set_allocator``
for ``programs x num_ctas x global_scratch_size`` bytes (the compiled kernel's metadata) and lets it go after the
launch; the compiler sizes it from the tensor descriptors the kernel makes on the device (``make_tensor_descriptor``:
128 bytes each, times the pipeline's stages inside a pipelined loop), and a kernel that makes none asks for none.
Everything else a kernel's call needs (its outputs, a workspace, the autograd function's saved tensors) its host
code makes with torch before the launch, and a dry run runs that code on fake tensors and counts it. TRL 1.16's
fused LM head (``trl/kernels/chunked_logprob.py``: ``mm_buf``, the running statistics, ``grad_hidden``), its
entropy (``logprob_entropy.py``: ``logprobs``, ``entropy``, ``grad_logits``) and its distillation loss
(``chunked_divergence.py``), Liger's fused linear cross-entropy (``logits_storage``, ``grad_input``, ``loss_1d``)
and RMSNorm (``Y``, ``RSTD`` and the ``(SMs, hidden)`` float32 ``_dW``) all do so. bitsandbytes' Triton kernels
(its XPU backend; on CUDA it runs its own library) and most of torchao's sit behind ``torch.library`` operators
whose fake rules a dry run runs instead, so their launches never reach Triton; torchao's few others (prototype
float8nocompile, hqq, int8_mm) write into tensors their host code makes and make no tensor descriptor.

For each skipped launch (:class:`Launch`), :func:`launch_cost` answers, in this order:

1. a kernel of :data:`KNOWN_KERNELS` (its module and name): its declared rule, bytes from the launch's grid and
   arguments (0 for every kernel above: read from their sources, none makes a tensor descriptor);
2. a kernel this process compiled (a real launch came first): ``programs x`` the largest ``global_scratch_size x
   num_ctas`` among its compiled variants;
3. a kernel whose source memlab can read: Triton's rule, counted at its bound: no tensor descriptor made on the
   device, 0 bytes; else ``programs x 128 x descriptors x stages`` (``num_stages`` as launched, else Triton's 3);
4. otherwise not counted, and named in the estimate's note with that bound in words.

The bytes counted are taken as one fake buffer at the launch and given back after it, as Triton's launcher does
(:func:`take_around_launch`). An autotuned kernel's first launch at each new key also benchmarks its configs, with
Triton's 256 MiB L2-flushing buffer (``get_empty_cache_for_benchmark``) and copies of its ``restore_value``
arguments: the step that tunes takes that (a trainer's first), the step estimated after warm-up does not; the note
names such kernels.

Example:
    >>> def fold(x_ptr, n, BLOCK: int = 4):
    ...     pass
    >>> cost = launch_cost(Launch(fold, (8,), (torch.empty(8), 8), {}))
    >>> cost.counted, cost.how
    (0, 'source')
"""

from __future__ import annotations

import functools
import inspect
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor

__all__ = [
    "DESCRIPTOR_BYTES",
    "KNOWN_KERNELS",
    "KnownKernel",
    "Launch",
    "LaunchCost",
    "SkippedKernels",
    "launch_cost",
    "launches_note",
    "take_around_launch",
]

DESCRIPTOR_BYTES = 128
"""Global scratch per tensor descriptor a kernel makes on the device, per program and pipeline stage (Triton's
``TMA_SIZE_BYTES``)."""

_DEFAULT_STAGES = 3
"""Triton's ``num_stages`` on NVIDIA GPUs where a launch names none."""

_DESCRIPTOR_CALL = re.compile(r"make_tensor_descriptor\s*\(")
"""A tensor descriptor made on the device, in a kernel's source (``tl.make_tensor_descriptor(...)`` and Triton's
earlier ``tl._experimental_make_tensor_descriptor(...)``)."""


@dataclass(frozen=True)
class Launch:
    """One skipped launch: the kernel object launched (a ``JITFunction``, or an autotuner or heuristics around one),
    its grid (a tuple, or a function of the launch's arguments) and its arguments."""

    kernel: Any
    grid: Any
    args: tuple[Any, ...]
    kwargs: Mapping[str, Any] = field(default_factory=dict)

    @property
    def function(self) -> Any:
        """The Python function the kernel was written as (innermost ``fn``), or the kernel where there is none."""
        kernel = self.kernel
        for _ in range(4):
            if inspect.isfunction(kernel):
                return kernel
            inner = getattr(kernel, "fn", None)
            if inner is None:
                break
            kernel = inner
        return kernel

    @property
    def name(self) -> str:
        return str(getattr(self.function, "__name__", None) or "a Triton kernel")

    @property
    def module(self) -> str:
        return str(getattr(self.function, "__module__", None) or "")

    def _layers(self) -> list[Any]:
        layers, kernel = [], self.kernel
        for _ in range(4):
            layers.append(kernel)
            if inspect.isfunction(kernel) or getattr(kernel, "fn", None) is None:
                break
            kernel = kernel.fn
        return layers

    @property
    def autotuned(self) -> bool:
        return any(isinstance(getattr(layer, "configs", None), list) for layer in self._layers())

    def programs(self) -> int | None:
        """The programs the grid launches (the largest over an autotuner's configs), None where it cannot be told."""
        grid = self.grid
        if not callable(grid):
            return _grid_size(grid)
        try:  # Triton calls a grid function with the kernel's arguments by name, defaults included
            parameters = inspect.signature(self.function).parameters
            named = {key: value for key, value in self.kwargs.items() if key in parameters}
            bound = inspect.signature(self.function).bind_partial(*self.args, **named)
            bound.apply_defaults()
            metas = [{**self.kwargs, **bound.arguments}]
        except (TypeError, ValueError):
            metas = [dict(self.kwargs)]
        for layer in self._layers():
            configs = getattr(layer, "configs", None)
            if isinstance(configs, list) and configs:
                metas = [{**meta, **dict(getattr(config, "kwargs", {}) or {})} for meta in metas for config in configs]
            values = getattr(layer, "values", None)
            if isinstance(values, Mapping):
                for meta in metas:
                    for key, heuristic in values.items():
                        try:
                            meta.setdefault(key, heuristic(meta))
                        except Exception:  # noqa: BLE001 - a heuristic that needs what a fake launch lacks
                            pass
        sizes = []
        for meta in metas:
            try:
                size = _grid_size(grid(meta))
            except Exception:  # noqa: BLE001 - a grid that needs a value the launch does not give
                size = None
            if size is not None:
                sizes.append(size)
        return max(sizes) if sizes else None

    def stages(self) -> int:
        """The pipeline's stages: as launched, else the largest of an autotuner's configs, else Triton's default."""
        stages = self.kwargs.get("num_stages")
        if isinstance(stages, int):
            return stages
        configured = [getattr(config, "num_stages", None) for layer in self._layers()
                      for config in (getattr(layer, "configs", None) or [])]
        known = [value for value in configured if isinstance(value, int)]
        return max(known) if known else _DEFAULT_STAGES

    def ctas(self) -> int:
        ctas = self.kwargs.get("num_ctas", 1)
        return ctas if isinstance(ctas, int) and ctas > 0 else 1


def _grid_size(grid: Any) -> int | None:
    if isinstance(grid, int):
        return grid
    if isinstance(grid, (tuple, list)) and grid and all(isinstance(size, int) for size in grid[:3]):
        return math.prod(grid[:3])
    return None


@dataclass(frozen=True)
class KnownKernel:
    """A kernel memlab read: the bytes a launch takes beyond its arguments (from the launch), and why."""

    bytes: Callable[[Launch], int]
    why: str


def _nothing(_launch: Launch) -> int:
    return 0


_TRL = "writes only into the tensors TRL's autograd function makes around it"
_LIGER = "writes only into the tensors Liger's host code makes around it"
_BNB = "writes only into the tensors bitsandbytes' host code makes around it"

KNOWN_KERNELS: dict[tuple[str, str], KnownKernel] = {
    **{("trl.kernels.chunked_logprob", name): KnownKernel(_nothing, _TRL)
       for name in ("_forward_kernel", "_backward_kernel")},
    **{("trl.kernels.logprob_entropy", name): KnownKernel(_nothing, _TRL)
       for name in ("_forward_kernel", "_backward_kernel")},
    **{("trl.kernels.chunked_divergence", name): KnownKernel(_nothing, _TRL)
       for name in ("_stats_kernel", "_jsd_kernel", "_backward_kernel")},
    ("liger_kernel.ops.cross_entropy", "liger_cross_entropy_kernel"): KnownKernel(_nothing, _LIGER),
    ("liger_kernel.ops.utils", "element_mul_kernel"): KnownKernel(_nothing, _LIGER),
    **{("liger_kernel.ops.rms_norm", name): KnownKernel(_nothing, _LIGER)
       for name in ("_rms_norm_forward_kernel", "_rms_norm_backward_kernel", "_block_rms_norm_forward_kernel",
                    "_block_rms_norm_backward_kernel")},
    **{("liger_kernel.ops.swiglu", name): KnownKernel(_nothing, _LIGER)
       for name in ("_swiglu_forward_kernel", "_swiglu_backward_kernel", "_swiglu_forward_kernel_tiled",
                    "_swiglu_backward_kernel_tiled")},
    ("liger_kernel.ops.rope", "_triton_rope"): KnownKernel(_nothing, _LIGER),
    **{("bitsandbytes.backends.triton.kernels_4bit", name): KnownKernel(_nothing, _BNB)
       for name in ("quantize_fp4_blockwise_kernel", "quantize_nf4_blockwise_kernel", "quantize_4bit_blockwise_kernel",
                    "dequant_4bit_kernel", "dequant_fp4_kernel", "dequant_nf4_kernel")},
    **{("bitsandbytes.backends.triton.kernels_8bit_quant", name): KnownKernel(_nothing, _BNB)
       for name in ("dequant_8bit_kernel", "quantize_8bit_blockwise_kernel")},
    **{("bitsandbytes.backends.triton.kernels_optim", name): KnownKernel(_nothing, _BNB)
       for name in ("_optimizer_precondition_2state_32bit", "_optimizer_precondition_1state_32bit",
                    "_optimizer_update_2state_32bit_triton_kernel", "_optimizer_update_1state_32bit_triton_kernel",
                    "_optimizer_update_1state_8bit_blockwise_triton_kernel",
                    "_optimizer_update_2state_8bit_blockwise_triton_kernel")},
}
"""Kernels read from their sources (TRL 1.16's ``trl/kernels``, Liger's ``ops`` modules in 0.6.4 and 0.8.5: the
layer kernels its patches launch (RMSNorm, SwiGLU, RoPE) and its cross-entropy's, bitsandbytes 0.50's Triton
backend), by (module, name), with the bytes a launch takes beyond its arguments: none makes a tensor descriptor on
the device, so none asks Triton for scratch. A kernel not here is counted by the rules after the table."""


@dataclass(frozen=True)
class LaunchCost:
    """What memlab made of one skipped launch: the bytes counted for it (None: not counted), how it knows them
    (``known``, ``compiled``, ``source`` or ``unknown``) and, where not counted, the bound in words."""

    counted: int | None
    how: str
    bound: str = ""
    autotuned: bool = False


def _compiled_scratch(launch: Launch) -> int | None:
    """The largest ``global_scratch_size x num_ctas`` among the kernel's compiled variants, None where none was
    compiled in this process (Triton keeps them in ``JITFunction.device_caches``: per device, a dict of kernels)."""
    sizes = []
    for layer in launch._layers():
        caches = getattr(layer, "device_caches", None)
        if not isinstance(caches, Mapping):
            continue
        for entry in list(caches.values()):
            kernels = entry[0] if isinstance(entry, tuple) and entry else None
            for compiled in list(kernels.values()) if isinstance(kernels, Mapping) else []:
                metadata = getattr(compiled, "metadata", None)
                size = getattr(metadata, "global_scratch_size", None)
                ctas = getattr(metadata, "num_ctas", 1)
                if isinstance(size, int):
                    sizes.append(size * (ctas if isinstance(ctas, int) and ctas > 0 else 1))
    return max(sizes) if sizes else None


def _descriptors(launch: Launch) -> int | None:
    """How many tensor descriptors the kernel's source makes on the device, None where its source cannot be read
    (Triton's ``JITFunction.src``, else the Python function's file)."""
    for layer in launch._layers():
        text = getattr(layer, "src", None)
        if isinstance(text, str):
            return len(_DESCRIPTOR_CALL.findall(text))
    function = launch.function
    return _source_descriptors(function) if inspect.isfunction(function) else None


@functools.lru_cache(maxsize=256)
def _source_descriptors(function: Callable[..., Any]) -> int | None:
    try:
        return len(_DESCRIPTOR_CALL.findall(inspect.getsource(function)))
    except (OSError, TypeError):
        return None


def launch_cost(launch: Launch) -> LaunchCost:
    """What ``launch`` takes beyond its arguments, by the first rule that knows it (see the module's docstring).

    Example:
        >>> import types
        >>> kernel = types.SimpleNamespace(fn=None, __name__="opaque")
        >>> launch_cost(Launch(kernel, (4,), ())).how
        'unknown'
    """
    autotuned = launch.autotuned
    known = KNOWN_KERNELS.get((launch.module, launch.name))
    if known is not None:
        return LaunchCost(known.bytes(launch), "known", autotuned=autotuned)
    programs = launch.programs()
    scratch = _compiled_scratch(launch)
    if scratch is not None:
        if programs is not None:
            return LaunchCost(programs * scratch, "compiled", autotuned=autotuned)
        return LaunchCost(None, "unknown", f"{scratch:,} B of global scratch per program, its grid not told",
                          autotuned)
    descriptors = _descriptors(launch)
    if descriptors == 0:
        return LaunchCost(0, "source", autotuned=autotuned)
    if descriptors is not None:
        per_program = DESCRIPTOR_BYTES * descriptors * launch.stages() * launch.ctas()
        if programs is not None:
            return LaunchCost(programs * per_program, "source", autotuned=autotuned)
        return LaunchCost(None, "unknown", f"{per_program:,} B of global scratch per program, its grid not told",
                          autotuned)
    return LaunchCost(None, "unknown", "its global scratch, programs x its compiled global_scratch_size",
                      autotuned)


def take_around_launch(nbytes: int, args: Iterable[Any]) -> None:
    """Take ``nbytes`` as one fake buffer on the device of the launch's first fake tensor and give it back, as
    Triton's launcher takes and gives back its scratch: the dry run's tracker sees both. Nothing is taken where the
    launch has only meta tensors (nothing of theirs is counted either).

    Example:
        >>> from memlab.estimation.dryrun.fake import FakeMode
        >>> with FakeMode() as mode:
        ...     take_around_launch(1024, [torch.empty(4)])
    """
    if nbytes <= 0:
        return
    fake = next((value for value in _tensors(args) if isinstance(value, FakeTensor)), None)
    if fake is None:
        return
    with fake.fake_mode:
        scratch = torch.empty(nbytes, dtype=torch.uint8, device=fake.device)
    del scratch


def _tensors(values: Iterable[Any]) -> Iterable[torch.Tensor]:
    for value in values:
        if isinstance(value, torch.Tensor):
            yield value
        elif isinstance(value, (list, tuple)):
            yield from _tensors(value)


class SkippedKernels(set[str]):
    """The Triton kernels a dry run did not launch, by name, and for each what memlab made of its launches
    (:attr:`costs`: the largest bytes counted, or the bound of one not counted).

    Example:
        >>> skipped = SkippedKernels()
        >>> skipped.record("fold", LaunchCost(4096, "compiled"))
        >>> skipped == {"fold"}, skipped.costs["fold"].counted
        (True, 4096)
    """

    def __init__(self, names: Iterable[str] = ()) -> None:
        super().__init__(names)
        self.costs: dict[str, LaunchCost] = {}

    def record(self, name: str, cost: LaunchCost) -> None:
        self.add(name)
        before = self.costs.get(name)
        if before is None or before.counted is not None and (cost.counted is None or cost.counted > before.counted):
            self.costs[name] = cost

    def clear(self) -> None:
        super().clear()
        self.costs.clear()


def launches_note(names: Iterable[str], costs: Mapping[str, LaunchCost]) -> str:
    """What the note on skipped kernels says of their launches, after their names.

    Example:
        >>> launches_note(["a"], {"a": LaunchCost(0, "known")})
        "what a launch takes itself (Triton's global scratch) is counted for a (memlab's table: 0 B)"
        >>> launches_note(["b"], {"b": LaunchCost(None, "unknown", "its scratch")})
        'not counted: b (at most its scratch)'
    """
    counted: list[str] = []
    uncounted: list[str] = []
    tuned: list[str] = []
    for name in sorted(set(names)):
        cost = costs.get(name)
        if cost is None:
            uncounted.append(f"{name} (at most its global scratch)")
            continue
        if cost.autotuned:
            tuned.append(name)
        if cost.counted is None:
            uncounted.append(f"{name} (at most {cost.bound})")
        else:
            how = {"known": "memlab's table", "compiled": "its compiled scratch",
                   "source": "no tensor descriptor in its source" if cost.counted == 0 else "its source's bound"}
            counted.append(f"{name} ({how.get(cost.how, cost.how)}: {cost.counted:,} B)")
    parts = []
    if counted:
        parts.append("what a launch takes itself (Triton's global scratch) is counted for " + ", ".join(counted))
    if uncounted:
        parts.append("not counted: " + ", ".join(uncounted))
    if tuned:
        parts.append(f"autotuned ({', '.join(tuned)}): a launch at a new key first benchmarks its configs with "
                     "Triton's 256 MiB L2-flushing buffer, which the step that tunes takes (a trainer's first) and "
                     "the step estimated does not")
    return "; ".join(parts)
