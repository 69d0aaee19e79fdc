"""What a dry run of a few layers keeps, so that its step can be carried to the model's full depth
(:mod:`memlab.estimation.depth.extend`, :mod:`memlab.estimation.depth.carry`).

A one-GPU dry run feeds two consumers with its storages: the model of the CUDA caching allocator
(:class:`~memlab.estimation.dryrun.reserved.ReservedTrace`, ``"A"``: every storage of the trial, its placement and
warm-up included) and the tracked step's :class:`~memlab.measure.tracker.MemoryTracker` (``"L"``: its ledger's changes
by category, each check of its peak, the timeline's sections); an FSDP2 dry run feeds the allocator's model and
PyTorch's FSDP memory tracker (``"F"``, :mod:`memlab.estimation.sharded.fsdp2.depth`). :class:`DepthLog` keeps what they
were told as one list of :class:`Event`, in order, each with the module running and the layer it belongs to:

- an event made inside a layer (``model.layers.3.mlp``) belongs to that layer; one made in the module that runs the
  layers (``model``) between two of them, to the layer that ran last (a layer's hidden states are let go there),
  except from the first storage made there on, where the next layer starts right after: those belong to the next
  layer (what the runner makes for the layer it calls: transformers 5.17's checkpointing wraps a layer's
  ``__call__`` rather than its ``forward``, and torch 2.11's checkpoint makes two empty tensors before the layer's
  hooks run);
- a storage belongs to the layer it was made in; one made outside every module, to the layer of what it was made
  from (an optimizer's state from its parameter, a cast weight from its original), or of its name (a parameter or
  buffer under ``model.layers.3``);
- an event about a storage made earlier (a free, a resize, a new category) outside every layer belongs to the
  storage's layer.

Nothing here changes what the dry run does: the log only listens (a fake mode hook, an allocator that reports its
calls, a recorder that reports its step, a module watch).
"""

from __future__ import annotations

import contextlib
import functools
import weakref
from collections.abc import Hashable, Iterator, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_leaves

from memlab.estimation.cuda.allocator import CachingAllocator
from memlab.events import Event as RunnerEvent
from memlab.events import TrialStarted
from memlab.measure.timeline import ModuleWatch, Recording, StepRecorder

__all__ = ["ALLOCATOR", "FSDP", "NO_LAYER", "STEP", "DepthLog", "Event", "LayerPaths", "Storage"]

ALLOCATOR = "A"
"""The consumer that models the CUDA caching allocator (the reserved peak)."""
STEP = "L"
"""The consumer that counts the tracked step by category (the peak, the breakdown, the timeline)."""
FSDP = "F"
"""The consumer that is PyTorch's FSDP memory tracker (an FSDP2 dry run:
:mod:`memlab.estimation.sharded.fsdp2.depth`)."""


@dataclass(frozen=True)
class LayerPaths:
    """Where a model's repeated layers are, as :class:`~memlab.measure.timeline.ModuleWatch` names modules.

    Example:
        >>> paths = LayerPaths("model.layers", "model")
        >>> paths.layer_of("model.layers.12.mlp"), paths.layer_of("model.norm"), paths.rename("model.layers.2.mlp", 7)
        (12, None, 'model.layers.7.mlp')
    """

    container: str
    """The layers' ``nn.ModuleList`` (``model.layers``, ``transformer.h``)."""
    runner: str
    """The module whose forward runs the layers one after another (``model``, ``transformer``)."""

    def layer_of(self, name: str) -> int | None:
        """The layer a module (or parameter) name is in, None outside every layer."""
        prefix = self.container + "."
        if not name.startswith(prefix):
            return None
        number = name[len(prefix):].split(".", 1)[0]
        return int(number) if number.isdigit() else None

    def rename(self, name: str, layer: int) -> str:
        """``name`` with its layer number made ``layer`` (a name outside every layer unchanged)."""
        prefix = self.container + "."
        if not name.startswith(prefix):
            return name
        rest = name[len(prefix):].split(".", 1)
        return prefix + str(layer) + ("." + rest[1] if len(rest) > 1 else "")


_NEW_STORAGE = frozenset({"alloc", "start"})

NO_LAYER = -1
"""The tag of a storage known to belong to no layer (made in the embedding or the head, or from them)."""


