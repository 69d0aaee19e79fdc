"""PyTorch's ``FSDPMemTracker`` kept and replayed, so that an FSDP2 dry run of three layers can be carried to the
model's depth (:mod:`memlab.estimation.depth.carry`): the third consumer of a dry run's events, beside the allocator's
model and the one-GPU step's ledger.

What the FSDP2 estimate reads of the tracker is its peak snapshot and every module's snapshots (by device, each
reference type's bytes and their total). All of them are copies of one running snapshot, taken at three kinds of
moment, which :func:`logging_tracker` reports to a :class:`~memlab.estimation.depth.log.DepthLog` as consumer
``"F"``:

- each change to the running snapshot (``_update_snap``: a storage added, deleted, given another reference type,
  resized), as a storage event whose category is ``"device|reference type"``;
- each peak check after an operator (``_update_peak_stats``), with the FSDP modules running then;
- each snapshot a module's hooks take or local peak they start, seen where they are stored (the module's
  ``snapshots`` lists and ``local_peak``).

:func:`replay_fsdp` keeps the same books from those events: the running snapshot, the peak, and each module's
local peak and snapshots, in the order the tracker keeps them (written by hand: PyTorch's tracker cannot be fed
events, only operators). A replay of the log as it was kept gives the tracker's own results (the dry run checks it).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from typing import Any

from torch import nn

from memlab.estimation.depth.carry import ShallowModel
from memlab.estimation.depth.extend import NotRepeating, canonical, check_layers, extend, source_layers
from memlab.estimation.depth.log import ALLOCATOR, FSDP, DepthLog, Event
from memlab.estimation.depth.replay import replay_allocator
from memlab.estimation.sharded.fsdp2.speed import tracker_class

__all__ = ["FSDP2_EDGE", "Books", "carried_books", "logging_tracker", "replay_fsdp"]

_TOTAL = "Total"  # the running snapshot's key for a device's sum (mem_tracker._TOTAL_KEY)


def logging_tracker(model: nn.Module, optimizer: Any, log: DepthLog) -> Any:
    """PyTorch's ``FSDPMemTracker`` of ``model`` and ``optimizer`` (of :func:`memlab.estimation.sharded.fsdp2.speed.
    tracker_class`'s class), telling ``log`` what it does to its books (see the module's notes)."""
    base = tracker_class()

    class LoggingTracker(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__(model, optimizer)
            self.memory_tracking = _Stats(log)

        def _update_snap(self, u_type: Any, winfo: Any, old_mem_consumed: int | None = None,
                         old_reftype: Any = None) -> None:
            op = {"ADD": "alloc", "DEL": "free", "REF": "move", "SIZE": "resize"}[u_type.name]
            storage = _newest_storage(self) if op == "alloc" else None
            log.fsdp_storage(op, winfo, storage, int(winfo.mem_consumed),
                             f"{winfo.device}|{getattr(winfo.reftype, 'value', winfo.reftype)}")
            super()._update_snap(u_type, winfo, old_mem_consumed, old_reftype)

        def _update_peak_stats(self, peak_state: Any) -> None:
            tracked = self.memory_tracking.names
            running = tuple(sorted(name for name in self._mod_tracker.parents if name in tracked))
            log.fsdp_marker("check", running, getattr(peak_state, "value", peak_state))
            super()._update_peak_stats(peak_state)

        def __enter__(self) -> Any:
            entered = super().__enter__()
            if self._depth == 1:
                log.fsdp_marker("begin", None, "")
            return entered

    return LoggingTracker()


def _newest_storage(tracker: Any) -> Any:
    """The storage whose record the tracker has just made (it stores the record, then adds its bytes)."""
    data = tracker._WINFO.data
    return next(reversed(data))() if data else None


class _Stats(dict):  # type: ignore[type-arg]
    """The tracker's ``memory_tracking`` (a module -> its stats), whose stats tell the log where the module's hooks
    store a snapshot or start a local peak. A dict by id, as PyTorch's weak one is (FSDP modules live as long as the
    dry run)."""

    def __init__(self, log: DepthLog) -> None:
        super().__init__()
        self.log = log
        self.names: set[str] = set()

    def __setitem__(self, module: Any, stats: Any) -> None:
        self.names.add(stats.mod_fqn)
        stats.snapshots = _Snapshots(self.log, stats.mod_fqn, stats.snapshots)
        stats.__class__ = _logging_stats(type(stats))
        stats.__dict__["_log"] = self.log
        super().__setitem__(_Id(module), stats)

    def __getitem__(self, module: Any) -> Any:
        return super().__getitem__(_Id(module))

    def __contains__(self, module: Any) -> bool:
        return super().__contains__(_Id(module))

    def get(self, module: Any, default: Any = None) -> Any:
        return super().get(_Id(module), default)


class _Id:
    """A key that is an object's identity (modules of a dry run outlive the tracker)."""

    __slots__ = ("target",)

    def __init__(self, target: Any) -> None:
        self.target = target

    def __hash__(self) -> int:
        return id(self.target)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Id) and other.target is self.target


_STATS_CLASSES: dict[type, type] = {}


def _logging_stats(base: type) -> type:
    """``base`` (PyTorch's module stats class) whose ``local_peak``, when set, tells the log."""
    found = _STATS_CLASSES.get(base)
    if found is None:
        def get(stats: Any) -> Any:
            return stats.__dict__.get("local_peak")

        def set_(stats: Any, value: Any) -> None:
            stats.__dict__["_log"].fsdp_marker("reset", stats.mod_fqn, "")
            stats.__dict__["local_peak"] = value

        found = _STATS_CLASSES[base] = type(base.__name__, (base,), {"local_peak": property(get, set_)})
    return found


class _Snapshots(dict):  # type: ignore[type-arg]
    """A module's ``snapshots`` (state -> list), whose lists tell the log where a snapshot is stored."""

    def __init__(self, log: DepthLog, name: str, known: dict[Any, Any]) -> None:
        super().__init__(known)
        self.log, self.name = log, name

    def setdefault(self, state: Any, default: Any = None) -> Any:
        if state not in self:
            super().__setitem__(state, _Stored(self.log, self.name, state))
        return super().__getitem__(state)


class _Stored(list):  # type: ignore[type-arg]
    def __init__(self, log: DepthLog, name: str, state: Any) -> None:
        super().__init__()
        self.log, self.name, self.state = log, name, state

    def append(self, snapshot: Any) -> None:
        self.log.fsdp_marker("append", self.name, getattr(self.state, "value", self.state))
        super().append(snapshot)


Snapshot = dict[str, dict[str, int]]


def replay_fsdp(events: Iterable[Event], reference_types: Iterable[str]) -> tuple[Snapshot, list[Snapshot]]:
    """The tracker's peak snapshot and every module's snapshots (modules in the order the tracker met them, each
    module's states in the order it stored them), from the tracker's events of ``events``; snapshots by device
    name, each reference type's bytes (``reference_types``, all of them, as the tracker keeps them) and the total.

    Example:
        >>> log = [Event("F", "begin"), Event("F", "alloc", 1, 8, "cpu|Activation"),
        ...        Event("F", "check", label="Peak Forward", names=("layers.0",)),
        ...        Event("F", "free", 1, 0, "cpu|Activation")]
        >>> peak, modules = replay_fsdp(log, ["Activation"])
        >>> peak["cpu"], modules
        ({'Activation': 8, 'Total': 8}, [])
    """
    kinds = list(reference_types)
    current: Snapshot = {}
    live: dict[Any, tuple[str, str, int]] = {}
    peak_total: dict[str, int] = {}
    peak: Snapshot = {}
    local_peak: dict[str, dict[str, int]] = {}
    stored: dict[str, dict[str, list[Snapshot]]] = {}
    for event in events:
        if event.consumer != FSDP:
            continue
        op = event.op
        if op in ("alloc", "free", "move", "resize"):
            _book(op, event, current, live, kinds)
        elif op == "begin":
            peak = copy.deepcopy(current)
            peak_total = {device: snapshot[_TOTAL] for device, snapshot in peak.items()}
        elif op == "reset":
            stored.setdefault(event.names, {})
            local_peak[event.names] = {device: snapshot[_TOTAL] for device, snapshot in current.items()}
        elif op == "append":
            stored.setdefault(event.names, {}).setdefault(event.label, []).append(copy.deepcopy(current))
        elif op == "check":
            for name in event.names:
                lists = stored.get(name, {})
                if event.label in lists:
                    peaks = local_peak.setdefault(name, {})
                    for device, snapshot in current.items():
                        if peaks.get(device, 0) < snapshot[_TOTAL]:
                            peaks[device] = snapshot[_TOTAL]
                            lists[event.label][-1][device] = copy.deepcopy(snapshot)
            for device, snapshot in current.items():
                if peak_total.get(device, 0) < snapshot[_TOTAL]:
                    peak_total[device] = snapshot[_TOTAL]
                    peak[device] = copy.deepcopy(snapshot)
    modules = [snapshot for lists in stored.values() for snapshots in lists.values() for snapshot in snapshots]
    return peak, modules


def _book(op: str, event: Event, current: Snapshot, live: dict[Any, tuple[str, str, int]], kinds: list[str]) -> None:
    """One change to the running snapshot, as ``MemTracker._update_snap`` makes it."""
    device, kind = str(event.category).split("|", 1)
    if op == "alloc":
        live[event.key] = (device, kind, event.nbytes)
        snapshot = current.setdefault(device, dict.fromkeys([*kinds, _TOTAL], 0))
        snapshot[kind] += event.nbytes
        snapshot[_TOTAL] += event.nbytes
        return
    was_device, was_kind, was_bytes = live[event.key]
    snapshot = current.setdefault(was_device, dict.fromkeys([*kinds, _TOTAL], 0))
    if op == "free":
        del live[event.key]
        snapshot[was_kind] -= was_bytes
        snapshot[_TOTAL] -= was_bytes
    elif op == "move":
        live[event.key] = (was_device, kind, was_bytes)
        snapshot[was_kind] -= was_bytes
        snapshot[kind] += was_bytes
        return
    else:  # resize
        live[event.key] = (was_device, was_kind, event.nbytes)
        snapshot[was_kind] += event.nbytes - was_bytes
        snapshot[_TOTAL] += event.nbytes - was_bytes
    if snapshot[_TOTAL] == 0:
        del current[was_device]


Books = tuple[dict[str, int], list[dict[str, int]], int | None]
"""An FSDP2 dry run's peak by detail, every module-level snapshot by detail, and the allocator's reserved peak."""


FSDP2_EDGE = 2
"""The first and last layers an FSDP2 dry run plays as themselves: FSDP2's backward, as a layer runs its own,
starts the one before it and prefetches the one before that (the second layer prefetches the embeddings)."""


def carried_books(
    shallow: ShallowModel,
    runs: dict[int, tuple[list[Event], dict[str, int], list[dict[str, int]], int | None]],
    convert: Callable[[Snapshot, list[Snapshot]], tuple[dict[str, int], list[dict[str, int]]]],
    kinds: list[str],
    capacity: int | None,
) -> Books | None:
    """An FSDP2 dry run's books at the model's depth, from its dry runs of five layers and four (each: its events,
    the tracker's peak and snapshots made :data:`~memlab.estimation.sharded.fsdp2.DETAIL` by ``convert``, its reserved
    peak); None where they do not show one step repeating layer by layer. As for one GPU
    (:func:`memlab.estimation.depth.carry.carried_trial`): the three-layer events replayed as they are must give that
    dry run's own books, and carried to two layers must tell the tracker and the allocator exactly what the two-layer
    dry run did."""
    edge = FSDP2_EDGE
    (events, detail, peaks, reserved), (two, _, _, _) = runs[source_layers(edge)], runs[check_layers(edge)]
    allocator = any(event.consumer == ALLOCATOR for event in events)
    try:
        if convert(*replay_fsdp(events, kinds)) != (detail, peaks):
            return None
        read = replay_allocator(events, capacity) if allocator else None
        if (read[0] if read is not None else None) != reserved:
            return None
        checked = extend(events, check_layers(edge), shallow.paths, edge)
        if any(canonical(checked, consumer) != canonical(two, consumer) for consumer in (ALLOCATOR, FSDP)):
            return None
        deep = extend(events, shallow.depth, shallow.paths, edge)
        carried_detail, carried_peaks = convert(*replay_fsdp(deep, kinds))
        read = replay_allocator(deep, capacity) if allocator else None
    except (NotRepeating, KeyError, ValueError):  # a log its consumers could not have been told: dry-run whole
        return None
    return carried_detail, carried_peaks, read[0] if read is not None else None
