"""Python's garbage collector while memlab runs dry runs: young collections only, no full ones.

A process that has imported torch, transformers and peft holds half a million objects or more (a notebook's kernel
more), and a dry run makes hundreds of thousands more (fake tensors, the depth log's events). Each of Python's full
collections walks every object the process holds: 0.2-0.5 s each on a laptop, about ten in one ``memlab estimate``
of a 7B model with its suggestions, a fifth of its time, spent on objects the dry run neither made nor can free.
Inside :func:`without_full_collections` the collector keeps its young collections (the cycles a dry run makes and
drops at once are freed as before) and makes no full one; the thresholds the process had are put back when the
outermost dry run ends, and its next full collection frees what was left. An explicit ``gc.collect()`` still runs
(a failed trial's release calls one). CPython has no other way to keep its collector off the objects a process
already had (``gc.freeze`` would, but counting what a caller froze walks every frozen object).
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

__all__ = ["without_full_collections"]

# Larger than the young collections any run makes (hundreds); a C int, as gc.set_threshold takes.
_NO_FULL_COLLECTION = 1 << 30

_lock = threading.Lock()
_inside = 0
_thresholds: tuple[int, int, int] | None = None
"""The process's thresholds, kept while a dry run (in any thread) is inside."""


@contextlib.contextmanager
def without_full_collections() -> Iterator[None]:
    """Inside it (also a decorator), no full collection runs on its own; nested and in several threads at once, the
    thresholds come back when the last one ends.

    Example:
        >>> import gc
        >>> before = gc.get_threshold()
        >>> with without_full_collections():
        ...     gc.get_threshold()[:2] == before[:2], gc.get_threshold()[2] > before[2]
        (True, True)
        >>> gc.get_threshold() == before
        True
    """
    global _inside, _thresholds
    with _lock:
        if _inside == 0:
            _thresholds = gc.get_threshold()
            young, middle, full = _thresholds
            gc.set_threshold(young, middle, max(full, _NO_FULL_COLLECTION))
        _inside += 1
    try:
        yield
    finally:
        with _lock:
            _inside -= 1
            if _inside == 0 and _thresholds is not None:
                gc.set_threshold(*_thresholds)
                _thresholds = None
