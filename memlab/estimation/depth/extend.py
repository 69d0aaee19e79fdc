"""A three-layer dry run's events carried to any depth: what a dry run of every layer would have told the allocator's
model and the tracked step's ledger, without running them (:mod:`memlab.estimation.depth.carry`).

The log of a dry run of three identical layers (:class:`~memlab.estimation.depth.log.DepthLog`) is a sequence of
events, most of them belonging to one layer. Where events of several layers follow each other, layer after layer
(the forward pass 0, 1, 2; backward 2, 1, 0; the optimizer's state made parameter by parameter), they form a
*sweep*; everything else belongs to no layer (the embedding, the head, the loss). The model's layers are played by
three templates: layer 0 is the first layer, layer 2 the last one, and layer 1 every layer between them. So a log
of depth 3 becomes depth ``D`` by playing, in each sweep, layer 1's run of events once for each of the layers 1 to
``D - 2`` (the last layer's run as layer ``D - 1``, the first's as layer 0), in the sweep's direction.

Each played event gets a storage of its own layer: an event of layer ``j`` about a storage of the layer before it
(its input) is about layer ``j - 1``'s storage in the same place. Which storage of one template plays which of
another comes from the log itself: layers 1 and 2 run the same events in each sweep (the log is refused where they
do not), so their storages pair up by position, and layer 1's storages that layer 2's events use pair with the
layer 0 storages that layer 1's events use in the same place.

Anything that does not fit this pattern raises :class:`NotRepeating`, and the dry run runs every layer instead.
:func:`canonical` writes events so that two logs compare equal when they tell their consumers the same, which is
how a log carried to depth 2 is checked against a real dry run of two layers.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from memlab.estimation.depth.log import Event, LayerPaths, Storage

__all__ = ["NotRepeating", "canonical", "check_layers", "extend", "source_layers"]


def source_layers(edge: int = 1) -> int:
    """The layers of the dry run that is carried to another depth: ``edge`` first ones, one between, ``edge`` last
    ones (three for one GPU; five for FSDP2, whose backward reaches two layers ahead).

    Example:
        >>> source_layers(), source_layers(2)
        (3, 5)
    """
    return 2 * edge + 1


def check_layers(edge: int = 1) -> int:
    """The layers of the dry run a carried log is checked against: the source's, less the one between.

    Example:
        >>> check_layers(), check_layers(2)
        (2, 4)
    """
    return 2 * edge

_STORAGE_OPS = frozenset({"alloc", "start", "free", "resize", "move"})
_NEW = frozenset({"alloc", "start"})


class NotRepeating(Exception):
    """The log does not repeat layer by layer in the way :func:`extend` assumes (said in the message)."""


@dataclass(frozen=True)
class _Run:
    layer: int | None
    start: int
    end: int


def extend(events: Sequence[Event], depth: int, paths: LayerPaths, edge: int = 1) -> list[Event]:
    """The events a dry run of ``depth`` layers would have, from ``events`` of a dry run of
    :func:`source_layers` (``edge`` first and last layers played as themselves, the one between them as every other
    layer).

    The played events carry a new key (one per storage and layer), the module renamed to their layer, and no
    storage record; events of no layer keep their key.

    Example:
        >>> paths = LayerPaths("layers", "Net")
        >>> log = [Event("A", "alloc", i, 8, module=f"layers.{i}", storage=Storage(i)) for i in range(3)]
        >>> [event.module for event in extend(log, 5, paths)]
        ['layers.0', 'layers.1', 'layers.2', 'layers.3', 'layers.4']
    """
    shape = _Shape(edge, depth)
    if depth < check_layers(edge):
        raise NotRepeating(f"a depth of {depth} has not {edge} first and {edge} last layers")
    layers = _between(events, [event.layer for event in events])
    if any(layer is not None and not 0 <= layer < shape.source for layer in layers):
        raise NotRepeating("an event belongs to a layer the log does not have")
    owner = _owners(events, layers)
    # an event about a storage, made outside every layer, belongs to the layer the storage was made in
    layers = [owner[event.storage] if event.context is None and event.storage is not None else layer
              for event, layer in zip(events, layers, strict=True)]
    try:
        sweeps, versions = _paired(events, layers, owner, paths, shape)
    except NotRepeating:
        gathered, layers = _frees_by_layer(events, layers)
        if gathered == list(events):
            raise
        events = gathered
        sweeps, versions = _paired(events, layers, owner, paths, shape)
    out: list[Event] = []
    play = _Player(shape, owner, versions, paths).play
    for sweep in sweeps:
        for run, layer in _played(sweep, shape):
            out.extend(play(events[index], run.layer, layer) for index in range(run.start, run.end))
    return out


def _paired(events: Sequence[Event], layers: Sequence[int | None], owner: dict[Storage, int | None],
            paths: LayerPaths, shape: _Shape) -> tuple[list[list[_Run]], _Versions]:
    """The sweeps of ``events`` (each event of the layer in ``layers``), their middle layer's storages paired with
    the next layer's."""
    sweeps = _sweeps(_runs(layers))
    versions = _Versions(shape.middle)
    for sweep in sweeps:
        _pair(events, sweep, owner, versions, paths, shape.middle)
    return sweeps, versions


