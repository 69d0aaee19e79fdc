"""Quiet by default: while plans run, the libraries memlab drives keep their warnings to themselves.

Each plan builds optimizers, wraps modules and casts weights, and transformers, bitsandbytes, peft and torch say so
(``use_cache=True is incompatible with gradient checkpointing`` and the like), once per plan, between the live
figure and the table. memlab's own remarks are trial notes, or :class:`~memlab.errors.MemlabWarning`, and still
show, as do warnings from the user's own code (a loss function's). ``verbose=True`` lets everything through.
Filters and logger levels are restored afterwards, so the user's kernel is left as it was.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator

from memlab.errors import MemlabWarning

__all__ = ["QUIET_LOGGERS", "quiet"]

QUIET_LOGGERS = ("transformers", "bitsandbytes", "peft", "accelerate", "torch")
"""The libraries kept quiet: their loggers are held at ERROR (child loggers follow), and warnings raised in their
modules (or in memlab's, where a library's warning points at its caller) are ignored."""
_QUIET_MODULES = rf"({'|'.join(QUIET_LOGGERS)}|memlab)(\.|$)"


@contextlib.contextmanager
def quiet(verbose: bool = False) -> Iterator[None]:
    """Silence third-party warnings and log messages below ERROR inside the block, unless ``verbose``.

    Example:
        >>> import warnings
        >>> library = {"__name__": "transformers.modeling_utils", "warnings": warnings}
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     with quiet():
        ...         exec("warnings.warn('a library remark')", library)
        ...         warnings.warn("memlab: a remark of memlab's", MemlabWarning)
        >>> [str(w.message) for w in caught]
        ["memlab: a remark of memlab's"]
    """
    if verbose:
        yield
        return
    loggers = [logging.getLogger(name) for name in QUIET_LOGGERS]
    levels = [logger.level for logger in loggers]
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", module=_QUIET_MODULES)
        warnings.filterwarnings("default", category=MemlabWarning)
        try:
            for logger in loggers:
                logger.setLevel(max(logger.getEffectiveLevel(), logging.ERROR))
            yield
        finally:
            for logger, level in zip(loggers, levels, strict=True):
                logger.setLevel(level)
