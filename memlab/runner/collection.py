"""Python's garbage collector while memlab runs dry runs: no automatic collection at all, so that a dry run's
answer does not depend on when one runs.

A process that has imported torch, transformers and peft holds half a million objects or more (a notebook's kernel
more), and a dry run makes hundreds of thousands more (fake tensors, the depth log's events). Each of Python's full
collections walks every object the process holds: 0.2-0.5 s each on a laptop, about ten in one ``memlab estimate``
of a 7B model with its suggestions, a fifth of its time, spent on objects the dry run neither made nor can free.
Inside :func:`without_full_collections` the collector makes no collection of its own; the thresholds the process had
are put back when the outermost dry run ends, and its next collections free what was left. Young collections are
off too (since 2026-11-28): a fake tensor held in a reference cycle (the tracing machinery makes some) was freed
whenever a young collection happened to run, which depends on everything the process allocated before, so the same
compiled step's estimated reserve for an H100 was 12.51 GB in one process and 13.23 GB in another (1.033 and 1.092
of the measured 12.11 GB); with no collection inside, it is 12.51 GB in both. An explicit ``gc.collect()`` still runs
(a failed trial's release calls one). CPython has no other way to keep its collector off the objects a process
already had (``gc.freeze`` would, but counting what a caller froze walks every frozen object).
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

__all__ = ["without_full_collections"]

# More allocations than any dry run makes between two collections; a C int, as gc.set_threshold takes.
_NO_COLLECTION = 1 << 30

_lock = threading.Lock()
_inside = 0
_thresholds: tuple[int, int, int] | None = None
"""The process's thresholds, kept while a dry run (in any thread) is inside."""


@contextlib.contextmanager
def without_full_collections() -> Iterator[None]:
    """Inside it (also a decorator), no collection runs on its own; nested and in several threads at once, the
    thresholds come back when the last one ends.

    Example:
        >>> import gc
        >>> before = gc.get_threshold()
        >>> with without_full_collections():
        ...     gc.get_threshold()[0] > before[0], gc.get_threshold()[2] > before[2]
        (True, True)
        >>> gc.get_threshold() == before
        True
    """
    global _inside, _thresholds
    with _lock:
        if _inside == 0:
            _thresholds = gc.get_threshold()
            young, middle, full = _thresholds
            gc.set_threshold(max(young, _NO_COLLECTION), middle, max(full, _NO_COLLECTION))
        _inside += 1
    try:
        yield
    finally:
        with _lock:
            _inside -= 1
            if _inside == 0 and _thresholds is not None:
                gc.set_threshold(*_thresholds)
                _thresholds = None
