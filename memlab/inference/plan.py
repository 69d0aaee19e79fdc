"""InferencePlan: one serving / evaluation setting (weights' dtype, quantization, batch size, generation, KV cache),
and the parsing of ``--try`` grids over it.

It is the inference twin of :class:`memlab.Plan`: ``memlab.measure``, ``memlab.compare`` and ``memlab.estimate``
take either, and run a training step for a Plan, a forward (or a generation) under ``torch.inference_mode()`` for an
InferencePlan (see :mod:`memlab.inference`).

Example:
    >>> InferencePlan(weights="bf16", batch_size=8, new_tokens=16).label()
    'bf16 bs8 gen16'
    >>> [p.label() for p in parse_inference_grid(["quantize=none,nf4", "kv_cache=on,off"], InferencePlan(new_tokens=4))]
    ['fp32 gen4', 'fp32 gen4 no-kv', 'nf4 gen4', 'nf4 gen4 no-kv']
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields, replace
from typing import Any, ClassVar

from memlab.errors import MemlabError, unknown_name
from memlab.measure.tracker import INFERENCE_CATEGORIES
from memlab.plan import LeverSpec, check_levers, field_signature, grid_of, lever, lever_specs, parse_lever_axes

__all__ = [
    "INFERENCE_FIELDS",
    "INFERENCE_LEVERS",
    "QUANTIZATIONS",
    "WEIGHT_DTYPES",
    "InferencePlan",
    "parse_inference_axes",
    "parse_inference_grid",
]

WEIGHT_DTYPES = ("fp32", "bf16", "fp16")
QUANTIZATIONS = ("none", "int8", "nf4")


@dataclass(frozen=True)
class InferencePlan:
    """One inference setting, measured under ``torch.inference_mode()``.

    Args:
        batch_size: rows (sequences) per forward; ``None`` means the rows of the batch given. More rows than the
            batch has repeat its rows, fewer take the first ones.
        weights: ``"fp32"``, ``"bf16"`` or ``"fp16"``: the dtype the model's floating-point weights and buffers are
            held in (and compute in) while the plan runs; the originals come back bit-exact.
        quantize: ``"none"``, ``"int8"`` (bitsandbytes ``Linear8bitLt``, LLM.int8() without outliers) or ``"nf4"``
            (bitsandbytes ``Linear4bit``, 4-bit NormalFloat with double-quantized scales): the linear layers'
            weights, the output head excepted, are held quantized and computed in ``weights``' dtype.
        new_tokens: 0: one forward over the batch (prefill / evaluation). N > 0: greedy generation of N new tokens
            for a causal LM: one prefill forward, then N - 1 decode forwards, as ``generate`` runs them.
        kv_cache: keep the keys and values of past tokens (transformers' ``DynamicCache``) so that a decode step
            runs on the new token only; off, every step runs the whole sequence again. With ``new_tokens=0`` it
            says whether the forward builds the cache of the prompt (what a prefill does). Only causal LMs have
            one; for other models it changes nothing.

    Example:
        >>> InferencePlan().label(), InferencePlan(quantize="nf4", weights="bf16").label()
        ('fp32', 'nf4 bf16')
        >>> InferencePlan(quantize="int4")
        Traceback (most recent call last):
        ...
        memlab.errors.MemlabError: quantize='int4' is not known; write one of none, int8, nf4
    """

    batch_size: int | None = lever(None, help="rows (sequences) per forward; None: the rows of the batch")
    weights: str = lever(
        "fp32", help="dtype of the weights: bf16/fp16 halve the parameter bytes (and speed up GPUs)",
        choices=WEIGHT_DTYPES,
    )
    quantize: str = lever(
        "none",
        help="linear weights in 8-bit (int8) or 4-bit NF4 (bitsandbytes): a quarter / an eighth of fp32's bytes, "
        "some accuracy and (on CPU) speed",
        choices=QUANTIZATIONS,
    )
    new_tokens: int = lever(0, help="tokens to generate (0: one forward): the KV cache grows with every one")
    kv_cache: bool = lever(True, help="keep past keys/values: faster decoding, at 2 x layers x kv-heads x head-dim "
                                      "bytes per token and row")

    memory_categories: ClassVar[tuple[str, ...]] = INFERENCE_CATEGORIES
    """The categories of this plan's breakdown (a training Plan's are :data:`memlab.report.CATEGORIES`)."""

    def __new__(cls, *args: Any, **kwargs: Any) -> InferencePlan:
        unknown = [key for key in kwargs if key not in INFERENCE_FIELDS]
        if unknown:
            raise unknown_name(unknown[0], INFERENCE_FIELDS, "an inference setting", LISTED)
        if len(args) > len(INFERENCE_FIELDS):
            raise MemlabError(
                f"an InferencePlan takes at most {len(INFERENCE_FIELDS)} settings; name them, e.g. "
                "InferencePlan(batch_size=8)"
            )
        return super().__new__(cls)

    def __post_init__(self) -> None:
        check_levers(self, INFERENCE_LEVERS)

    @property
    def generates(self) -> bool:
        """True when the plan generates tokens (``new_tokens > 0``)."""
        return self.new_tokens > 0

    def rows(self, batch_rows: int) -> int:
        """Rows one step runs: ``batch_size``, or the batch's rows.

        Example:
            >>> InferencePlan().rows(4), InferencePlan(batch_size=16).rows(4)
            (4, 16)
        """
        return self.batch_size or batch_rows

    def rows_per_step(self, batch_rows: int) -> int:
        """The same as :meth:`rows` (the name a training :class:`memlab.Plan` uses).

        Example:
            >>> InferencePlan(batch_size=16).rows_per_step(4)
            16
        """
        return self.rows(batch_rows)

    def label(self) -> str:
        """A short name for tables and plots: the weights' form always, then what differs from one forward.

        Example:
            >>> InferencePlan(weights="fp16", quantize="int8", new_tokens=8, kv_cache=False).label()
            'int8 fp16 gen8 no-kv'
        """
        parts = [self.weights] if self.quantize == "none" else [self.quantize]
        if self.quantize != "none" and self.weights != "fp32":
            parts.append(self.weights)
        if self.batch_size is not None:
            parts.append(f"bs{self.batch_size}")
        if self.new_tokens:
            parts.append(f"gen{self.new_tokens}")
        if not self.kv_cache:
            parts.append("no-kv")
        return " ".join(parts)

    def describe(self) -> str:
        """The label spelled out, for a figure's hover and key.

        Example:
            >>> InferencePlan(quantize="nf4", batch_size=4, new_tokens=16).describe()
            'inference: nf4 weights computing in fp32, batch 4, 16 new tokens with KV cache'
        """
        weights = f"{self.weights} weights" if self.quantize == "none" else (
            f"{self.quantize} weights computing in {self.weights}"
        )
        parts = [weights]
        if self.batch_size is not None:
            parts.append(f"batch {self.batch_size}")
        cache = "with KV cache" if self.kv_cache else "without KV cache"
        parts.append(f"{self.new_tokens} new tokens {cache}" if self.new_tokens else f"one forward {cache}")
        return "inference: " + ", ".join(parts)

    def replace(self, **changes: Any) -> InferencePlan:
        """A copy with some fields changed (validated like a new plan).

        Example:
            >>> InferencePlan(weights="bf16").replace(new_tokens=8).label()
            'bf16 gen8'
        """
        return replace(self, **changes)


INFERENCE_FIELDS = tuple(f.name for f in fields(InferencePlan))
field_signature(InferencePlan)  # the API page and help() show its fields, not (*args, **kwargs)
"""The settings of an :class:`InferencePlan`, in order."""

INFERENCE_LEVERS: dict[str, LeverSpec] = lever_specs(InferencePlan)
"""Each setting's :class:`memlab.plan.LeverSpec` (default, help line, allowed values: for the magic's help and the
panel), the same machinery as a training Plan's :data:`memlab.plan.LEVERS`.

