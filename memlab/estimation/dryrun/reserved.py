"""The reserved peak of a CUDA dry run: every storage the fake trial allocates and frees, in order, replayed through
the caching allocator's model (:mod:`memlab.estimation.cuda.allocator`).

What a real CUDA trial reports as ``reserved_bytes`` (:class:`~memlab.measure.cuda.CudaPeak` around the tracked
step) is ``max_memory_reserved`` after ``reset_peak_memory_stats`` at the start of the tracked step: segments the
warm-up reserved stay reserved, so it is the larger of what was reserved when the tracked step began and the peak
during it. Each trial starts from what ``empty_cache`` leaves after the trial before (``release_memory``): segments
that hold the model's weights, the batch and cuBLAS's workspaces. :class:`ReservedTrace` mirrors that:

1. the weights, then the batch, are allocated one storage at a time in the order ``model.to("cuda")`` moves them
   (each module's children first, then its parameters, then its buffers);
2. cuBLAS's workspaces, which live as long as the process, one per cuBLAS handle: the forward's (the Python
   thread) and in training the backward's (autograd's device thread has its own handle), each as PyTorch sizes it
   for the GPU kind (:func:`cublas_workspace_bytes`);
3. the trial itself, followed by a :class:`~memlab.measure.tracker.MemoryTracker` that reports every storage
   (``on_storage``); the runner's events mark where the tracked step begins (the last warm-up step finished:
   the peak is reset) and ends (the reading). Where the CUDA probe gives the cached segments back (after the
   plan is put on, before its first step: :class:`~memlab.measure.probes.CudaProbe`), the model does too
   (:meth:`ReservedTrace.release`, the :class:`~memlab.measure.probes.FakeProbe`'s ``on_release``): what a cast or
   a quantization left is not in the step's reserve.

Between :meth:`ReservedTrace.pause` (called just before ``runner.run``) and the runner's ``TrialStarted`` new
storages are not recorded: that is where the runner copies the trainable weights for its snapshot, which a CUDA run
keeps in host memory (on a dry run without CUDA they are fake tensors of the same CPU device as the model's).

Not included: memory kernels take and give back inside themselves (other than cuBLAS's workspace), and allocations
on other streams (the offload levers' copies).
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from memlab.estimation.cuda.allocator import MIB, CachingAllocator, expandable_segments_assumed
from memlab.estimation.dryrun.fake import FakeMode
from memlab.events import Event, StepFinished, TrialStarted
from memlab.live.batch import Batch, named_tensors
from memlab.live.patching import patched
from memlab.measure.tracker import MemoryTracker
from memlab.techniques.weights import modelled_release

__all__ = [
    "CUBLAS_DEFAULT_WORKSPACE_BYTES",
    "CUBLAS_WORKSPACES",
    "INFERENCE_CUBLAS_WORKSPACES",
    "CUBLAS_WORKSPACE_BYTES",
    "EXPANDABLE_NOTE",
    "RESERVED_NOTE",
    "ReservedTrace",
    "cublas_workspace_bytes",
    "placement_order",
    "reserved_notes",
]

CUBLAS_WORKSPACE_BYTES = 32 * MIB
"""cuBLAS's workspace per (handle, stream) on Hopper (compute capability 9.0): ``4096 * 8 * 1024``."""

CUBLAS_DEFAULT_WORKSPACE_BYTES = 4096 * 1024 * 2 + 16 * 1024 * 8
"""cuBLAS's workspace per (handle, stream) on every other NVIDIA GPU (Ampere, Ada, and Blackwell too):
``:4096:2:16:8``, 8 MiB and 128 KiB."""

CUBLAS_WORKSPACES = 2
"""cuBLAS handles are per thread: in training the forward's (the Python thread) and the backward's (autograd's
device thread); inference has the first only (:data:`INFERENCE_CUBLAS_WORKSPACES`)."""

INFERENCE_CUBLAS_WORKSPACES = 1
"""An inference step's cuBLAS handles: the forward's alone."""


def cublas_workspace_bytes(capability: tuple[int, int] = (9, 0), config: str | None = None) -> int:
    """The bytes PyTorch gives each cuBLAS handle as its workspace on a GPU of compute ``capability``, as
    ``parseChosenWorkspaceSize`` (``aten/src/ATen/cuda/CublasHandlePool.cpp``) sizes it: ``CUBLAS_WORKSPACE_CONFIG``
    when set (``:SIZE:COUNT`` pairs in KiB, summed: ``:4096:8`` is 32 MiB), else 32 MiB on sm90 (Hopper: H100,
    H200) and ``:4096:2:16:8`` (8 MiB + 128 KiB) on every other GPU. ``config`` default: this process's
    ``CUBLAS_WORKSPACE_CONFIG``.

    cuBLASLt's own workspace (``CUBLASLT_WORKSPACE_SIZE``, 1 MiB by default, at most cuBLAS's) is allocated only at
    cuBLASLt's first use (a matmul with a bias epilogue) and is not counted: at most one 2 MiB segment per handle.

    Example:
        >>> cublas_workspace_bytes((9, 0), "") // MIB, cublas_workspace_bytes((8, 0), "") / MIB
        (32, 8.125)
        >>> cublas_workspace_bytes((8, 0), ":4096:8") // MIB, cublas_workspace_bytes((9, 0), ":16:8") // 1024
        (32, 128)
    """
    if config is None:
        config = os.environ.get("CUBLAS_WORKSPACE_CONFIG", "")
    default = CUBLAS_WORKSPACE_BYTES if tuple(capability) == (9, 0) else CUBLAS_DEFAULT_WORKSPACE_BYTES
    if not config:
        return default
    pairs = re.findall(r":([0-9]+):([0-9]+)", config)
    return sum(int(size) * 1024 * int(count) for size, count in pairs) if pairs else default


