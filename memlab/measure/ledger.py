"""A memory tracker's accounting (:class:`Ledger`): live bytes by category, their peak, and who is told of each
change, kept by storage key. :class:`~memlab.measure.tracker.MemoryTracker` feeds it from the operators it sees
(each storage followed by a weak reference, so that its free is counted when it happens); a dry run carried to more
layers replays events through the same accounting by key (:mod:`memlab.estimation.depth.replay`).
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from typing import Any

__all__ = ["CATEGORIES", "Ledger"]

CATEGORIES = ("params", "grads", "optimizer", "activations", "other")
"""Where the memory of a training step goes (the tracker's categories), in the order tables and stacked bars show
them."""


def _as_int(value: Any) -> int:
    """Storage sizes are ints, except symbolic ones under fake tensors with dynamic shapes."""
    if type(value) is int:
        return value
    try:
        return int(value)
    except Exception:  # an unbacked symbolic size has no value to count
        return 0


class Ledger:
    """A tracker's accounting, shared with the weak-reference callbacks.

    It never holds a tensor or a storage (only weak references to storages), so a freed storage's callback
    can always run. Callbacks can fire at any allocation (cyclic garbage collection), including in the
    middle of an update here; they therefore only queue the free while an update is under way, and the
    queue is applied at the end of it.

    The bookkeeping itself is by key (``add_key``, ``remove_key``, ``resize_key``, ``move_key``, ``note_peak``): a
    dry run extended to more layers (:mod:`memlab.estimation.depth.replay`) replays its events through these, with
    no storage behind them.

    Example:
        >>> ledger = Ledger(("params", "activations", "other"))
        >>> ledger.add_key("w", 100, "params"); ledger.add_key("x", 50, "activations"); ledger.note_peak()
        100
        50
        True
        >>> ledger.remove_key("x"); ledger.live, ledger.peak, ledger.peak_totals["activations"]
        (100, 150, 50)
    """

    def __init__(self, categories: tuple[str, ...] = CATEGORIES) -> None:
        self.totals: dict[str, int] = dict.fromkeys(categories, 0)
        # key (id of the storage) -> [weakref to the storage (None in a replay), category, nbytes]
        self.entries: dict[Any, list[Any]] = {}
        self.live = 0
        self.peak = 0
        self.peak_totals: dict[str, int] = dict(self.totals)
        self.busy = False
        self.pending: list[tuple[int, weakref.ref[Any]]] = []
        # Told (id of the storage, its bytes now; 0 when it is gone) of every change, in order.
        self.listener: Callable[[int, int], None] | None = None
        # A timeline's recorder (memlab.measure.timeline), told every change with its category, and each new peak.
        self.recorder: Any = None
        # Told each time the peak is checked (after an operator's allocations), new peak or not: a recorder that
        # keeps the step to replay it (memlab.estimation.depth.log) needs where the checks fall.
        self.checker: Callable[[], None] | None = None

    def freed(self, key: int, ref: weakref.ref[Any]) -> None:
        self.pending.append((key, ref))
        if not self.busy:
            self.flush()

    def flush(self) -> None:
        if self.busy:
            return
        self.busy = True
        try:
            self._apply_pending()
        finally:
            self.busy = False

    def _apply_pending(self) -> None:
        entries = self.entries
        while self.pending:
            key, ref = self.pending.pop()
            entry = entries.get(key)
            if entry is None or entry[0] is not ref:
                continue
            self.remove_key(key)

    def lookup(self, storage: Any) -> list[Any] | None:
        """The entry of a live tracked storage, or None (a stale entry of a dead one is dropped)."""
        entry = self.entries.get(id(storage))
        if entry is None:
            return None
        if entry[0]() is storage:
            return entry
        # Same id as a storage that died with its free still queued: apply that free first.
        self.remove_key(id(storage))
        return None

    def add(self, storage: Any, category: str) -> int:
        key = id(storage)
        return self.add_key(key, _as_int(storage.nbytes()), category,
                            weakref.ref(storage, functools.partial(self.freed, key)))

    def resize(self, entry: list[Any], storage: Any) -> int:
        """Follow a tracked storage that an in-place op (``resize_``, ``out=``) has grown or shrunk."""
        return self.resize_key(id(storage), _as_int(storage.nbytes()))

    def move(self, entry: list[Any], category: str) -> None:
        self.move_key(id(entry[0]()), category)

    # --- by key ------------------------------------------------------------------------------------------------
    def add_key(self, key: Any, nbytes: int, category: str, ref: weakref.ref[Any] | None = None) -> int:
        """A new storage ``key`` of ``nbytes`` under ``category``; returns its bytes."""
        self.entries[key] = [ref, category, nbytes]
        self.totals[category] += nbytes
        self.live += nbytes
        if self.listener is not None:
            self.listener(key, nbytes)
        if self.recorder is not None:
            self.recorder.changed(key, nbytes, category)
        return nbytes

    def remove_key(self, key: Any) -> None:
        """The storage ``key`` is gone."""
        entry = self.entries.pop(key)
        self.totals[entry[1]] -= entry[2]
        self.live -= entry[2]
        if self.listener is not None:
            self.listener(key, 0)
        if self.recorder is not None:
            self.recorder.changed(key, 0, entry[1])

    def resize_key(self, key: Any, nbytes: int) -> int:
        """The storage ``key`` now holds ``nbytes``; returns the change."""
        entry = self.entries[key]
        change = nbytes - entry[2]
        if change:
            entry[2] = nbytes
            self.totals[entry[1]] += change
            self.live += change
            if self.listener is not None:
                self.listener(key, nbytes)
            if self.recorder is not None:
                self.recorder.changed(key, nbytes, entry[1])
        return change

    def move_key(self, key: Any, category: str) -> None:
        """The storage ``key`` counts under ``category`` from now on."""
        entry = self.entries[key]
        if entry[1] != category:
            self.totals[entry[1]] -= entry[2]
            self.totals[category] += entry[2]
            entry[1] = category
            if self.recorder is not None:
                self.recorder.changed(key, entry[2], category)

    def note_peak(self) -> bool:
        if self.checker is not None:
            self.checker()
        if self.live > self.peak:
            self.peak = self.live
            self.peak_totals = dict(self.totals)
            if self.recorder is not None:
                self.recorder.peaked()
            return True
        return False
