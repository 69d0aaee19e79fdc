"""The facts of sharded training that exports and front ends share, without torch: the strategies, how many GPUs,
DeepSpeed's bucket sizes and persistence threshold (:class:`ZeroSettings`, its defaults or a user's config read), and
whether the installed accelerate has the engine a trainer is set up for (:func:`check_accelerate`).

This module imports nothing heavy (only :mod:`memlab.errors`), so that :mod:`memlab.export.accelerate` and the
command line can check ``gpus=``/``strategy=`` without the dry-run machinery of
:mod:`memlab.estimation.sharded.per_gpu`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from memlab.errors import MemlabError

__all__ = [
    "DS_ALLGATHER_BUCKET",
    "DS_PERSISTENCE_THRESHOLD",
    "DS_PREFETCH_BUCKET",
    "DS_REDUCE_BUCKET",
    "ENGINE_NAMES",
    "STRATEGIES",
    "ZeroSettings",
    "check_accelerate",
    "check_sharding",
    "hidden_size_of",
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


DS_PERSISTENCE_THRESHOLD = 100_000
"""``stage3_param_persistence_threshold``: ZeRO-3 keeps a parameter of at most this many elements whole on every
rank."""


@dataclass(frozen=True)
class ZeroSettings:
    """The DeepSpeed settings a ZeRO estimate sizes its buffers by, in elements, named as DeepSpeed's config names
    them: DeepSpeed's defaults (``deepspeed/runtime/zero/config.py``), or a user's config read
    (:meth:`from_config`); ``origins`` says where each value read came from (a key it does not name is DeepSpeed's
    default, or given where it differs from it).

    Example:
        >>> ZeroSettings().reduce_bucket(3, 1000), ZeroSettings().reduce_bucket(2, 1000)
        (500000000, 1000)
        >>> ZeroSettings.from_config({"reduce_bucket_size": 2e8}).describe(2)
        "reduce_bucket_size 2e8 (the config's), allgather_bucket_size 5e8 (DeepSpeed's default)"
    """

    reduce_bucket_size: int = DS_REDUCE_BUCKET
    allgather_bucket_size: int = DS_ALLGATHER_BUCKET
    stage3_prefetch_bucket_size: int = DS_PREFETCH_BUCKET
    stage3_param_persistence_threshold: int = DS_PERSISTENCE_THRESHOLD
    origins: tuple[tuple[str, str], ...] = ()

    @classmethod
    def from_config(cls, section: Mapping[str, Any], *, hidden_size: int | None = None,
                    stage: int = 3) -> ZeroSettings:
        """The settings of a DeepSpeed config's ``zero_optimization`` section at ZeRO ``stage``: a number as given,
        ``"auto"`` as transformers' ``trainer_config_finalize`` fills it from the model's ``hidden_size``
        (``reduce_bucket_size`` hidden_size², and under ZeRO-3 ``stage3_prefetch_bucket_size`` 0.9 x hidden_size²,
        ``stage3_param_persistence_threshold`` 10 x hidden_size), a key it leaves out DeepSpeed's default.

        Raises:
            MemlabError: a value that is no number of elements, or an ``"auto"`` transformers would not fill (no
                hidden size, or a key it never fills); each says what to write.

        Example:
            >>> read = ZeroSettings.from_config({"reduce_bucket_size": "auto",
            ...                                  "stage3_param_persistence_threshold": "auto"}, hidden_size=64)
            >>> read.reduce_bucket_size, read.stage3_param_persistence_threshold, read.stage3_prefetch_bucket_size
            (4096, 640, 50000000)
        """
        auto = {"reduce_bucket_size": ("hidden_size²", lambda h: h * h)}
        if stage == 3:
            auto.update(stage3_prefetch_bucket_size=("0.9 x hidden_size²", lambda h: int(0.9 * h * h)),
                        stage3_param_persistence_threshold=("10 x hidden_size", lambda h: 10 * h))
        used = ("reduce_bucket_size", "allgather_bucket_size") if stage == 2 else (
            "reduce_bucket_size", "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold")
        values: dict[str, int] = {}
        origins: list[tuple[str, str]] = []
        for key in used:
            if key not in section:
                continue
            value = section[key]
            if value == "auto":
                if key not in auto:
                    raise MemlabError(f'the DeepSpeed config\'s {key} is "auto", which transformers does not fill '
                                      "(DeepSpeed then refuses it); write a number of elements, such as "
                                      f"{key}: {_elements(getattr(cls(), key))} (DeepSpeed's default)")
                if hidden_size is None:
                    raise MemlabError(f'the DeepSpeed config\'s {key} is "auto", which transformers fills from the '
                                      "model config's hidden_size, and this model's config has none; write a number "
                                      f"of elements, such as {key}: {_elements(getattr(cls(), key))}")
                words, fill = auto[key]
                values[key] = fill(hidden_size)
                origins.append((key, f'the config\'s "auto": {words}, hidden_size {hidden_size}'))
                continue
            values[key] = _count(key, value)
            origins.append((key, "the config's"))
        return cls(**values, origins=tuple(origins))

    def reduce_bucket(self, stage: int, trained: int) -> int:
        """Elements of the gradient reduce bucket DeepSpeed holds at ZeRO ``stage`` with ``trained`` parameters:
        ZeRO-3 allocates it whole however few are trained (``stage3.py``: ``torch.empty(reduce_bucket_size)`` where
        ``contiguous_gradients``, its default), ZeRO-2 is counted at most the trained parameters.

        Example:
            >>> ZeroSettings(reduce_bucket_size=10).reduce_bucket(3, 4), ZeroSettings().reduce_bucket(2, 4)
            (10, 4)
        """
        return self.reduce_bucket_size if stage == 3 else min(self.reduce_bucket_size, trained)

    def gather_bucket(self, stage: int, parameters: int) -> int:
        """Elements of the parameters' gather bucket at ZeRO ``stage``, at most the model's ``parameters``:
        ``allgather_bucket_size`` at ZeRO-2, ``stage3_prefetch_bucket_size`` at ZeRO-3.

        Example:
            >>> ZeroSettings().gather_bucket(3, 10**9), ZeroSettings().gather_bucket(2, 1000)
            (50000000, 1000)
        """
        bucket = self.allgather_bucket_size if stage == 2 else self.stage3_prefetch_bucket_size
        return min(bucket, parameters)

    def describe(self, stage: int) -> str:
        """The settings ZeRO ``stage`` uses, each with where it came from.

        Example:
            >>> ZeroSettings().describe(3)
            "reduce_bucket_size 5e8, stage3_prefetch_bucket_size 5e7, stage3_param_persistence_threshold 1e5 \
(DeepSpeed's defaults)"
        """
        keys = ("reduce_bucket_size", "allgather_bucket_size") if stage == 2 else (
            "reduce_bucket_size", "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold")
        default = ZeroSettings()
        origins = {key: dict(self.origins).get(key) or (
            _DEFAULT if getattr(self, key) == getattr(default, key) else "given") for key in keys}
        if all(origin == _DEFAULT for origin in origins.values()):
            return ", ".join(f"{key} {_elements(getattr(self, key))}" for key in keys) + " (DeepSpeed's defaults)"
        return ", ".join(f"{key} {_elements(getattr(self, key))} ({origins[key]})" for key in keys)

    def replace(self, **changes: Any) -> ZeroSettings:
        """The same settings with ``changes`` (field names as keywords)."""
        return dataclasses.replace(self, **changes)


_DEFAULT = "DeepSpeed's default"


def _count(key: str, value: Any) -> int:
    """A DeepSpeed config's number of elements (``5e8``, ``200000000``), or a MemlabError saying what to write."""
    number: float | None = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(int(value.strip()))
        except ValueError:
            number = None
    if number is None or not math.isfinite(number) or number < 0 or number != int(number):
        raise MemlabError(f"the DeepSpeed config's {key} is {value!r}, which is not a number of elements; write a "
                          f'whole number >= 0 such as {key}: 5e8, or "auto"')
    return int(number)