@dataclass(frozen=True)
class _Shape:
    """The source log's templates and the depth they are played at: templates ``0 .. edge - 1`` are the first layers,
    ``middle`` (= ``edge``) every layer between, the rest the last layers."""

    edge: int
    depth: int

    @property
    def source(self) -> int:
        return source_layers(self.edge)

    @property
    def middle(self) -> int:
        return self.edge

    def layers_of(self, template: int) -> list[int]:
        """The layers ``template`` is played as."""
        if template < self.middle:
            return [template]
        if template > self.middle:
            return [self.depth - (self.source - template)]
        return list(range(self.edge, self.depth - self.edge))

    def template_of(self, layer: int) -> int:
        """The template that plays ``layer``."""
        if layer < self.edge:
            return layer
        if layer >= self.depth - self.edge:
            return self.source - (self.depth - layer)
        return self.middle


def _between(events: Sequence[Event], layers: list[int | None]) -> list[int | None]:
    """``layers`` with the events about storages made from nothing outside every module, between two events of the
    same or of neighbouring layers, given to the layer after them: what an optimizer makes for each parameter from
    nothing (its step counter) before what it makes from the parameter (its moments)."""
    index = 0
    while index < len(layers):
        if layers[index] is not None:
            index += 1
            continue
        end = index
        while end < len(layers) and layers[end] is None and not events[end].module and \
                events[end].storage is not None and events[end].storage.tag is None:  # type: ignore[union-attr]
            end += 1
        before = layers[index - 1] if index else None
        after = layers[end] if end < len(layers) else None
        if end > index and before is not None and after is not None and abs(after - before) <= 1:
            layers[index:end] = [after] * (end - index)
        index = max(end, index + 1)
    return layers


def _frees_by_layer(events: Sequence[Event], layers: Sequence[int | None]) -> tuple[list[Event], list[int | None]]:
    """``events`` with each batch of frees made outside every layer (frees that follow each other) whose layers
    interleave gathered layer by layer, in the order each layer first comes in the batch, and each layer's frees in
    the order their storages were made (as :func:`canonical`, which compares such a batch in that order, numbers
    them). A batch whose layers do not interleave is left as it is; :func:`extend` gathers only a log whose layers
    do not repeat as it came.

    Such a batch comes in an order no consumer's result depends on (the allocator model merges freed blocks alike in
    any order; a ledger's peak is never at a free): autocast's cache of cast weights, cleared as the forward's autocast
    ends, frees every layer's casts in its hash map's order where checkpointing kept them out of the saved tensors.
    Left as it came, that order mixes the layers, and no layer's events could be told apart from another's.

    Example:
        >>> made = [Event("A", "alloc", i, 8, storage=Storage(i)) for i in range(4)]
        >>> frees = [Event("A", "free", i, storage=made[i].storage) for i in (2, 0, 3, 1)]
        >>> ordered, layers = _frees_by_layer(made + frees, [0, 0, 1, 1] + [1, 0, 1, 0])
        >>> [event.key for event in ordered[4:]], layers[4:]
        ([2, 3, 0, 1], [1, 1, 0, 0])
    """
    made: dict[Storage, int] = {}
    for index, event in enumerate(events):
        if event.storage is not None:
            made.setdefault(event.storage, index)
    ordered = list(zip(events, layers, strict=True))
    start = 0
    while start < len(ordered):
        end = start
        while end < len(ordered) and ordered[end][0].op == "free" and ordered[end][0].context is None:
            end += 1
        batch = ordered[start:end]
        in_turn = [layer for index, (_, layer) in enumerate(batch) if index == 0 or batch[index - 1][1] != layer]
        if len(set(in_turn)) < len(in_turn):  # a layer's frees come in two places or more
            first = {layer: index for index, layer in reversed(list(enumerate(in_turn)))}
            ordered[start:end] = sorted(batch, key=lambda pair: (
                first[pair[1]], made.get(pair[0].storage, -1) if pair[0].storage is not None else -1))
        start = max(end, start + 1)
    return [event for event, _ in ordered], [layer for _, layer in ordered]


