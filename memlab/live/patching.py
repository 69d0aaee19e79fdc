"""Attributes set on an object for the length of a ``with`` block and put back exactly after (:func:`patched`): the
one way memlab changes a trainer's settings, a model's ``forward``, a config, a library's function or a module's
global for a while.

Example:
    >>> class Model:
    ...     def forward(self):
    ...         return "the class's forward"
    >>> model = Model()
    >>> with patched(model, forward=lambda: "a wrapper"):
    ...     model.forward()
    'a wrapper'
    >>> model.forward(), vars(model)  # the instance holds nothing of its own again
    ("the class's forward", {})
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from typing import Any

__all__ = ["patched"]

_ABSENT = object()


def _held(owner: Any, name: str) -> Any:
    """What putting ``owner.name`` back means: the object ``owner`` holds itself under ``name`` (its ``__dict__``:
    an object's attributes, a class's namespace, a module's globals); ``_ABSENT`` where it inherits the name from a
    class or has none, so that deleting its own uncovers what was there; else the value read (one ``__getattr__``
    serves, as a torch module's submodules, or a property's or a slot's of an instance, set back through it)."""
    own = getattr(owner, "__dict__", None)
    if own is not None and name in own:
        return own[name]
    inherited = inspect.getattr_static(owner, name, _ABSENT)
    if inherited is _ABSENT or (not isinstance(owner, type) and hasattr(type(inherited), "__set__")):
        return getattr(owner, name, _ABSENT)
    return _ABSENT


@contextlib.contextmanager
def patched(owner: Any, **values: Any) -> Iterator[None]:
    """``owner`` with each of ``values`` set on it (``setattr``) inside the block, and put back exactly after, also
    when the block raises, in the reverse order. What ``owner`` held itself gets that very object back (a class's
    function, not a bound method of it), whatever was set there in between; a name it did not hold is deleted again,
    so that what it inherits (its class's method, a default on its class) shows through as before.

    Example:
        >>> from types import SimpleNamespace
        >>> config = SimpleNamespace(max_length=8)
        >>> with patched(config, max_length=16, beta=0.0):
        ...     config
        namespace(max_length=16, beta=0.0)
        >>> config  # beta, which it did not have, is gone again
        namespace(max_length=8)
    """
    saved: list[tuple[str, Any]] = []
    try:
        for name, value in values.items():
            before = _held(owner, name)
            setattr(owner, name, value)
            saved.append((name, before))
        yield
    finally:
        for name, before in reversed(saved):
            if before is not _ABSENT:
                setattr(owner, name, before)
            else:
                with contextlib.suppress(AttributeError):  # deleted in between already
                    delattr(owner, name)