def _elements(count: int) -> str:
    """A number of elements as DeepSpeed's docs write it: ``5e8`` where it is a digit times a power of ten.

    Example:
        >>> _elements(500_000_000), _elements(58982), _elements(100)
        ('5e8', '58,982', '100')
    """
    text = str(count)
    zeros = len(text) - len(text.rstrip("0"))
    if count >= 10_000 and len(text) - zeros == 1:
        return f"{text[0]}e{zeros}"
    return f"{count:,}"


def hidden_size_of(config: Any) -> int | None:
    """A model config's hidden size as transformers' DeepSpeed integration reads it to fill ``"auto"``: its
    ``hidden_size``, the largest of its ``hidden_sizes``, or its ``text_config``'s; None where it has none.

    Example:
        >>> from types import SimpleNamespace
        >>> hidden_size_of(SimpleNamespace(hidden_sizes=[64, 128])), hidden_size_of(SimpleNamespace())
        (128, None)
    """
    for holder in (config, getattr(config, "text_config", None)):
        if holder is None:
            continue
        if isinstance(getattr(holder, "hidden_size", None), int):
            return int(holder.hidden_size)
        sizes = getattr(holder, "hidden_sizes", None)
        if sizes:
            return int(max(sizes))
    return None


def check_accelerate(strategy: str, said: str) -> None:
    """A MemlabError where the installed accelerate lacks the engine ``strategy`` runs on (``said``: how the user
    set it up, for the message): FSDP2 is accelerate's ``fsdp2_prepare_model``, which releases before it have not.
    The capability itself is asked (the import), not a version number.

    Example:
        >>> check_accelerate("fsdp2", "this trainer's FSDP2 (fsdp=True)")  # accelerate 1.15 has it
    """
    if strategy != "fsdp2":
        return
    try:
        from accelerate.utils.fsdp_utils import fsdp2_prepare_model  # noqa: F401 - the capability itself
    except ImportError:
        from importlib.metadata import PackageNotFoundError, version

        try:
            installed = f"the installed accelerate {version('accelerate')} has none"
        except PackageNotFoundError:
            installed = "accelerate is not installed"
        raise MemlabError(f"{said} runs on accelerate's FSDP2 (accelerate.utils.fsdp_utils.fsdp2_prepare_model), and "
                          f"{installed}; write pip install -U accelerate (memlab is tested with accelerate 1.15), or "
                          "set the trainer up for FSDP1: fsdp_config={'version': 1}") from None


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