class Storage:
    """One storage's life, as the log knows it: the layer it belongs to, :data:`NO_LAYER`, or None (not known:
    made from nothing outside every module, such as an optimizer's step counter)."""

    __slots__ = ("tag",)

    def __init__(self, tag: int | None) -> None:
        self.tag = tag


@dataclass(slots=True)
class Event:
    """One thing a consumer was told.

    ``op`` is ``"alloc"``, ``"free"``, ``"resize"`` or ``"move"`` (a storage's new category) for a storage (its
    ``key``, ``nbytes`` and ``category``); for the step also ``"start"`` (a storage alive when the step began),
    ``"check"`` (its peak checked), ``"enter"`` and ``"exit"`` (a section, named in ``label``); for the allocator also
    ``"empty_cache"``, ``"reset_peak"`` and ``"read"`` (where the trial reads its peaks); for the FSDP memory tracker
    (:mod:`memlab.estimation.sharded.fsdp2.depth`) also ``"begin"``, ``"check"`` (``label``: the peak's state,
    ``names``: the FSDP modules running), ``"reset"`` (a module's local peak started) and ``"append"`` (a module's
    snapshot stored, ``label``: its state).
    """

    consumer: str
    op: str
    key: Hashable = None
    nbytes: int = 0
    category: str = ""
    module: str = ""
    context: int | None = None
    storage: Storage | None = None
    label: str = ""
    """A section's name, or the FSDP memory tracker's state."""
    names: Any = None
    """The FSDP module (a name) or modules (a tuple of names) an FSDP tracker's event is about."""

    @property
    def layer(self) -> int | None:
        """The layer this event belongs to: its module's, else its storage's."""
        if self.context is not None:
            return self.context
        tag = self.storage.tag if self.storage is not None else None
        return tag if tag is not None and tag >= 0 else None


