"""A tracked step recorded over time: every change the memory tracker counts, the step's sections, the module running.

:class:`StepRecorder` listens to a :class:`~memlab.measure.tracker.MemoryTracker` (``tracker.listen``) for one step
and keeps, compactly, one event per change of a tracked storage (its bytes now, its category, the module running),
the step's sections (``"forward"``, ``"backward"``, ``"optimizer"``, ``"prefill"``, ``"decode"``) as event numbers,
and the event count at the tracker's peak. It holds no tensor and adds no allocation to the step: the peak and the
breakdown are the tracker's own. :class:`ModuleWatch` names the module running, as ``model.named_modules()`` names
it: forward and backward module hooks (global forward hooks; in backward, pre-hooks on the autograd nodes of a
module's outputs and inputs, which keep no gradient alive, unlike ``torch.utils.module_tracker.ModuleTracker``'s
multi-grad hooks that hold gradients until all of a module's inputs have one).

What the events become (a series by category, phases, the peak named) is :mod:`memlab.report.timeline`'s job.
"""

from __future__ import annotations

import contextlib
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_leaves

__all__ = ["ModuleWatch", "Recording", "StepRecorder"]

BEFORE_STEP = "(before the step)"
"""The module name of what was alive when the step began (parameters, optimizer state, the batch)."""

# At most this many events are kept (an event is about 14 bytes): past it the series still counts every change,
# but events are no longer kept one by one (the saved snapshot then says it is cut short).
MAX_EVENTS = 2_000_000


@dataclass
class Recording:
    """What a :class:`StepRecorder` kept of one step.

    Attributes:
        categories: the tracker's categories; ``cats`` holds indexes into them.
        keys, sizes, cats, modules: one entry per event: the storage's number (0, 1, ... in order of first sight),
            its bytes after the event (0: freed), its category, the module running (index into ``module_names``).
        start: how many of the events are the storages alive when the step began (before its first operator).
        sections: ``(name, first event, end event)`` of each section, in order.
        peak_event: the number of events applied at the tracker's peak.
        peak_module: the module running at the peak ("" outside every module).
        module_names: module names, index 0 being :data:`BEFORE_STEP`.
        dropped: events not kept past :data:`MAX_EVENTS`.
    """

    categories: tuple[str, ...]
    keys: array[int] = field(default_factory=lambda: array("q"))
    sizes: array[int] = field(default_factory=lambda: array("q"))
    cats: array[int] = field(default_factory=lambda: array("b"))
    modules: array[int] = field(default_factory=lambda: array("i"))
    start: int = 0
    sections: list[tuple[str, int, int]] = field(default_factory=list)
    peak_event: int = 0
    peak_module: str = ""
    module_names: list[str] = field(default_factory=lambda: [BEFORE_STEP])
    dropped: int = 0
    root: str = ""
    """The name the model itself runs under in ``module_names`` (its class's: ``named_modules()`` names it "")."""

    def __len__(self) -> int:
        return len(self.sizes)


class ModuleWatch:
    """The module running now, forward or backward, named as ``model.named_modules()`` names it.

    Example:
        >>> model = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
        >>> seen = []
        >>> with ModuleWatch(model) as watch:
        ...     _ = model[0](torch.ones(1, 2)) if not seen.append(watch.current) else None
        >>> seen
        ['']
    """

    def __init__(self, model: nn.Module | None) -> None:
        self.names: dict[int, str] = {}
        self.named: set[str] = set()
        self.root = ""
        """The name the model itself runs under: its class's (``named_modules()`` gives it "", as outside)."""
        if model is not None:
            self.learn(model)
        self.stack: list[str] = []
        self._handles: list[Any] = []

    def learn(self, model: nn.Module) -> None:
        """Name ``model``'s modules as it has them now (modules put on it since, such as adapters, included)."""
        self.names = {}
        self.root = type(model).__name__
        for name, module in model.named_modules():
            self.names.setdefault(id(module), name or type(module).__name__)
        self.named = set(self.names.values())
        """The names the model gives (a module it does not name runs under its class's name)."""

    @property
    def current(self) -> str:
        """The innermost module running ("" outside every module)."""
        return self.stack[-1] if self.stack else ""

    def reset(self) -> None:
        """Forget what runs (between sections: a backward whose last module had no input with a gradient)."""
        self.stack.clear()

    def __enter__(self) -> ModuleWatch:
        from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

        if not self._handles:  # entered again while on: its hooks are already there (and must not be lost)
            self._handles = [register_module_forward_pre_hook(self._pre), register_module_forward_hook(self._post)]
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self.stack.clear()

    def _name(self, module: nn.Module) -> str:
        name = self.names.get(id(module))
        return name if name is not None else type(module).__name__

    def _pre(self, module: nn.Module, args: Any) -> None:
        self.stack.append(self._name(module))

    def _post(self, module: nn.Module, args: Any, output: Any) -> None:
        name = self._name(module)
        self._pop(name)
        if not torch.is_grad_enabled():
            return
        # Backward of the module begins when the gradient reaches the node that made its output, and ends when it
        # reaches the nodes that made its inputs.
        for node in _nodes(output):
            node.register_prehook(self._entering(name))
        for node in _nodes(args):
            node.register_prehook(self._leaving(name))

    def _pop(self, name: str) -> None:
        stack = self.stack
        if stack and stack[-1] == name:
            stack.pop()
            return
        for index in range(len(stack) - 1, -1, -1):
            if stack[index] == name:
                del stack[index]
                return

    def _entering(self, name: str) -> Any:
        def hook(grad_outputs: Any) -> None:
            if not self.stack or self.stack[-1] != name:
                self.stack.append(name)

        return hook

    def _leaving(self, name: str) -> Any:
        def hook(grad_outputs: Any) -> None:
            self._pop(name)

        return hook


