"""The errors memlab raises on bad input, each with a message that says what to write instead."""

from __future__ import annotations


class MemlabError(ValueError):
    """Bad input to memlab: the message names the problem and what to write instead.

    Example:
        >>> raise MemlabError("accumulation must be >= 1; write accumulation=1 or more")
        Traceback (most recent call last):
        ...
        memlab.errors.MemlabError: accumulation must be >= 1; write accumulation=1 or more
    """


class UnsupportedTechnique(MemlabError):
    """A technique cannot run on this model or device (for example bf16 on a GPU without it)."""


class MemlabWarning(UserWarning):
    """memlab's own remarks; shown even while third-party warnings are kept quiet (:func:`memlab.runner.quiet.quiet`).

    Example:
        >>> import warnings
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     warnings.warn("memlab: the plan was undone first", MemlabWarning)
        >>> caught[0].category.__name__
        'MemlabWarning'
    """