class DepthLog:
    """Keeps a dry run's events for :mod:`memlab.estimation.depth.extend` (see the module's notes).

    The dry run hands it to its parts: the fake mode calls :meth:`operator_ran` after each operator, before its
    consumers see the result, :class:`~memlab.estimation.dryrun.reserved.ReservedTrace` makes its allocator with
    :meth:`allocator`, the probe makes the tracked step's recorder with :meth:`step_recorder`, the runner's events
    reach :meth:`listen`, an FSDP2 run's tracker reports to :meth:`fsdp_storage` and :meth:`fsdp_marker`, and the
    trial runs inside :meth:`watching`.
    """

    def __init__(self, paths: LayerPaths, model: nn.Module) -> None:
        self.paths = paths
        self.model = model
        self.events: list[Event] = []
        self.watch = ModuleWatch(model)
        self._live: dict[str, dict[Hashable, Storage]] = {ALLOCATOR: {}, STEP: {}, FSDP: {}}
        self._sticky: dict[str, int | None] = {ALLOCATOR: None, STEP: None, FSDP: None}
        # Events in the runner after a layer, from the first storage made there on, and the storages made there:
        # they belong to the next layer if one comes next (:meth:`_context`).
        self._pending: dict[str, list[Event]] = {ALLOCATOR: [], STEP: [], FSDP: []}
        self._pending_made: list[Storage] = []
        # Every storage the log has seen made (by an operator) or named (a parameter, a buffer), while it lives.
        self._made: dict[int, Storage] = {}
        self._refs: dict[int, weakref.ref[Any]] = {}
        self._step_bytes: dict[Hashable, int] = {}
        self._backward = False

    @contextlib.contextmanager
    def watching(self) -> Iterator[DepthLog]:
        """One attempt at the trial: the log starts empty and the module watch is on."""
        self.events.clear()
        for live in self._live.values():
            live.clear()
        self._sticky = {ALLOCATOR: None, STEP: None, FSDP: None}
        for pending in self._pending.values():
            pending.clear()
        self._pending_made.clear()
        self._step_bytes.clear()
        self._made.clear()
        self._refs.clear()
        self._backward = False
        with self.watch:
            yield self

    # --- where an event belongs -------------------------------------------------------------------------------
    def _context(self, consumer: str, watch: ModuleWatch) -> int | None:
        module = _innermost_named(watch)
        layer = self.paths.layer_of(module)
        if layer is not None:
            self._sticky[consumer] = layer
            self._settle(consumer, layer)
        elif module == self.paths.runner:
            layer = self._sticky[consumer]
        else:
            self._sticky[consumer] = None
            self._settle(consumer, None)
        return layer

    def _settle(self, consumer: str, layer: int | None) -> None:
        """The runner's events after a layer that wait for what comes next (and, for the allocator, whose context
        the fake mode's operators share, the storages made there) given to ``layer``, the layer that came; with
        None (a module of no layer came), left with the layer before."""
        pending = self._pending[consumer]
        if layer is not None:
            for event in pending:
                event.context = layer
            if consumer == ALLOCATOR:
                for record in self._pending_made:
                    record.tag = layer
        pending.clear()
        if consumer == ALLOCATOR:
            self._pending_made.clear()

    def _append(self, event: Event, watch: ModuleWatch) -> None:
        """Log ``event``; one in the runner after a layer, from the first storage made there on, waits for what
        comes next (:meth:`_settle`)."""
        self.events.append(event)
        pending = self._pending[event.consumer]
        if event.context is not None and (pending or event.op in _NEW_STORAGE) and \
                _innermost_named(watch) == self.paths.runner:
            pending.append(event)

    def operator_ran(self, func: Any, args: Sequence[Any], kwargs: Any, out: Any) -> None:
        """An operator has run (the fake mode calls this before its consumers see the result): the layer of each
        storage it made, by the module running, else by what it was made from."""
        backward = _in_backward()
        if backward != self._backward:
            # Backward begins or ends: what the watch holds is stale (a module whose backward had no input with a
            # gradient is never left), as the step's recorder finds at each section.
            self.watch.reset()
            self._backward = backward
        module = _innermost_named(self.watch)
        layer = self._context(ALLOCATOR, self.watch)
        outputs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor) and not self._known(t)]
        if not outputs:
            return
        if layer is not None or module:  # made in a layer, or in a module of no layer (the norm after them)
            for tensor in outputs:
                record = self._remember(tensor, NO_LAYER if layer is None else layer)
                if layer is not None and module == self.paths.runner:  # the next layer's, if one comes next
                    self._pending_made.append(record)
            return
        kwargs = kwargs or {}
        if isinstance(out, (list, tuple)) and len(outputs) == len(out):
            # A foreach operator: its i-th result is made from the i-th element of each list it takes.
            lists = [a for a in (*args, *kwargs.values()) if isinstance(a, (list, tuple)) and len(a) == len(out)]
            if lists:
                others = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
                for index, tensor in enumerate(outputs):
                    self._remember(tensor, self._made_from([*(lst[index] for lst in lists), *others]))
                return
        tag = self._made_from(tree_leaves((args, kwargs)))
        for tensor in outputs:
            self._remember(tensor, tag)

    def _known(self, tensor: torch.Tensor) -> bool:
        storage = tensor.untyped_storage()
        ref = self._refs.get(id(storage))
        return ref is not None and ref() is storage

    def _remember(self, tensor: Any, tag: int | None) -> Storage:
        """The record of ``tensor``'s storage (or of a storage; made now with ``tag`` where the log has none), kept
        while it lives."""
        storage = tensor.untyped_storage() if isinstance(tensor, torch.Tensor) else tensor
        key = id(storage)
        ref = self._refs.get(key)
        if ref is not None and ref() is storage:
            return self._made[key]
        record = Storage(tag)
        self._made[key] = record
        self._refs[key] = weakref.ref(storage, functools.partial(self._forget, key))
        return record

    def _forget(self, key: int, ref: weakref.ref[Any]) -> None:
        if self._refs.get(key) is ref:
            del self._refs[key], self._made[key]

    def _made_from(self, inputs: Sequence[Any]) -> int | None:
        """The one layer every tensor among ``inputs`` belongs to; :data:`NO_LAYER` where one belongs to no layer
        or they belong to different layers; None where there is none, or one is not known."""
        made = self._made
        tags = set()
        for value in inputs:
            if isinstance(value, torch.Tensor):
                record = made.get(_storage_key(value)) if self._known(value) else None
                tags.add(record.tag if record is not None else None)
        if NO_LAYER in tags or len(tags - {None}) > 1:
            return NO_LAYER
        return tags.pop() if len(tags) == 1 else None

    def name_storages(self, model: nn.Module | None = None) -> None:
        """Give each parameter's and buffer's storage not yet placed in a layer the layer of its name."""
        model = self.model if model is None else model
        tensors = chain(model.named_parameters(remove_duplicate=False), model.named_buffers(remove_duplicate=False))
        for name, tensor in tensors:
            if tensor is None:
                continue
            layer = self.paths.layer_of(name)
            layer = NO_LAYER if layer is None else layer
            local = getattr(tensor, "to_local", None)  # a sharded parameter (FSDP2's DTensor): its shard
            tensor = local() if callable(local) else tensor
            key = _storage_key(tensor)
            # a parameter made outside the fake mode's operators (peft's adapters) is known by its name only
            records = [self._remember(tensor, layer), *(live.get(key) for live in self._live.values())]
            for record in records:
                if record is not None and record.tag is None:
                    record.tag = layer

    # --- what the consumers were told -------------------------------------------------------------------------
    def _storage_event(self, consumer: str, op: str, key: Hashable, nbytes: int, category: str,
                       watch: ModuleWatch) -> None:
        live = self._live[consumer]
        if op == "alloc" or op == "start":
            # One record for one storage, whoever is told of it: the one made when the operator ran, else the one
            # the other consumer has.
            storage = self._made.get(key) if isinstance(key, int) else None
            if storage is None:
                other = self._live[ALLOCATOR if consumer == STEP else STEP].get(key)
                storage = other if other is not None else Storage(None)
            live[key] = storage
        elif op == "free":
            storage = live.pop(key)
        else:
            storage = live[key]
        self._append(Event(consumer, op, key, nbytes, category, watch.current, self._context(consumer, watch),
                           storage), watch)

    def _marker(self, consumer: str, op: str, watch: ModuleWatch, label: str = "") -> None:
        self._append(Event(consumer, op, None, 0, "", watch.current, self._context(consumer, watch), label=label),
                     watch)

    def allocator(self, capacity: int | None) -> CachingAllocator:
        """The caching allocator's model for :class:`~memlab.estimation.dryrun.reserved.ReservedTrace`, reporting its
        calls here."""
        return _LoggedAllocator(capacity, self)

    def allocator_call(self, op: str, key: Hashable = None, nbytes: int = 0) -> None:
        if key is None:
            self._marker(ALLOCATOR, op, self.watch)
        else:
            self._storage_event(ALLOCATOR, op, key, nbytes, "", self.watch)

    def fsdp_storage(self, op: str, info: Any, storage: Any, nbytes: int, category: str) -> None:
        """A change to PyTorch's FSDP memory tracker's books about one storage (its record ``info``; ``storage``, the
        storage itself where it is new): :mod:`memlab.estimation.sharded.fsdp2.depth`."""
        live = self._live[FSDP]
        key = id(info)
        if op == "alloc":
            record = self._remember(storage, None) if storage is not None else Storage(None)
            live[key] = record
        else:
            record = live.pop(key) if op == "free" else live[key]
        self._append(Event(FSDP, op, key, nbytes, category, self.watch.current, self._context(FSDP, self.watch),
                           record), self.watch)

    def fsdp_marker(self, op: str, names: Any, label: str) -> None:
        """A peak check (``names``: the FSDP modules running), or where a module's hook stores a snapshot or starts
        its local peak (``names``: the module), of PyTorch's FSDP memory tracker. Names lose the root's class name,
        which the tracker puts first."""
        if isinstance(names, str):
            names = names.partition(".")[2]
        elif names is not None:
            names = tuple(name.partition(".")[2] for name in names)
        # The module running says where it belongs, not the module it names: FSDP2 starts a layer's backward while
        # the layer after it still runs its own.
        self._append(Event(FSDP, op, None, 0, "", self.watch.current, self._context(FSDP, self.watch),
                           label=label, names=names), self.watch)

    def read(self) -> None:
        """The trial reads the allocator's peaks (its tracked step has ended)."""
        self._marker(ALLOCATOR, "read", self.watch)

    def listen(self, event: RunnerEvent) -> None:
        """The runner's events: when a trial starts, its modules and parameters (adapters included) are named."""
        if isinstance(event, TrialStarted):
            self.watch.learn(self.model)
            self.name_storages()

    def step_recorder(self, model: nn.Module | None, categories: Sequence[str]) -> StepRecorder:
        """The tracked step's timeline recorder, reporting the step here as well."""
        return _LoggingRecorder(model, categories, self)

    def step_started(self, recorder: StepRecorder, entries: Sequence[tuple[int, int, str]]) -> None:
        for key, nbytes, category in entries:
            self._storage_event(STEP, "start", key, nbytes, category, recorder.watch)
            self._step_bytes[key] = nbytes
        self.name_storages()

    def step_changed(self, recorder: StepRecorder, key: int, nbytes: int, category: str,
                     tracked: bool = False) -> None:
        """The step's ledger changed a storage: told as the storage's bytes and category now (``tracked``: whether
        the ledger still holds it). A new key is an allocation, 0 bytes of one the ledger no longer holds a free,
        the same bytes a new category, other bytes a resize."""
        sizes = self._step_bytes
        if key not in self._live[STEP]:
            op = "alloc"
        elif nbytes == 0 and not tracked:
            op = "free"
        else:
            op = "move" if sizes[key] == nbytes else "resize"
        self._storage_event(STEP, op, key, nbytes, category, recorder.watch)
        if op == "free":
            del sizes[key]
        else:
            sizes[key] = nbytes

    def step_checked(self, recorder: StepRecorder) -> None:
        self._marker(STEP, "check", recorder.watch)

    def step_section(self, recorder: StepRecorder, op: str, name: str) -> None:
        self._marker(STEP, op, recorder.watch, name)