def _nodes(value: Any) -> list[Any]:
    seen: dict[int, Any] = {}
    try:
        leaves = tree_leaves(value)
    except Exception:  # an output pytree cannot flatten: no backward marks for it
        return []
    for leaf in leaves:
        # Each node read once and kept while deduplicating: ``leaf.grad_fn`` may make a new Python object, and the
        # id of one dropped at once can be the next one's, so that another output's node (a model's logits, after
        # its loss) was taken for one already seen and left unmarked, as the memory addresses fell.
        node = leaf.grad_fn if isinstance(leaf, torch.Tensor) else None
        if node is not None:
            seen.setdefault(id(node), node)
    return list(seen.values())


class StepRecorder:
    """Records one tracked step: give it to ``tracker.listen`` (or use :meth:`recording` around the step).

    Example:
        >>> from memlab.measure.tracker import MemoryTracker
        >>> model = nn.Linear(4, 4)
        >>> tracker = MemoryTracker(baseline={"params": model.parameters()})
        >>> recorder = StepRecorder(model, tracker.categories)
        >>> with tracker, recorder.recording(tracker), tracker.phase("activations"):
        ...     with tracker.section("forward"):
        ...         loss = model(torch.ones(2, 4)).sum()
        ...     with tracker.section("backward"):
        ...         loss.backward()
        >>> [name for name, _, _ in recorder.result.sections], recorder.result.start
        (['forward', 'backward'], 2)
    """

    def __init__(self, model: nn.Module | None, categories: Sequence[str]) -> None:
        self.watch = ModuleWatch(model)
        self.result = Recording(tuple(categories), root=self.watch.root)
        self._category_index = {name: index for index, name in enumerate(categories)}
        self._module_index: dict[str, int] = {}
        self._key_index: dict[int, int] = {}
        self._next_key = 0

    @contextlib.contextmanager
    def recording(self, tracker: Any) -> Iterator[Recording]:
        """Record the tracker's changes inside the block (the module watch on too); the result stays afterwards."""
        stop = tracker.listen(self)
        try:
            with self.watch:
                yield self.result
        finally:
            stop()

    # What the tracker calls --------------------------------------------------------------------------------------
    def start(self, entries: Sequence[tuple[int, int, str]]) -> None:
        """The storages alive when recording starts: ``(key, bytes, category)`` each."""
        for key, nbytes, category in entries:
            self._event(key, nbytes, category, 0)
        self.result.start = len(self.result)
        self.result.peak_event = self.result.start

    def changed(self, key: int, nbytes: int, category: str) -> None:
        """A tracked storage now holds ``nbytes`` (0: freed) under ``category``."""
        name = self.watch.current
        module = self._module_index.get(name)
        if module is None:
            module = self._module_index[name] = len(self.result.module_names)
            self.result.module_names.append(name)
        self._event(key, nbytes, category, module)

    def peaked(self) -> None:
        """The tracker has just reached a new peak."""
        self.result.peak_event = len(self.result)
        self.result.peak_module = self.watch.current

    @contextlib.contextmanager
    def section(self, name: str) -> Iterator[None]:
        """A named part of the step, from the event count at entry to the one at exit."""
        first = len(self.result)
        self.watch.reset()
        try:
            yield
        finally:
            self.result.sections.append((name, first, len(self.result)))
            self.watch.reset()

    def _event(self, key: int, nbytes: int, category: str, module: int) -> None:
        result = self.result
        if len(result.sizes) >= MAX_EVENTS:
            result.dropped += 1
            return
        number = self._key_index.get(key)
        if number is None:
            number = self._key_index[key] = self._next_key
            self._next_key += 1
        if nbytes == 0:
            # A storage id can come back after its free: the next storage with it is another allocation.
            del self._key_index[key]
        result.keys.append(number)
        result.sizes.append(nbytes)
        result.cats.append(self._category_index[category])
        result.modules.append(module)