RESERVED_NOTE = (
    "reserved_bytes: this step's allocations replayed through a model of PyTorch's CUDA caching allocator "
    "(segments, rounding, fragmentation, cuBLAS's workspaces as PyTorch sizes them for the GPU); the card figure "
    "adds the CUDA context"
)
"""The note of an estimate that carries ``reserved_bytes``."""

EXPANDABLE_NOTE = (
    "reserved_bytes assumes the allocator's expandable segments (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
    "set before CUDA starts): each pool grows in pages of 2 MiB (small) and 20 MiB (large), freed blocks merge "
    "across them"
)
"""The note of an estimate whose ``reserved_bytes`` assumes expandable segments; without it, PyTorch's default."""


def reserved_notes() -> list[str]:
    """The notes of an estimate that carries ``reserved_bytes``: :data:`RESERVED_NOTE`, and :data:`EXPANDABLE_NOTE`
    where the allocator's model assumes expandable segments
    (:func:`~memlab.estimation.cuda.allocator.assumed_allocator`).

    Example:
        >>> from memlab.estimation.cuda.allocator import assumed_allocator
        >>> reserved_notes() == [RESERVED_NOTE]
        True
        >>> with assumed_allocator(expandable_segments=True):
        ...     reserved_notes()[1] == EXPANDABLE_NOTE
        True
    """
    return [RESERVED_NOTE, *([EXPANDABLE_NOTE] if expandable_segments_assumed() else [])]


def placement_order(model: nn.Module) -> list[torch.Tensor]:
    """The model's parameters and buffers in the order ``model.to(device)`` allocates them: depth first, each
    module's children before its own parameters and then its buffers (``nn.Module._apply``).

    Example:
        >>> model = nn.Sequential(nn.Linear(2, 3), nn.BatchNorm1d(3))
        >>> [tuple(t.shape) for t in placement_order(model)][:4]
        [(3, 2), (3,), (3,), (3,)]
    """
    tensors: list[torch.Tensor] = []

    def visit(module: nn.Module) -> None:
        for child in module.children():
            visit(child)
        tensors.extend(p for p in module.parameters(recurse=False))
        tensors.extend(b for b in module.buffers(recurse=False))

    visit(model)
    return tensors


def _storage_id(tensor: torch.Tensor) -> int:
    """Which storage ``tensor`` is, for as long as it lives."""
    return int(tensor.untyped_storage()._cdata)


