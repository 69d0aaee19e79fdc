"""The facts of sharded training that exports and front ends share, without torch: the strategies, how many GPUs,
and DeepSpeed's bucket sizes.

This module imports nothing heavy (only :mod:`memlab.errors`), so that :mod:`memlab.export.accelerate` and the
command line can check ``gpus=``/``strategy=`` without the dry-run machinery of
:mod:`memlab.estimation.sharded.per_gpu`.
"""

from __future__ import annotations

from typing import Any

from memlab.errors import MemlabError

__all__ = [
    "DS_ALLGATHER_BUCKET",
    "DS_PREFETCH_BUCKET",
    "DS_REDUCE_BUCKET",
    "ENGINE_NAMES",
    "STRATEGIES",
    "check_sharding",
    "ds_reduce_bucket",
    "parse_gpus",
    "whole_shape",
]

STRATEGIES = ("none", "fsdp1", "fsdp2", "zero2", "zero3")
"""How training is spread over GPUs: ``"none"`` (one GPU), FSDP1 (accelerate's ``fsdp_version: 1``), FSDP2,
DeepSpeed ZeRO stage 2 or 3."""

ENGINE_NAMES = {"fsdp2": "FSDP2", "fsdp1": "FSDP1", "zero2": "ZeRO-2", "zero3": "ZeRO-3"}
"""Each sharding strategy as its engine names it."""

# DeepSpeed's defaults (deepspeed/runtime/zero/config.py), in elements.
DS_REDUCE_BUCKET = 500_000_000
"""``reduce_bucket_size``: elements of the gradient reduce bucket."""
DS_ALLGATHER_BUCKET = 500_000_000
"""``allgather_bucket_size``: elements of ZeRO-2's parameter all-gather bucket."""
DS_PREFETCH_BUCKET = 50_000_000
"""``stage3_prefetch_bucket_size``: elements of ZeRO-3's parameter prefetch bucket."""


def ds_reduce_bucket(stage: int, trained: int) -> int:
    """Elements of the gradient reduce bucket DeepSpeed holds at ZeRO ``stage`` with ``trained`` parameters: ZeRO-3
    allocates it whole however few are trained (``stage3.py``: ``torch.empty(reduce_bucket_size)`` where
    ``contiguous_gradients``, its default), ZeRO-2 is counted at most the trained parameters.

    Example:
        >>> ds_reduce_bucket(3, 1000), ds_reduce_bucket(2, 1000)
        (500000000, 1000)
    """
    return DS_REDUCE_BUCKET if stage == 3 else min(DS_REDUCE_BUCKET, trained)


def check_sharding(gpus: Any, strategy: Any) -> tuple[int, str]:
    """``(gpus, strategy)`` checked: a MemlabError saying what to write when they do not go together.

    Example:
        >>> check_sharding(8, "FSDP2")
        (8, 'fsdp2')
        >>> check_sharding(8, "none")
        Traceback (most recent call last):
        ...
        memlab.errors.MemlabError: gpus=8 needs a strategy; write strategy="fsdp2", "zero2" or "zero3"
    """
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
        raise MemlabError(f"gpus={gpus!r} is not a number of GPUs; write an int >= 1, such as gpus=8")
    name = str(strategy).lower() if isinstance(strategy, str) else strategy
    if name not in STRATEGIES:
        raise MemlabError(f"strategy={strategy!r} is unknown; write one of {', '.join(map(repr, STRATEGIES))}")
    if gpus > 1 and name == "none":
        raise MemlabError(f'gpus={gpus} needs a strategy; write strategy="fsdp2", "zero2" or "zero3"')
    return gpus, name


def parse_gpus(value: Any) -> int | str:
    """A number of GPUs as a front end reads it: an int >= 1, or ``"auto"`` (the smallest number that fits a budget,
    which ``auto`` needs).

    Example:
        >>> parse_gpus("8"), parse_gpus(" AUTO "), parse_gpus(2)
        (8, 'auto', 2)
        >>> parse_gpus("eight")
        Traceback (most recent call last):
        ...
        memlab.errors.MemlabError: gpus='eight' is not a number of GPUs; write an int >= 1 such as 8, or auto
    """
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    try:
        number = int(value) if not isinstance(value, bool) else 0
    except (TypeError, ValueError):
        number = 0
    if number < 1 or (isinstance(value, float) and value != number):
        raise MemlabError(f"gpus={value!r} is not a number of GPUs; write an int >= 1 such as 8, or auto")
    return number


def whole_shape(tensor: Any) -> tuple[int, ...]:
    """A tensor's shape; a ZeRO-3 partitioned parameter's whole shape (DeepSpeed's ``ds_shape``: outside a gather
    its data is empty on every rank, as ``deepspeed.zero.Init``, and transformers' ``from_pretrained`` under a
    ZeRO-3 config, leave it before training).

    Example:
        >>> from types import SimpleNamespace
        >>> whole_shape(SimpleNamespace(shape=(0,), ds_shape=(1024, 128))), whole_shape(SimpleNamespace(shape=(4, 2)))
        ((1024, 128), (4, 2))
    """
    shape = getattr(tensor, "ds_shape", None)
    return tuple(shape) if shape is not None else tuple(tensor.shape)
