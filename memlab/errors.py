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