def _runs(layers: Sequence[int | None]) -> list[_Run]:
    runs: list[_Run] = []
    start = 0
    for index in range(1, len(layers) + 1):
        if index == len(layers) or layers[index] != layers[start] or layers[index] is None:
            runs.append(_Run(layers[start], start, index))
            start = index
    return runs


def _sweeps(runs: Sequence[_Run]) -> list[list[_Run]]:
    """Runs of successive layers, each sweep in one direction; a run of no layer is a sweep of its own."""
    sweeps: list[list[_Run]] = []
    direction = 0
    for run in runs:
        last = sweeps[-1][-1] if sweeps else None
        if run.layer is not None and last is not None and last.layer is not None:
            step = run.layer - last.layer
            if step in (1, -1) and direction in (0, step):
                sweeps[-1].append(run)
                direction = step
                continue
        sweeps.append([run])
        direction = 0
    return sweeps


def _owners(events: Sequence[Event], layers: Sequence[int | None]) -> dict[Storage, int | None]:
    """The layer each storage was made in (its first event's), None for storages of no layer."""
    owner: dict[Storage, int | None] = {}
    for event, layer in zip(events, layers, strict=True):
        if event.storage is not None and event.storage not in owner:
            if event.op not in _NEW:
                raise NotRepeating(f"a storage is used ({event.op}) before the log saw it made")
            owner[event.storage] = layer
    return owner


class _Versions:
    """Which storage of one template plays which of another, for the middle template and its neighbours (keys:
    template pairs)."""

    def __init__(self, middle: int) -> None:
        before, after = middle - 1, middle + 1
        self.maps: dict[tuple[int, int], dict[Storage, Storage]] = {
            (middle, after): {}, (after, middle): {}, (before, middle): {}, (middle, before): {}}
        self.through = {(before, after): ((before, middle), (middle, after)),
                        (after, before): ((after, middle), (middle, before))}

    def add(self, source: int, target: int, storage: Storage, other: Storage) -> None:
        for pair, first, second in (((source, target), storage, other), ((target, source), other, storage)):
            known = self.maps[pair].setdefault(first, second)
            if known is not second:
                raise NotRepeating(f"a storage of layer {pair[0]} plays two storages of layer {pair[1]}")

    def of(self, storage: Storage, source: int, target: int) -> Storage:
        """``storage`` (of template ``source``) as template ``target`` has it."""
        if source == target:
            return storage
        path = self.through.get((source, target), ((source, target),))
        for step in path:
            found = self.maps.get(step, {}).get(storage)
            if found is None:
                raise NotRepeating(f"no storage of layer {step[1]} plays one of layer {step[0]}")
            storage = found
        return storage


def _signature(event: Event, paths: LayerPaths) -> tuple[Any, ...]:
    names = _names(event.names, paths, -1)
    # A free or a new category is about a storage made earlier, whose size is its own: between layers, the one
    # before a layer and the one before the first layer (what the head leaves) may differ.
    nbytes = event.nbytes if event.op not in ("free", "move") else None
    return event.consumer, event.op, nbytes, event.category, event.label, paths.rename(event.module, -1), names