class ReservedTrace:
    """Records one dry-run trial's allocations on ``device`` (the fake tensors' device) into a
    :class:`~memlab.estimation.cuda.allocator.CachingAllocator` and reads its reserved peak as a CUDA trial would.

    ``capability`` is the compute capability of the GPU kind (default an H100's) and ``handles`` the cuBLAS handles
    the workload uses (two in training, one in inference): they size the cuBLAS workspaces.

    Pass :meth:`listen` as the runner's ``listener``, run each trial inside :meth:`trial` and call :meth:`pause`
    just before ``runner.run``; ``reserved_bytes`` is then the trial's reserved peak, or None when it had no tracked
    step.

    Example:
        >>> from memlab import Plan
        >>> from memlab.options import RunOptions
        >>> from memlab.runner.trial import TrialRunner
        >>> model, batch = nn.Linear(512, 512), torch.randn(8, 512)
        >>> trace = ReservedTrace(torch.device("cpu"))
        >>> runner = TrialRunner(model, batch, RunOptions(loss_fn=lambda m, b: m(b).sum(), steps=1),
        ...                      listener=trace.listen)
        >>> with runner.session(), trace.trial(model, batch):
        ...     trace.pause()
        ...     trial = runner.run(Plan())
        >>> trace.reserved_bytes // MIB  # cuBLAS's 64 MiB, and three 2 MiB segments of small blocks
        70
    """

    def __init__(self, device: torch.device, capability: tuple[int, int] = (9, 0), handles: int = CUBLAS_WORKSPACES,
                 capacity: int | None = None) -> None:
        self.device = device
        self.capacity = capacity
        """What CUDA can give the allocator on the GPU kind (its memory less the CUDA context), None: unlimited."""
        self.workspaces = [cublas_workspace_bytes(capability)] * handles
        """The cuBLAS workspaces the trial holds, one per handle (:func:`cublas_workspace_bytes`)."""
        self.reserved_bytes: int | None = None
        self.allocated_bytes: int | None = None
        self.call_reserved_bytes: int | None = None
        """The most the trial reserved at any time from its placement to its end, the plan's set-up (a cast) and
        teardown included: what ``max_memory_reserved`` reads over a whole ``measure`` call, reset after the model
        was placed (the trial's own :attr:`reserved_bytes` is its steps')."""
        self._allocator: CachingAllocator | None = None
        self._paused = False
        self._model: nn.Module | None = None
        self._placed: dict[int, int] = {}
        self._placing: list[int] | None = None
        self.log: Any = None
        """A :class:`~memlab.estimation.depth.log.DepthLog` told every call the trial makes to the allocator's model
        (a dry run of a few layers, carried to the full depth); None: no log."""

    def pause(self) -> None:
        """Record no new storage until the runner says the trial has started (its snapshot is host memory)."""
        self._paused = True

    def release(self) -> None:
        """Give back the cached segments nothing holds (``torch.cuda.empty_cache``), as the CUDA probe does before a
        plan's first step, and start the peaks from there: a measured trial reads the allocator's peaks over its
        steps only (each step's :class:`~memlab.measure.cuda.CudaPeak` resets them), so what the set-up reached
        before them (a model placed in fp32 and cast) is in neither, even without a warm-up step (inference)."""
        allocator = self._allocator
        if allocator is None:
            return
        # The weights placed that the model no longer holds (a cast's or a quantization's originals) are in host
        # memory on a CUDA run (memlab parks them there), and nowhere in the user's run, which loaded them so.
        held = {_storage_id(tensor) for tensor in placement_order(self._model)} if self._model is not None else set()
        for key, storage in self._placed.items():
            if storage not in held and allocator.holds(key):
                allocator.free(key)
        allocator.empty_cache()
        allocator.reset_peak()

    def listen(self, event: Event) -> None:
        """The runner's listener: the trial starts; the tracked step begins after the last warm-up step, and ends
        with its event."""
        allocator = self._allocator
        if allocator is None:
            return
        if isinstance(event, TrialStarted):
            self._paused = False
        if not isinstance(event, StepFinished):
            return
        if event.kind == "warmup":
            allocator.reset_peak()
        elif event.kind == "tracked":
            self.reserved_bytes = allocator.peak_reserved_bytes
            self.allocated_bytes = allocator.peak_allocated_bytes
            if self.log is not None:
                self.log.read()

    @contextlib.contextmanager
    def trial(self, model: nn.Module, batch: Batch, mode: Any = None) -> Iterator[None]:
        """Follow one trial on ``model`` and ``batch``: its placement first, then everything it allocates (through
        ``mode``'s operators when it is the dry run's :class:`~memlab.estimation.dryrun.fake.FakeMode`, else as a
        mode)."""
        allocator = CachingAllocator(self.capacity) if self.log is None else self.log.allocator(self.capacity)
        self._allocator = allocator
        self._paused = False
        self.reserved_bytes = self.allocated_bytes = self.call_reserved_bytes = None
        live = [True]

        def record(key: int, size: int) -> None:
            # Frees that come after the trial (its leftovers collected later) are not this trial's.
            if live[0] and not (self._paused and size > 0 and not allocator.holds(key)):
                allocator.record(key, size)
                if size <= 0:
                    # A freed weight's key is no longer that weight: the host may give its address (the key) to the
                    # next storage (a cast's copy), which release() must not take for the original.
                    self._placed.pop(key, None)
                if self._placing is not None and size > 0:
                    self._placing.append(key)

        tracker = MemoryTracker(device=self.device, on_storage=record)
        self._model, self._placed = model, {}
        for tensor in placement_order(model):  # one at a time, to know which storage each key is
            self._placing = []
            tracker.mark([tensor], "params")
            self._placed.update(dict.fromkeys(self._placing, _storage_id(tensor)))
        self._placing = None
        if self.log is not None:
            self.log.name_storages(model)
        tracker.mark([tensor for _, tensor in named_tensors(batch)], "other")
        for handle, size in enumerate(self.workspaces):
            allocator.malloc(("cuBLAS workspace", handle), size)
        # A fake mode that reports its operators is followed without one more mode on the stack (cheaper).
        observed = isinstance(mode, FakeMode) and mode.observer is None
        try:
            # Where the weights lever gives the cache back on CUDA (after its cast, around its undo), the model does.
            with modelled_release(allocator.empty_cache), (
                    patched(mode, observer=tracker.observe) if observed else tracker):
                yield
        finally:
            live[0] = False
            self.call_reserved_bytes = allocator.most_reserved_bytes
            self._allocator = None
            self._model, self._placed = None, {}

