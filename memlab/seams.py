"""Where a layer reaches work that a layer above it does, without importing it: the package (``memlab/__init__.py``,
above every layer) says once which module provides each seam, and the module below asks for it by the seam's name.

The :class:`~memlab.plan.Plan` is data: its ``to_training_arguments()``, ``to_deepspeed()``... are one-line aliases
of functions of :mod:`memlab.export`, which builds on the Plan. So plan.py never imports export/ (the import would
close a circle); it asks this module for the seam ``"plan exports"``, and the package provides it. Torch-free and
importing nothing of memlab: the package imports it as it starts.

Example:
    >>> provide("an example", lambda: {"answer": 42})
    >>> provided("an example")["answer"]
    42
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

_providers: dict[str, Callable[[], Any]] = {}
_provided: dict[str, Any] = {}


def provide(seam: str, loader: Callable[[], Any]) -> None:
    """Say what provides ``seam``: ``loader()`` imports it on first use (a later call for the same seam replaces it).

    Example:
        >>> provide("twice", lambda: 1); provide("twice", lambda: 2); provided("twice")
        2
    """
    _providers[seam] = loader
    _provided.pop(seam, None)


def provided(seam: str) -> Any:
    """What provides ``seam``, imported on first use (``provided("plan exports")``: :mod:`memlab.export`)."""
    if seam not in _provided:
        if seam not in _providers:
            known = ", ".join(repr(name) for name in sorted(_providers))
            raise LookupError(f"no module provides the seam {seam!r}; memlab/__init__.py provides {known}")
        _provided[seam] = _providers[seam]()
    return _provided[seam]