def _names(key: Any, paths: LayerPaths, layer: int, template: int | None = None, depth: int = 0) -> Any:
    """A marker's module name (or names: the FSDP modules running at a peak check) as an event of ``template`` played
    as ``layer`` has them: a name in the event's own layer in ``layer``, one in the layer before or after it in the
    layer before or after ``layer`` (without ``template``: every layer number made ``layer``)."""
    if isinstance(key, str):
        named = paths.layer_of(key)
        if named is None or template is None:
            return paths.rename(key, layer)
        target = layer + named - template
        if not 0 <= target < depth or abs(named - template) > 1:
            raise NotRepeating(f"an event of layer {template} names {key}")
        return paths.rename(key, target)
    if isinstance(key, tuple):
        return tuple(_names(name, paths, layer, template, depth) for name in key)
    return key


def _pair(events: Sequence[Event], sweep: Sequence[_Run], owner: dict[Storage, int | None],
          versions: _Versions, paths: LayerPaths, middle: int) -> None:
    """Check that the middle layer and the one after it run the same events in ``sweep`` and pair their storages."""
    after = middle + 1
    runs = [run for run in sweep if run.layer == middle]
    nexts = [run for run in sweep if run.layer == after]
    if not runs or not nexts:
        if runs and len(sweep) == 1:
            raise NotRepeating("events of a middle layer alone, with no first or last layer to say their order")
        return
    one, two = runs[0], nexts[0]
    if one.end - one.start != two.end - two.start:
        raise NotRepeating(f"layers {middle} and {after} differ: {one.end - one.start} events against "
                           f"{two.end - two.start}")
    for first, second in zip(events[one.start:one.end], events[two.start:two.end], strict=True):
        if _signature(first, paths) != _signature(second, paths):
            raise NotRepeating(f"layers {middle} and {after} differ: {_signature(first, paths)} against "
                               f"{_signature(second, paths)}")
        if first.storage is None or second.storage is None:
            continue
        pair = (owner[first.storage], owner[second.storage])
        if first.op in _NEW or pair == (middle, after):
            versions.add(middle, after, first.storage, second.storage)
        elif pair == (middle - 1, middle):
            # what the middle layer takes from the layer before it, the next takes from the middle in the same place
            versions.add(middle - 1, middle, first.storage, second.storage)


def _played(sweep: Sequence[_Run], shape: _Shape) -> list[tuple[_Run, int | None]]:
    """Each run of ``sweep`` with the layers it is played as, in the sweep's order."""
    if sweep[0].layer is None:
        return [(sweep[0], None)]
    descending = len(sweep) > 1 and sweep[1].layer < sweep[0].layer  # type: ignore[operator]
    played: list[tuple[_Run, int | None]] = []
    for run in sweep:
        layers = shape.layers_of(run.layer)  # type: ignore[arg-type]
        for layer in reversed(layers) if descending else layers:
            played.append((run, layer))
    return played


