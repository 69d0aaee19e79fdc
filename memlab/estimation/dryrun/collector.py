"""Python's garbage collector during a dry run: its full collections look only at the objects the dry run made.

A process that has imported torch, transformers and peft holds half a million objects or more (a notebook's kernel
more), and a dry run makes hundreds of thousands more that live until it ends (fake tensors, the depth log's
events). Each of Python's full collections walks every object the process holds: about 0.2-0.5 s each on a laptop,
ten or more in one ``memlab estimate`` of a 7B model, a fifth of its time, spent on objects that existed before the
dry run and that it cannot free. :func:`collect_only_new_objects` moves those objects out of the collector's
generations for the dry run (``gc.freeze``) and puts them back afterwards (``gc.unfreeze``): the dry run's own
garbage is collected as before, and nothing of the caller's is changed (their objects are collected again once it
returns). CPython has no other way to tell its collector to skip the objects a process already had.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

__all__ = ["collect_only_new_objects"]


@contextlib.contextmanager
def collect_only_new_objects() -> Iterator[None]:
    """Inside it, the garbage collector looks only at objects made inside it (also a decorator).

    Where objects are already frozen (an outer dry run, or the caller's own ``gc.freeze``), it changes nothing: the
    caller's frozen objects stay frozen, and an outer dry run puts everything back once.

    Example:
        >>> import gc
        >>> with collect_only_new_objects():
        ...     gc.get_freeze_count() > 0  # what the process held before: out of the collector's generations
        True
    """
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()

