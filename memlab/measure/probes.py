"""Probes: how a trial's memory is bounded and read on one kind of device, handed to the trial runner.

The runner does the same steps everywhere; the probe says what differs by device:

- :class:`CpuProbe`: memlab's tracker is the measurement and enforces the budget; memory the process already
  holds is found by one scan of live objects; resident memory is reported as context.
- :class:`CudaProbe`: the caching allocator is the truth: the budget is a real cap on it, the peak is its
  ``max_memory_allocated``, and what it held at the start of the tracked step is memory held before. Before the
  first step it gives back the cached segments nothing holds any more (``empty_cache``): what only the plan's
  set-up held (a cast to bf16, a quantization to 4-bit) is then not in the step's reserve, as it is not in the
  reserve of a user who loaded the model that way.
- :class:`FakeProbe`: a dry run on fake tensors. It never reads or caps a real allocator, scans nothing, and
  times nothing; it builds optimizers with the defaults of the device the estimate is for. It calls no CUDA
  function at all (no cache emptied, no state read): a dry run runs under fake and emulating modes, where a real
  CUDA call can break the process's CUDA context (DESIGN.md 2.4).

:func:`probe_for` picks the probe of a model; a model on fake or meta tensors always gets a :class:`FakeProbe`, so
a dry run can never touch the real allocator even where its fake tensors say ``"cuda"``.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import is_fake

from memlab.live.device import model_device, synchronize
from memlab.measure.compiled import CpuAllocatorPeak
from memlab.measure.cuda import CudaPeak, cap_cuda_memory
from memlab.measure.held import cpu_tensors_held, unique_storage_bytes
from memlab.measure.oom import release_memory
from memlab.measure.timeline import StepRecorder
from memlab.measure.tracker import MemoryTracker

__all__ = ["CpuProbe", "CudaProbe", "FakeProbe", "HeldMemory", "Probe", "probe_for"]

# On CPU no trial runs without a bound: the tracker stops a step that would hold more tensor bytes than this share
# of the memory the machine has available when the session starts (the rest is for everything that is not a tensor).
CPU_BOUND_SHARE = 0.8
# The most allocator events a CUDA trial's tracked step keeps in its history (PyTorch's ring buffer).
_HISTORY_ENTRIES = 200_000


@dataclass
class HeldMemory:
    """Memory the process holds before any trial besides the model and the batch (the user's, not memlab's).

    ``tensors``: those that a tracker should count (CPU); ``bytes``: how much it is in all.
    """

    tensors: list[torch.Tensor] = field(default_factory=list)
    bytes: int = 0


class Probe:
    """What a trial runner asks of a device (this base is the CPU's behaviour without the scan).

    Attributes:
        device: where the trial's tensors live.
        tracker_enforces_budget: the tracker raises an out-of-memory error past the budget (no real cap here).
        times_steps: timed steps mean something (False on fake tensors).
        optimizer_device_type: whose defaults optimizers are built with (``"cuda"``: foreach updates).
        real: the trial's tensors are real, so the runner saves and puts back the process's random-number state
            (False on fake tensors: a dry run never reads or changes the device's state, DESIGN.md 2.4).
    """

    tracker_enforces_budget = True
    times_steps = True
    real = True

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.optimizer_device_type = device.type

    def held_before(self, own: Sequence[torch.Tensor], grads: Sequence[torch.Tensor | None]) -> HeldMemory:
        """What the process holds besides ``own`` (the model's and the batch's), counted under "other"; read once,
        when a session starts, so that nothing memlab's own trials leave in torch (workspaces) is blamed on it."""
        return HeldMemory()

    def bound(self, budget: int | None) -> int | None:
        """The limit a trial runs under: the budget, and where the device cannot stop a step itself, at most
        what the machine can hold (no trial runs unbounded)."""
        return budget

    def cap(self, budget: int | None) -> contextlib.AbstractContextManager[Any]:
        """A real cap on the device's memory at ``budget`` for the block (none where the tracker enforces it)."""
        return contextlib.nullcontext()

    def allocator_peak(self) -> contextlib.AbstractContextManager[CudaPeak | None]:
        """The allocator's own peak over the block, where there is an allocator to read (None elsewhere)."""
        return contextlib.nullcontext()

    def compiled_peak(self, tracker: MemoryTracker, compiles: bool) -> contextlib.AbstractContextManager[Any]:
        """Where a step ``compiles``, what reads its peak beside :meth:`allocator_peak` (entered after ``tracker``):
        None where the allocator's statistics already hold it (CUDA), the CPU allocator's profile on a CPU
        (:class:`~memlab.measure.compiled.CpuAllocatorPeak`)."""
        return contextlib.nullcontext()

    def memory_history(self) -> contextlib.AbstractContextManager[dict[str, Any]]:
        """The allocator's own history over the block, where it keeps one: a dict that holds, after the block, the
        allocator's snapshot under ``"snapshot"`` (CUDA); empty elsewhere."""
        return contextlib.nullcontext({})

    def synchronize(self) -> None:
        """Wait for queued work before a clock is read."""

    def release(self, *, collect: bool) -> None:
        """After a trial (and a session): garbage collected where ``collect``, and the cached blocks nothing holds
        given back to the device (:func:`~memlab.measure.oom.release_memory`)."""
        release_memory(collect=collect)

    def step_recorder(self, model: nn.Module | None, categories: Sequence[str]) -> StepRecorder:
        """The recorder of a tracked step's timeline.

        Example:
            >>> type(Probe(torch.device("cpu")).step_recorder(None, ("params", "other"))).__name__
            'StepRecorder'
        """
        return StepRecorder(model, categories)

    def rss_bytes(self) -> int | None:
        """The process's resident memory, as context for CPU trials (None elsewhere)."""
        return None

    def host_available(self) -> int | None:
        """The host memory a live trial may take (the default ``host_budget``): what the machine has available now
        (``psutil.virtual_memory().available``, Linux's MemAvailable); None for a dry run, which judges the host only
        against a budget it is given.

        Example:
            >>> Probe(torch.device("cpu")).host_available() > 0
            True
        """
        if not self.real:
            return None
        import psutil

        return int(psutil.virtual_memory().available)


class CpuProbe(Probe):
    """A CPU (or other non-CUDA) device: tracking enforces the budget; held memory is found by a scan.

    Example:
        >>> probe = CpuProbe(torch.device("cpu"))
        >>> probe.tracker_enforces_budget, probe.rss_bytes() > 0, probe.bound(None) == probe.machine_bound
        (True, True, True)
    """

    def __init__(self, device: torch.device) -> None:
        super().__init__(device)
        import psutil

        self.machine_bound = int(psutil.virtual_memory().available * CPU_BOUND_SHARE)

    def held_before(self, own: Sequence[torch.Tensor], grads: Sequence[torch.Tensor | None]) -> HeldMemory:
        tensors = cpu_tensors_held(own, grads)
        return HeldMemory(tensors, unique_storage_bytes(tensors, exclude=own) if tensors else 0)

    def bound(self, budget: int | None) -> int | None:
        return self.machine_bound if budget is None else min(budget, self.machine_bound)

    def rss_bytes(self) -> int | None:
        import psutil

        return int(psutil.Process().memory_info().rss)

    def compiled_peak(self, tracker: MemoryTracker, compiles: bool) -> contextlib.AbstractContextManager[Any]:
        return CpuAllocatorPeak(tracker.live_bytes) if compiles else contextlib.nullcontext()


class CudaProbe(Probe):
    """A CUDA device: the budget caps the caching allocator, whose peak is the measurement.

    Example:
        >>> CudaProbe(torch.device("cuda", 0)).tracker_enforces_budget
        False
    """

    tracker_enforces_budget = False

    def held_before(self, own: Sequence[torch.Tensor], grads: Sequence[torch.Tensor | None]) -> HeldMemory:
        # The allocator knows what the process holds; what is not the model's, the batch's or a gradient (the
        # user's, but memlab sets it aside) is someone else's: an old optimizer, other variables.
        synchronize(self.device)
        allocated = torch.cuda.memory_allocated(self.device)
        mine = [t for t in [*own, *(g for g in grads if g is not None)] if t.device == self.device]
        return HeldMemory([], max(0, allocated - unique_storage_bytes(mine)))

    def cap(self, budget: int | None) -> contextlib.AbstractContextManager[Any]:
        # Entered after the plan is put on and before its first step: what the set-up freed goes back first (a
        # cast or a quantization at load time leaves no segment in the reserve of a model loaded that way).
        torch.cuda.empty_cache()
        return cap_cuda_memory(budget, self.device)

    def allocator_peak(self) -> contextlib.AbstractContextManager[CudaPeak | None]:
        return CudaPeak(self.device)

    @contextlib.contextmanager
    def memory_history(self) -> Iterator[dict[str, Any]]:
        # Recorded only around the tracked step (its stacks cost time); a history the user recorded is left on.
        found: dict[str, Any] = {}
        memory = torch.cuda.memory
        try:  # a history never fails a trial: where CUDA cannot keep one, the timeline is memlab's tracking alone
            recording = bool(self.device.type == "cuda" and torch.cuda.is_available()
                             and memory._snapshot(self.device).get("device_traces", [[]])[0])
            usable = self.device.type == "cuda" and torch.cuda.is_available()
        except (RuntimeError, AttributeError):
            recording, usable = False, False
        if recording or not usable:
            yield found  # the user records already (theirs is not switched off), or there is no history to keep
            return
        memory._record_memory_history(max_entries=_HISTORY_ENTRIES, stacks="python", device=self.device,
                                     clear_history=True)
        try:
            yield found
        finally:
            synchronize(self.device)
            found["snapshot"] = memory._snapshot(self.device)
            memory._record_memory_history(enabled=None, device=self.device)

    def synchronize(self) -> None:
        synchronize(self.device)


class FakeProbe(Probe):
    """A dry run on fake tensors: nothing real is read, capped, scanned or timed.

    Args:
        device: the device the fake tensors say they are on.
        target: the device the estimate is for (its optimizer defaults are used); default ``device``.
        on_release: called where a :class:`CudaProbe` gives the cached segments back (after the plan is put on,
            before its first step), so that a model of the allocator does the same.

    Example:
        >>> probe = FakeProbe(torch.device("cpu"), target=torch.device("cuda"))
        >>> probe.times_steps, probe.real, probe.optimizer_device_type
        (False, False, 'cuda')
    """

    times_steps = False
    real = False

    def __init__(
        self, device: torch.device, target: torch.device | None = None, on_release: Callable[[], None] | None = None
    ) -> None:
        super().__init__(device)
        self.optimizer_device_type = (target or device).type
        self.on_release = on_release
        self.recorder: Callable[[nn.Module | None, Sequence[str]], StepRecorder] | None = None
        """Makes the tracked step's recorder where a dry run keeps its step to carry it to more layers
        (:meth:`memlab.estimation.depth.log.DepthLog.step_recorder`); None: the plain one."""

    def step_recorder(self, model: nn.Module | None, categories: Sequence[str]) -> StepRecorder:
        if self.recorder is not None:
            return self.recorder(model, categories)
        return super().step_recorder(model, categories)

    def cap(self, budget: int | None) -> contextlib.AbstractContextManager[Any]:
        if self.on_release is not None:
            self.on_release()
        return contextlib.nullcontext()

    def release(self, *, collect: bool) -> None:
        # No real allocator holds a fake trial's memory: only the garbage (a failed step's cycles) is collected.
        if collect:
            gc.collect()


def probe_for(model: nn.Module) -> Probe:
    """The probe for a model's device: fake or meta tensors get a :class:`FakeProbe`, CUDA a :class:`CudaProbe`,
    anything else a :class:`CpuProbe`.

    Example:
        >>> type(probe_for(nn.Linear(2, 2))).__name__
        'CpuProbe'
        >>> type(probe_for(nn.Linear(2, 2, device="meta"))).__name__
        'FakeProbe'
    """
    device = model_device(model)
    if device.type == "meta" or any(is_fake(p) for p in model.parameters()):
        return FakeProbe(device)
    if device.type == "cuda":
        return CudaProbe(device)
    return CpuProbe(device)