class _Player:
    """Plays events as other layers (:meth:`play`). The middle layer's events are played once for every layer
    between the first and the last, so what an event's template decides (the layer its module is in, a storage's
    version in another template) is worked out once and kept, not again for each layer."""

    def __init__(self, shape: _Shape, owner: dict[Storage, int | None], versions: _Versions,
                 paths: LayerPaths) -> None:
        self.shape, self.owner, self.versions, self.paths = shape, owner, versions, paths
        self._module_layer: dict[str, int | None] = {}
        self._renamed: dict[tuple[str, int], str] = {}
        self._version: dict[tuple[Storage, int, int], Storage] = {}

    def play(self, event: Event, template: int | None, layer: int | None) -> Event:
        """``event`` (of ``template``) as layer ``layer`` of a model of ``shape.depth`` layers has it."""
        shape, paths = self.shape, self.paths
        depth = shape.depth
        key: Hashable = event.key
        storage = event.storage
        if storage is not None:
            made_in = self.owner[storage]
            if made_in is None:
                key = storage
            elif template is None or layer is None:
                raise NotRepeating("an event of no layer uses a storage of a layer")
            else:
                target = layer + (made_in - template)
                if not 0 <= target < depth:
                    raise NotRepeating(f"layer {layer} uses a storage of layer {target}, which a model of {depth} "
                                       "layers does not have")
                key = (self._version_of(storage, made_in, shape.template_of(target)), target)
        module = event.module
        if layer is not None:
            named = self._module_layer.get(module, -1)
            if named == -1:
                named = self._module_layer[module] = paths.layer_of(module)
            if named is not None and named != template:
                raise NotRepeating(f"an event of layer {template} runs in {module}")
            if named is not None:
                renamed = self._renamed.get((module, layer))
                if renamed is None:
                    renamed = self._renamed[module, layer] = paths.rename(module, layer)
                module = renamed
            names = None if event.names is None else _names(event.names, paths, layer, template, depth)
        else:
            names = None if event.names is None else _fixed_names(event.names, paths, shape)
        return Event(event.consumer, event.op, key, event.nbytes, event.category, module, label=event.label,
                     names=names)

    def _version_of(self, storage: Storage, source: int, target: int) -> Storage:
        found = self._version.get((storage, source, target))
        if found is None:  # not kept where it raises: the next ask raises the same
            found = self._version[storage, source, target] = self.versions.of(storage, source, target)
        return found


def _fixed_names(key: Any, paths: LayerPaths, shape: _Shape) -> Any:
    """A marker of no layer's module names (an FSDP module whose backward starts while the head's runs), each in
    the one layer its template is played as (the middle template, played as many, refused)."""
    if isinstance(key, str):
        named = paths.layer_of(key)
        if named is None:
            return key
        layers = shape.layers_of(named)
        if len(layers) != 1:
            raise NotRepeating(f"an event of no layer names {key}, a layer between the first and the last")
        return paths.rename(key, layers[0])
    if isinstance(key, tuple):
        return tuple(_fixed_names(name, paths, shape) for name in key)
    return key


def canonical(events: Sequence[Event], consumer: str,
              identity: Callable[[Event], Hashable] | None = None) -> list[tuple[Any, ...]]:
    """``consumer``'s events as comparable tuples: storages numbered in the order they are made, the frees that
    follow each other (a batch of frees, whose order the garbage collector and dict order decide and no
    consumer's result depends on) in the order of those numbers, and a check of the peak that repeats the one before
    it with nothing between them (which no consumer sees) left out.

    ``identity`` says which storage an event is about (default: its storage record, else its key).

    Example:
        >>> one, two = Storage(None), Storage(None)
        >>> log = [Event("A", "alloc", 7, 8, storage=one), Event("A", "alloc", 9, 8, storage=two),
        ...        Event("A", "free", 9, storage=two), Event("A", "free", 7, storage=one)]
        >>> canonical(log, "A")[2:]
        [('free', 0, 0, '', ''), ('free', 1, 0, '', '')]
    """
    identity = identity or (lambda event: event.storage if event.storage is not None else event.key)
    numbers: dict[Hashable, int] = {}
    made = 0
    rows: list[tuple[Any, ...]] = []
    frees: list[tuple[Any, ...]] = []
    for event in events:
        if event.consumer != consumer:
            continue
        if event.op == "free":
            number = numbers.pop(identity(event))
            frees.append((event.op, number, 0, event.category, event.module))
            continue
        if frees:
            rows += sorted(frees)
            frees = []
        if event.op in _STORAGE_OPS:
            which = identity(event)
            if event.op in _NEW:
                numbers[which] = made
                made += 1
            rows.append((event.op, numbers[which], event.nbytes, event.category, event.module))
        else:
            row = (event.op, event.label, event.module, event.names)
            # A check right after the same check, nothing changed between them, changes nothing (FSDP2's lazy set-up
            # runs an operator per layer that makes nothing)
            if not (event.op == "check" and rows and rows[-1] == row):
                rows.append(row)
    return rows + sorted(frees)
