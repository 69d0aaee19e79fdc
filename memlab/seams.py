"""Where a layer reaches work that a layer above it does, without importing it: the package (``memlab/__init__.py``,
above every layer) says once which module provides each seam, and the module below asks for it by the seam's name.

The :class:`~memlab.plan.Plan` is data: its ``to_training_arguments()``, ``to_deepspeed()``... are one-line aliases
of functions of :mod:`memlab.export`, which builds on the Plan. So plan.py never imports export/ (the import would
close a circle); it asks this module for the seam :data:`~memlab.plan.PLAN_EXPORTS`, and the package provides it.
Torch-free and importing nothing of memlab: the package imports it as it starts.

A seam is typed (:class:`Seam`): the layer that asks declares what it gets (``Seam[PlanExports]``, a protocol of the
functions it calls), :func:`provided` returns that type, and the package's loader returns it too, so the type checker
holds what provides a seam to what the layer below calls (``memlab.export``'s functions to
:class:`~memlab.plan.PlanExports`). ``tests/test_layout.py`` checks that each seam declared is provided, by a loader
annotated with the seam's type.

Example:
    >>> example: Seam[dict[str, int]] = Seam("an example")
    >>> provide("an example", lambda: {"answer": 42})
    >>> provided(example)["answer"]
    42
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, cast

__all__ = ["Seam", "provide", "provided"]

T = TypeVar("T")

_providers: dict[str, Callable[[], Any]] = {}
_provided: dict[str, Any] = {}


@dataclass(frozen=True)
class Seam(Generic[T]):
    """A seam by its name, typed by what it gives (``T``): declared by the layer that asks for it.

    Example:
        >>> Seam("plan exports").name
        'plan exports'
    """

    name: str


def provide(seam: str, loader: Callable[[], Any]) -> None:
    """Say what provides the seam named ``seam``: ``loader()`` imports it on first use (a later call for the same seam
    replaces it). The package's loaders are annotated with the seam's type, which the type checker holds them to.

    Example:
        >>> twice: Seam[int] = Seam("twice")
        >>> provide("twice", lambda: 1); provide("twice", lambda: 2); provided(twice)
        2
    """
    _providers[seam] = loader
    _provided.pop(seam, None)


def provided(seam: Seam[T]) -> T:
    """What provides ``seam``, imported on first use (``provided(PLAN_EXPORTS)``: :mod:`memlab.export`)."""
    if seam.name not in _provided:
        if seam.name not in _providers:
            known = ", ".join(repr(name) for name in sorted(_providers))
            raise LookupError(f"no module provides the seam {seam.name!r}; memlab/__init__.py provides {known}")
        _provided[seam.name] = _providers[seam.name]()
    return cast(T, _provided[seam.name])
