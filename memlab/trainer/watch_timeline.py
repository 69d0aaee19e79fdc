"""The costliest step of a watched training as a timeline (``memlab.watch(...).timeline``).

Every optimizer step is recorded while it runs, and its record is kept only when its peak is the highest so far
(the first of equals, as ``Watch.peak``): a training of any length holds one step's record. What a step's record is
depends on how the watch reads that step's memory:

- **CPU**: the watch's :class:`~memlab.measure.tracker.MemoryTracker` already sees every storage of the step; a
  :class:`~memlab.measure.timeline.StepRecorder` listens to it (one small entry per change, no tensor held) with its
  module watch on (global module hooks), as a trial's tracked step does: the categories, the phases and the module
  running at the peak are memlab's own.
- **CUDA**: the caching allocator's own history (``torch.cuda.memory._record_memory_history``) with no stack traces
  (``context=None``: the allocator appends an entry per allocation and free, no Python runs), its buffer cleared at
  each step's start. Only a step whose peak beats the costliest so far is read (``torch.cuda.memory._snapshot()``),
  so the per-step cost is a clear and the allocator's appends. The allocator does not say what a block is: blocks
  alive before the step are named by address (the parameters', the optimizer state's), gradients by the addresses
  their tensors had before the optimizer step, what the optimizer step allocates is ``"optimizer"``, the rest of the
  step's allocations ``"activations"``; the module running is not recorded. The phases are placed by the clock
  (the trace's ``time_us`` against the watch's marks). Where the user already records a history, theirs is left
  alone and the watch keeps no timeline.

On both devices the phases are each micro-batch's ``"forward"`` (the trainer's ``compute_loss``), its
``"backward"`` (the rest of ``training_step``) and the ``"optimizer"`` step: from the last backward's end (the
Trainer's gradient clipping) through the update (``on_pre_optimizer_step`` to ``on_optimizer_step``) to the step's
end (the scheduler, the gradients released), as memlab's own step's optimizer phase holds the update and the release.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from memlab.measure.timeline import BEFORE_STEP, Recording, StepRecorder
from memlab.report.timeline import Timeline

__all__ = ["CUDA_MODULE", "HISTORY_ENTRIES", "CostliestStep", "StepMarks", "recording_from_trace"]

HISTORY_ENTRIES = 500_000
"""The most allocator entries a CUDA step keeps (PyTorch's ring buffer); a longer step loses its first ones."""
CUDA_MODULE = "(module not recorded on CUDA)"
"""The module a CUDA step's allocations are made by: the allocator's history does not say."""
_BLOCK = 512  # the caching allocator's smallest block, and the unit its sizes are rounded to


def _rounded(nbytes: int) -> int:
    return max(_BLOCK, -(-nbytes // _BLOCK) * _BLOCK)


class StepMarks:
    """The phases of one step as they are marked: :meth:`mark` ends the open phase and opens the next.

    Example:
        >>> marks = StepMarks()
        >>> marks.mark("forward", 0); marks.mark("backward", 4); marks.mark(None, 9); marks.done
        [('forward', 0, 4), ('backward', 4, 9)]
    """

    def __init__(self) -> None:
        self.done: list[tuple[str, int, int]] = []
        self._open: tuple[str, int] | None = None

    def mark(self, name: str | None, at: int) -> None:
        """End the open phase at ``at``; open ``name`` there (None: none).

        ``"optimizer"`` opened where no phase is open starts where the last phase ended: what the Trainer does
        between the last backward and its optimizer step (the gradients clipped) is the optimizer step's, as the
        gradients' release after it is (the phase stays open to the step's end), so that no part of the step is left
        out of every phase, and the phase holds what memlab's own step's does (the update, the gradients released).

        Example:
            >>> marks = StepMarks()
            >>> marks.mark("backward", 0); marks.mark(None, 5); marks.mark("optimizer", 8); marks.mark(None, 9)
            >>> marks.done
            [('backward', 0, 5), ('optimizer', 5, 9)]
        """
        if self._open is not None:
            self.done.append((self._open[0], self._open[1], at))
        elif name == "optimizer" and self.done:
            at = self.done[-1][2]
        self._open = None if name is None else (name, at)


class CostliestStep:
    """Records each step of a watched training and keeps the costliest: :meth:`begin` at a step's start,
    :meth:`mark` at its phases, :meth:`end` with its peak; :attr:`timeline` is the kept step's.

    Args:
        device: the model's device (``"cuda"``: the allocator's history; else memlab's tracker).

    Example (a CPU step, its tracker as the watch runs it)::

        >>> import torch
        >>> from memlab.measure.tracker import MemoryTracker
        >>> model = torch.nn.Linear(4, 4)
        >>> costliest = CostliestStep(torch.device("cpu"))
        >>> tracker = MemoryTracker(baseline={"params": model.parameters()})
        >>> costliest.begin(model, tracker)
        >>> with tracker, tracker.phase("activations"):
        ...     costliest.mark("forward"); loss = model(torch.ones(2, 4)).sum()
        ...     costliest.mark("backward"); loss.backward()
        ...     costliest.mark(None)
        >>> costliest.end(3, tracker.peak_bytes, tracker.breakdown)
        >>> t = costliest.timeline; (t.label, t.peak.bytes == tracker.peak_bytes, [p for p, _, _ in t.phases])
        ('step 3', True, ['forward', 'backward'])
    """

    def __init__(self, device: Any) -> None:
        self.device = device
        self.step: int | None = None
        self.peak_bytes = -1
        self._recorder: StepRecorder | None = None
        self._stop: Any = None
        self._marks = StepMarks()
        self._kept: tuple[Recording, int, dict[str, int], Mapping[str, Any] | None] | None = None
        self._timeline: Timeline | None = None
        self._history = _AllocatorHistory(device) if getattr(device, "type", "") == "cuda" else None
        self._grads: dict[int, int] = {}

    # ------------------------------------------------------------------------------------------ per step
    def begin(self, model: Any, tracker: Any = None) -> None:
        """A step starts: listen to ``tracker`` (CPU), or clear the allocator's history (CUDA)."""
        self.stop()
        self._marks = StepMarks()
        self._grads = {}
        if tracker is not None:
            recorder = self._recorder = StepRecorder(model, tracker.categories)
            self._stop = tracker.listen(recorder)
            recorder.watch.__enter__()
        elif self._history is not None:
            self._history.begin()

    def mark(self, name: str | None) -> None:
        """The step enters phase ``name`` (``"forward"``, ``"backward"``, ``"optimizer"``; None: between phases)."""
        if self._recorder is not None:
            self._recorder.watch.reset()
            self._marks.mark(name, len(self._recorder.result))
        elif self._history is not None and self._history.on:
            self._marks.mark(name, time.time_ns() // 1000)

    def may_beat(self, peak_so_far: int) -> bool:
        """Whether a step whose peak is ``peak_so_far`` now could be kept (a CUDA step then notes its gradients)."""
        return peak_so_far > self.peak_bytes

    def note_gradients(self, parameters: Iterable[Any]) -> None:
        """The addresses of the gradients now (CUDA, before the optimizer step frees nothing yet): their blocks are
        drawn as ``"grads"`` if this step is kept."""
        if self._history is not None and self._history.on:
            self._grads = _addresses(p.grad for p in parameters if getattr(p, "grad", None) is not None)

    def stop(self) -> None:
        """Stop listening (a step that did not end is not kept)."""
        if self._stop is not None:
            self._stop()
            self._stop = None
        if self._recorder is not None:
            self._recorder.watch.__exit__(None, None, None)

    def end(self, step: int, peak_bytes: int, breakdown: Mapping[str, int], *, model: Any = None,
            optimizer: Any = None, allocated_before: int = 0) -> None:
        """The step ended with ``peak_bytes`` (its categories in ``breakdown`` where known): keep it if it is the
        costliest so far. On CUDA ``model`` and ``optimizer`` name the blocks alive before it, and
        ``allocated_before`` is what the allocator held at its start."""
        recorder = self._recorder
        self.stop()  # the module watch off (a caller that did not stop the step first would leave it hooked)
        self._recorder = None
        self._marks.mark(None, len(recorder.result) if recorder is not None else time.time_ns() // 1000)
        if peak_bytes <= self.peak_bytes:
            return
        if recorder is not None:
            recording = recorder.result
            recording.sections = list(self._marks.done)
            kept: tuple[Recording, int, dict[str, int], Mapping[str, Any] | None] = (
                recording, peak_bytes, dict(breakdown), None)
        elif self._history is not None and self._history.on:
            snapshot = self._history.read()
            if snapshot is None:
                return
            kinds = {**_kinds(model, optimizer), **{address: ("grads", size) for address, size in self._grads.items()}}
            recording = recording_from_trace(
                _device_trace(snapshot, self.device), allocated_before=allocated_before, kinds=kinds,
                sections=self._marks.done,
            )
            kept = (recording, peak_bytes, _breakdown_at_peak(recording), snapshot)
        else:
            return
        self.step, self.peak_bytes, self._kept, self._timeline = step, peak_bytes, kept, None

    def close(self) -> None:
        """Training ended: stop listening and give the allocator's history back as it was."""
        self.stop()
        if self._history is not None:
            self._history.close()

    @property
    def timeline(self) -> Timeline | None:
        """The costliest step's :class:`~memlab.report.timeline.Timeline` (labelled ``"step N"``), made on first
        read; None before a step was kept."""
        if self._timeline is None and self._kept is not None:
            recording, peak, breakdown, snapshot = self._kept
            timeline = Timeline.from_recording(recording, peak_bytes=peak, breakdown=breakdown,
                                               device=str(self.device), allocator_snapshot=snapshot)
            timeline.label = f"step {self.step}"
            self._timeline = timeline
        return self._timeline


class _AllocatorHistory:
    """The CUDA allocator's history around each step, without stack traces; a user's own recording left alone."""

    def __init__(self, device: Any) -> None:
        self.device = device
        self.on = False
        self._checked = False

    def begin(self) -> None:
        import torch

        memory = torch.cuda.memory
        if not self._checked:
            self._checked = True
            try:  # a history the user records already is theirs: the watch keeps no timeline then
                self.on = not memory._snapshot(self.device).get("device_traces", [[]])[0]
            except (RuntimeError, AttributeError, IndexError):
                self.on = False
        if self.on:
            try:
                memory._record_memory_history(enabled="all", context=None, stacks="python",
                                             max_entries=HISTORY_ENTRIES, device=self.device, clear_history=True)
            except (RuntimeError, AttributeError, TypeError, ValueError):  # a torch without these options: no timeline
                self.on = False

    def read(self) -> dict[str, Any] | None:
        import torch

        try:
            return dict(torch.cuda.memory._snapshot(self.device))
        except (RuntimeError, AttributeError):
            return None

    def close(self) -> None:
        if self.on:
            import torch

            try:
                torch.cuda.memory._record_memory_history(enabled=None, device=self.device)
            except (RuntimeError, AttributeError):
                pass
        self.on, self._checked = False, False


def _addresses(tensors: Iterable[Any]) -> dict[int, int]:
    """Block address -> rounded bytes of each tensor's storage."""
    found: dict[int, int] = {}
    for tensor in tensors:
        try:
            storage = tensor.untyped_storage()
            found[int(storage.data_ptr())] = _rounded(int(storage.nbytes()))
        except Exception:  # noqa: BLE001, S112 - a storage-less tensor has no block to name
            continue
    return found


def _kinds(model: Any, optimizer: Any) -> dict[int, tuple[str, int]]:
    """Address -> (category, rounded bytes) of the parameters' and the optimizer state's blocks."""
    import torch

    kinds: dict[int, tuple[str, int]] = {}
    if optimizer is not None:
        inner = getattr(optimizer, "optimizer", optimizer)  # accelerate's AcceleratedOptimizer wraps it
        state = getattr(inner, "state", {}) or {}
        tensors = [v for s in state.values() for v in s.values() if isinstance(v, torch.Tensor)]
        kinds.update({address: ("optimizer", size) for address, size in _addresses(tensors).items()})
    if model is not None:
        kinds.update({address: ("params", size) for address, size in _addresses(model.parameters()).items()})
    return kinds


def _device_trace(snapshot: Mapping[str, Any], device: Any) -> list[dict[str, Any]]:
    traces = snapshot.get("device_traces") or [[]]
    index = getattr(device, "index", None) or 0
    return list(traces[index] if index < len(traces) else traces[0])


def recording_from_trace(
    events: Sequence[Mapping[str, Any]], *, allocated_before: int, kinds: Mapping[int, tuple[str, int]],
    sections: Sequence[tuple[str, int, int]] = (), categories: tuple[str, ...] | None = None,
) -> Recording:
    """A step's :class:`~memlab.measure.timeline.Recording` from the CUDA allocator's trace of it (the
    ``device_traces`` entries of ``torch.cuda.memory._snapshot()``): each ``alloc`` and ``free_completed`` an event.

    ``allocated_before``: what the allocator held at the step's start; ``kinds``: address -> (category, bytes) of the
    blocks known (parameters, optimizer state, gradients). Blocks alive before the step are its start: those named,
    those the step frees (under ``"other"`` unless named) and one block of ``"other"`` for the rest. What the step
    allocates is ``"grads"`` at a gradient's address, ``"optimizer"`` inside the ``"optimizer"`` section, else
    ``"activations"``. ``sections``: ``(name, first, end)`` in the trace's ``time_us``, made event counts here.

    Example:
        >>> trace = [{"action": "alloc", "addr": 4096, "size": 1024, "time_us": 10},
        ...          {"action": "free_completed", "addr": 8192, "size": 512, "time_us": 11},
        ...          {"action": "alloc", "addr": 9000, "size": 512, "time_us": 21},
        ...          {"action": "free_completed", "addr": 4096, "size": 1024, "time_us": 22}]
        >>> rec = recording_from_trace(trace, allocated_before=2560, kinds={0: ("params", 1536)},
        ...                            sections=[("forward", 0, 20), ("optimizer", 20, 30)])
        >>> rec.start, list(rec.sizes), [rec.categories[c] for c in rec.cats]
        (3, [1536, 512, 512, 1024, 0, 512, 0], ['params', 'other', 'other', 'activations', 'other', 'optimizer', \
'activations'])
        >>> rec.sections, rec.peak_event
        ([('forward', 3, 5), ('optimizer', 5, 7)], 4)
    """
    from memlab.measure.tracker import CATEGORIES

    categories = tuple(categories or CATEGORIES)
    index = {name: number for number, name in enumerate(categories)}
    steps = [(str(e["action"]), int(e["addr"]), int(e["size"]), int(e.get("time_us", 0))) for e in events
             if e.get("action") in ("alloc", "free_completed")]
    made: set[int] = set()
    freed_before: dict[int, int] = {}  # blocks alive before the step that it frees: address -> bytes
    for action, address, size, _ in steps:
        if action == "alloc":
            made.add(address)
        elif address not in made and address not in freed_before:
            freed_before[address] = size
    start: list[tuple[int, int, str]] = []  # (address, bytes, category) alive before the step
    for address, (category, size) in kinds.items():
        if address not in made or address in freed_before:
            start.append((address, freed_before.get(address, size), category))
    start.extend((address, size, "other") for address, size in freed_before.items() if address not in kinds)
    rest = allocated_before - sum(size for _, size, _ in start)
    if rest > 0:
        start.append((-1, rest, "other"))  # no block has address -1: the rest, as one block
    recording = Recording(categories, module_names=[BEFORE_STEP, CUDA_MODULE])
    keys: dict[int, int] = {}  # address -> key of the block there now
    live: dict[int, tuple[int, int]] = {}  # key -> (bytes, category index)
    total = 0

    def event(key: int, size: int, category: int, module: int) -> None:
        nonlocal total
        before = live.pop(key, (0, 0))[0]
        if size:
            live[key] = (size, category)
        total += size - before
        recording.keys.append(key)
        recording.sizes.append(size)
        recording.cats.append(category)
        recording.modules.append(module)

    for address, size, category in start:
        keys[address] = len(keys)
        event(keys[address], size, index[category], 0)
    recording.start = len(recording.sizes)
    peak, peak_event, fresh = total, recording.start, len(keys)
    times: list[int] = []
    optimizer = [(first, end) for name, first, end in sections if name == "optimizer"]
    for action, address, size, at in steps:
        if action == "alloc":
            keys[address], fresh = fresh, fresh + 1  # an address freed and allocated again is another block
            if kinds.get(address, ("", 0))[0] == "grads":
                category = "grads"
            elif any(first <= at < end for first, end in optimizer):
                category = "optimizer"
            else:
                category = "activations"
            event(keys[address], size, index[category], 1)
        elif address in keys:
            key = keys.pop(address)
            event(key, 0, live[key][1] if key in live else index["other"], 1)
        else:
            continue
        times.append(at)
        if total > peak:
            peak, peak_event = total, len(recording.sizes)
    recording.peak_event = peak_event
    recording.peak_module = CUDA_MODULE if peak_event > recording.start else ""
    offset = recording.start
    recording.sections = [(name, offset + bisect.bisect_left(times, first), offset + bisect.bisect_left(times, end))
                          for name, first, end in sections]
    return recording


def _breakdown_at_peak(recording: Recording) -> dict[str, int]:
    """Bytes by category at a recording's peak (what a CUDA step's timeline names at its peak)."""
    sizes: dict[int, tuple[int, int]] = {}
    for key, size, category in zip(recording.keys[: recording.peak_event], recording.sizes[: recording.peak_event],
                                   recording.cats[: recording.peak_event], strict=True):
        if size:
            sizes[key] = (size, category)
        else:
            sizes.pop(key, None)
    totals = dict.fromkeys(recording.categories, 0)
    for size, category in sizes.values():
        totals[recording.categories[category]] += size
    return totals

