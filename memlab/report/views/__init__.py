"""The views of the report's data, found by name: the data (:mod:`memlab.report.data`, :mod:`memlab.report.timeline`)
asks here for what draws it, and each view module (:mod:`memlab.report.views.tables`, :mod:`memlab.report.views.figure`,
:mod:`memlab.report.views.timeline_figure`) registers its functions as :mod:`memlab.report` imports it. So the data
never imports its views, and a view imports the data it draws: the imports run one way.

Example:
    >>> import memlab.report  # registers every view
    >>> view("text_table").__module__
    'memlab.report.views.tables'
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["register_views", "view"]

_VIEWS: dict[str, Callable[..., Any]] = {}


def register_views(**views: Callable[..., Any]) -> None:
    """Register each function under its name (a view module calls this once, at its end).

    Example:
        >>> register_views(example_view=str.upper); view("example_view")("a")
        'A'
    """
    _VIEWS.update(views)


def view(name: str) -> Callable[..., Any]:
    """The function registered as ``name``; a RuntimeError naming the view modules where none is (memlab's own
    package imports them: this is a bug, never the user's input).

    Example:
        >>> view("no such view")
        Traceback (most recent call last):
        ...
        RuntimeError: no view 'no such view' is registered; memlab.report imports the modules of \
memlab.report.views (tables, figure and timeline_figure), which register theirs
    """
    try:
        return _VIEWS[name]
    except KeyError:
        raise RuntimeError(f"no view {name!r} is registered; memlab.report imports the modules of memlab.report.views "
                           "(tables, figure and timeline_figure), which register theirs") from None