def _innermost_named(watch: ModuleWatch) -> str:
    """The innermost module running that the model names (a module it does not name, such as peft's parameter
    proxy inside an adapted layer, runs as part of the named one around it); "" outside every module."""
    named = watch.named
    for name in reversed(watch.stack):
        if name in named:
            return name
    return watch.current


def _in_backward() -> bool:
    """Whether the autograd engine is running a backward pass on this thread (PyTorch's graph task id is -1
    outside one; it has no public name)."""
    return bool(torch._C._current_graph_task_id() != -1)


def _storage_key(tensor: torch.Tensor) -> int:
    """The key a memory tracker counts ``tensor``'s storage under (the id of its storage object)."""
    return id(tensor.untyped_storage())


class _LoggedAllocator(CachingAllocator):
    """The caching allocator's model, reporting each call a trial makes to a :class:`DepthLog` (not the calls it
    makes to itself)."""

    def __init__(self, capacity: int | None, log: DepthLog) -> None:
        super().__init__(capacity)
        self._log = log
        self._inside = False

    @contextlib.contextmanager
    def _call(self, op: str | None, key: Hashable = None, nbytes: int = 0) -> Iterator[None]:
        if self._inside:
            yield
            return
        if op is not None:
            self._log.allocator_call(op, key, nbytes)
        self._inside = True
        try:
            yield
        finally:
            self._inside = False

    def malloc(self, key: Hashable, size: int) -> None:
        with self._call("alloc", key, size):
            super().malloc(key, size)

    def free(self, key: Hashable) -> None:
        with self._call("free", key):
            super().free(key)

    def record(self, key: Hashable, size: int) -> None:
        held = self.holds(key)
        op = ("free" if size <= 0 else "resize") if held else ("alloc" if size > 0 else None)
        with self._call(op, key, size):
            super().record(key, size)

    def reset_peak(self) -> None:
        with self._call("reset_peak"):
            super().reset_peak()

    def empty_cache(self) -> None:
        with self._call("empty_cache"):
            super().empty_cache()


class _LoggingRecorder(StepRecorder):
    """The tracked step's :class:`~memlab.measure.timeline.StepRecorder`, telling a :class:`DepthLog` too."""

    def __init__(self, model: nn.Module | None, categories: Sequence[str], log: DepthLog) -> None:
        super().__init__(model, categories)
        self._log = log

    def start(self, entries: Sequence[tuple[int, int, str]]) -> None:
        self._log.step_started(self, entries)
        super().start(entries)

    @contextlib.contextmanager
    def recording(self, tracker: Any) -> Iterator[Recording]:
        self._tracker = tracker
        with super().recording(tracker) as recording:
            yield recording

    def changed(self, key: int, nbytes: int, category: str) -> None:
        tracker = getattr(self, "_tracker", None)
        self._log.step_changed(self, key, nbytes, category, tracker is not None and tracker.tracks(key))
        super().changed(key, nbytes, category)

    def checked(self) -> None:
        self._log.step_checked(self)

    @contextlib.contextmanager
    def section(self, name: str) -> Iterator[None]:
        self._log.step_section(self, "enter", name)
        try:
            with super().section(name):
                yield
        finally:
            self._log.step_section(self, "exit", name)