Example:
    >>> INFERENCE_LEVERS["quantize"]["choices"], INFERENCE_LEVERS["kv_cache"].type
    (('none', 'int8', 'nf4'), 'bool')
"""


LISTED = "memlab.inference.plan.INFERENCE_LEVERS"
"""Where every inference setting is listed, with its values (:func:`memlab.errors.unknown_name`)."""


def parse_inference_axes(items: str | Iterable[str] | Mapping[str, Any]) -> dict[str, list[Any]]:
    """``KEY=V1,V2`` items (or a mapping of setting to values) as ``{setting: [values]}``, values parsed.

    Example:
        >>> parse_inference_axes(["weights=fp32,bf16", "kv_cache=on,off", "batch_size=all,8"])
        {'weights': ['fp32', 'bf16'], 'kv_cache': [True, False], 'batch_size': [None, 8]}
        >>> parse_inference_axes(["precision=bf16"])
        Traceback (most recent call last):
        ...
        memlab.errors.MemlabError: 'precision' is not an inference setting; write one of batch_size, weights, \
quantize, new_tokens, kv_cache
    """
    return parse_lever_axes(items, INFERENCE_LEVERS, what="an inference setting", example="weights=fp32,bf16",
                            listed=LISTED)


def parse_inference_grid(
    items: str | Iterable[str] | Mapping[str, Any], base: InferencePlan | None = None
) -> list[InferencePlan]:
    """InferencePlans for every combination of ``KEY=V1,V2`` items, in the given order (duplicates once).

    Example:
        >>> [p.label() for p in parse_inference_grid("weights=fp32,bf16 batch_size=1,4")]
        ['fp32 bs1', 'fp32 bs4', 'bf16 bs1', 'bf16 bs4']
    """
    return grid_of(base or InferencePlan(), parse_inference_axes(items))
