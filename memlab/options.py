"""RunOptions: how trials run (loss, steps, warm-up, budget, learning rate, progress), in one validated object.

Every entry point (``measure``, ``compare``, ``fit``, the panel, the magic, the CLI) takes the same keywords,
declared once here as :class:`RunKeywords`; they become one :class:`RunOptions` at the edge, which is what travels
through the core. ``estimate`` takes only the keywords that mean something for a dry run (``loss_fn``, ``budget``,
``lr``) and says so in its signature.

Example:
    >>> options = RunOptions.from_keywords({"budget": "1MiB", "steps": 2})
    >>> options.budget, options.steps, options.warmup
    (1048576, 2, 1)
    >>> RunOptions(steps=0)
    Traceback (most recent call last):
    ...
    memlab.errors.MemlabError: steps=0 is not allowed; write a whole number >= 1
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypedDict, cast

from memlab.errors import MemlabError
from memlab.events import Callback
from memlab.live.batch import LossFn
from memlab.plan import parse_budget

__all__ = ["RunKeywords", "RunOptions", "TrialKeywords", "check_learning_rate", "parse_host_budget"]


class TrialKeywords(TypedDict, total=False):
    """:class:`RunKeywords` without ``loss_fn``, for front ends that take the loss as an argument of its own."""

    steps: int
    warmup: int
    budget: int | str | None
    host_budget: int | str | None
    lr: float
    callback: Callback | None
    progress: bool
    noise: float
    time_limit: float
    verbose: bool


class RunKeywords(TrialKeywords, total=False):
    """The keywords every measuring entry point accepts (``**options: Unpack[RunKeywords]``).

    loss_fn: ``loss_fn(model, micro_batch) -> scalar tensor``; default ``model(**batch).loss`` for dict batches.
    steps: the fewest timed optimizer steps per plan (>= 1). warmup: untimed steps before them (>= 0; at least one
    always runs, since the first step creates the optimizer state). budget: bytes, or a size such as ``"8GiB"``.
    host_budget: the host memory a plan may keep (``Trial.host_bytes``), the same way; default what the machine has
    available as each trial starts.
    lr: the optimizer's learning rate. callback: called with every progress event (:mod:`memlab.events`).
    progress: show a progress bar. noise: timing goes on past ``steps`` until the 95% interval of the median step
    time is within +-noise of it (0.05: 5%; 0 times exactly ``steps`` steps), or ``time_limit`` seconds of timed
    steps have run. verbose: let third-party warnings (transformers, bitsandbytes) through while plans run.
    """

    loss_fn: LossFn | None


@dataclass(frozen=True)
class RunOptions:
    """The validated :class:`RunKeywords`: what every trial of a run shares. ``budget`` is in bytes.

    Example:
        >>> RunOptions(budget="2GiB").budget
        2147483648
        >>> RunOptions(warmup=-1)
        Traceback (most recent call last):
        ...
        memlab.errors.MemlabError: warmup=-1 is not allowed; write a whole number >= 0
    """

    loss_fn: LossFn | None = None
    steps: int = 3
    warmup: int = 1
    budget: int | None = None
    host_budget: int | None = None
    lr: float = 1e-5
    callback: Callback | None = None
    progress: bool = True
    noise: float = 0.05
    time_limit: float = 10.0
    verbose: bool = False

    def __post_init__(self) -> None:
        _check_count("steps", self.steps, minimum=1)
        if isinstance(self.noise, bool) or not isinstance(self.noise, (int, float)) or not 0 <= self.noise < 1:
            raise MemlabError(f"noise={self.noise!r} is not allowed; write a fraction such as noise=0.05 (5%), or 0")
        if (
            isinstance(self.time_limit, bool)
            or not isinstance(self.time_limit, (int, float))
            or not 0 < self.time_limit < float("inf")
        ):
            raise MemlabError(f"time_limit={self.time_limit!r} is not allowed; write seconds such as time_limit=10")
        if not isinstance(self.verbose, bool):
            raise MemlabError(f"verbose={self.verbose!r} is not allowed; write verbose=True or verbose=False")
        _check_count("warmup", self.warmup, minimum=0)
        check_learning_rate(self.lr)
        object.__setattr__(self, "budget", parse_budget(self.budget))
        object.__setattr__(self, "host_budget", parse_host_budget(self.host_budget))
        if self.loss_fn is not None and not callable(self.loss_fn):
            raise MemlabError("loss_fn must be callable as loss_fn(model, batch) -> scalar tensor")
        if self.callback is not None and not callable(self.callback):
            raise MemlabError("callback must be callable as callback(event); pass a function or None")

    @classmethod
    def from_keywords(cls, keywords: Mapping[str, Any]) -> RunOptions:
        """Options from keyword arguments; an unknown keyword is a clear error that lists the known ones.

        Example:
            >>> RunOptions.from_keywords({"step": 2})
            Traceback (most recent call last):
            ...
            memlab.errors.MemlabError: step= is not an option; write one of loss_fn, steps, warmup, budget, \
host_budget, lr, callback, progress, noise, time_limit, verbose
        """
        known = [field.name for field in dataclasses.fields(cls)]
        for key in keywords:
            if key not in known:
                raise MemlabError(f"{key}= is not an option; write one of {', '.join(known)}")
        return cls(**keywords)

    def replace(self, **changes: Any) -> RunOptions:
        """A copy with some options changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def keywords(self, **changes: Any) -> RunKeywords:
        """The options (with ``changes``) as keywords for ``measure``, ``compare`` or ``fit``.

        Example:
            >>> RunOptions(steps=2).keywords(budget="1KiB")["budget"]
            1024
        """
        options = self.replace(**changes) if changes else self
        return cast(RunKeywords, {field.name: getattr(options, field.name) for field in dataclasses.fields(options)})


def parse_host_budget(host_budget: int | float | str | None) -> int | None:
    """Bytes from ``host_budget=`` as :func:`memlab.plan.parse_budget` reads a budget; its errors name host_budget.

    Example:
        >>> parse_host_budget("16GiB")
        17179869184
        >>> parse_host_budget("lots")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        memlab.errors.MemlabError: host_budget 'lots' is not understood; write ... such as 8GiB, 500MB, 1.5G
    """
    try:
        return parse_budget(host_budget)
    except MemlabError as error:
        raise MemlabError(str(error).replace("budget", "host_budget")) from None


def check_learning_rate(lr: Any) -> float:
    """``lr`` itself when it is a positive number; a clear error otherwise.

    Example:
        >>> check_learning_rate("fast")
        Traceback (most recent call last):
        ...
        memlab.errors.MemlabError: lr='fast' is not allowed; write a positive learning rate such as lr=1e-5
    """
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not 0 < lr < float("inf"):
        raise MemlabError(f"lr={lr!r} is not allowed; write a positive learning rate such as lr=1e-5")
    return float(lr)


def _check_count(name: str, value: Any, *, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise MemlabError(f"{name}={value!r} is not allowed; write a whole number >= {minimum}")
