"""What :func:`memlab.limits` varies on a GRPOTrainer (its :class:`~memlab.live.trainer_kinds.Sizes`): the longest
``max_completion_length`` (``vary="tokens"``: every completion full length, the longest prompts kept) or the most
generations per device (``vary="rows"``: ``per_device_train_batch_size``, with ``gradient_accumulation_steps`` and
``steps_per_generation`` kept; the generation batch follows, ``per_device_train_batch_size x steps_per_generation``
completions, a multiple of ``num_generations`` as TRL requires, so the sizes are multiples of
``num_generations / gcd(num_generations, steps_per_generation)``). Each size is set on the trainer only while its
estimate runs (:func:`sized`).

Example:
    >>> rows_multiple(num_generations=4, steps_per_generation=2)
    2
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Iterator
from typing import Any

from memlab.live.patching import patched
from memlab.live.trainer_kinds import KindSizes

__all__ = ["grpo_sizes", "rows_multiple", "sized"]

UNITS = {"tokens": "completion tokens", "rows": "generations per device"}
"""What a size is on a GRPOTrainer, as the answer says it."""


def rows_multiple(num_generations: int, steps_per_generation: int) -> int:
    """The smallest step of generations per device that keeps TRL's generation batch (``generations x
    steps_per_generation``) a multiple of ``num_generations`` (whole prompts).

    Example:
        >>> rows_multiple(num_generations=8, steps_per_generation=1), rows_multiple(3, 3)
        (8, 1)
    """
    return num_generations // math.gcd(num_generations, steps_per_generation)


@contextlib.contextmanager
def sized(trainer: Any, vary: str, size: int) -> Iterator[None]:
    """The GRPOTrainer with ``size`` completion tokens (``vary="tokens"``) or generations per device (``"rows"``) while
    an estimate runs; every attribute put back after (a config is no dict key: each owner is kept with its fields).

    Example:
        >>> from types import SimpleNamespace
        >>> args = SimpleNamespace(max_completion_length=8)
        >>> trainer = SimpleNamespace(args=args, max_completion_length=8)
        >>> with sized(trainer, "tokens", 16):
        ...     trainer.max_completion_length, args.max_completion_length
        (16, 16)
        >>> trainer.max_completion_length
        8
    """
    args = trainer.args
    if vary == "tokens":
        on_trainer, on_args = {"max_completion_length": size}, {"max_completion_length": size}
    else:
        on_args = {"per_device_train_batch_size": size}
        if getattr(args, "generation_batch_size", None) is not None:  # the generation batch follows
            on_args["generation_batch_size"] = size * max(int(args.steps_per_generation), 1)
        on_trainer = {"_train_batch_size": size} if "_train_batch_size" in vars(trainer) else {}
    with patched(trainer, **on_trainer), patched(args, **on_args):
        yield


def grpo_sizes(trainer: Any, vary: str) -> KindSizes:
    """A GRPOTrainer's sizes for ``limits``: its completions' length (any number of tokens) or its generations per
    device (multiples of :func:`rows_multiple`)."""
    if vary == "tokens":
        current, multiple = int(trainer.max_completion_length), 1
    else:
        current = int(trainer.args.per_device_train_batch_size)
        multiple = rows_multiple(int(trainer.num_generations), max(int(trainer.args.steps_per_generation), 1))
    why = f" (whole prompts of num_generations={trainer.num_generations} in each generation batch)"
    return KindSizes(current, multiple, UNITS[vary], functools.partial(sized, trainer, vary), why)
