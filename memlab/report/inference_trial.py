"""An inference plan's trial as data: :class:`InferenceTrial`, a :class:`~memlab.report.data.Trial` whose breakdown
is by :data:`INFERENCE_CATEGORIES`, with prefill and decode speeds and the KV cache.

Its dict says ``"mode": "inference"``, so :meth:`Trial.from_dict <memlab.report.data.Trial.from_dict>` (and a
Report read back from JSON) makes an InferenceTrial of it again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from memlab.measure.tracker import INFERENCE_CATEGORIES
from memlab.plan import INFERENCE_FIELDS, PLAN_FIELDS, InferencePlan
from memlab.report.data import Trial

__all__ = ["INFERENCE_CATEGORIES", "InferenceTrial"]


@dataclass
class InferenceTrial(Trial):
    """The result of running one :class:`memlab.InferencePlan`: a :class:`Trial` whose breakdown is by
    :data:`INFERENCE_CATEGORIES` (params, activations, kv_cache, other), with the speed of generation apart.

    ``step_time_s`` is the median seconds of one step: the forward (``new_tokens=0``), or the whole generation
    (prefill and every decode step); ``samples_per_s`` is rows (sequences) per second; ``tokens_per_s`` is prompt
    tokens per second for one forward, new tokens per second for a generation.

    Besides the fields of :class:`Trial`:

    Args:
        prefill_tokens_per_s: prompt tokens per second of the prefill forward (median), when generating.
        decode_tokens_per_s: new tokens per second of the decode steps (median over steps), when generating more
            than one token.
        kv_cache_end_bytes: bytes of the KV cache at the end of the step, read from the cache's own tensors (0 without
            one); ``breakdown["kv_cache"]`` is its part of the peak.
        context_tokens: tokens per row the KV cache holds at the end (prompt + new_tokens - 1 when generating).

    Example:
        >>> from memlab.plan import InferencePlan
        >>> t = InferenceTrial(InferencePlan(weights="bf16"), "ok", 300, {"params": 100, "kv_cache": 50}, 0.1, 40.0,
        ...                    640.0, "cpu", kv_cache_end_bytes=50, context_tokens=16)
        >>> t.label, t.breakdown
        ('bf16', {'params': 100, 'activations': 0, 'kv_cache': 50, 'other': 150})
        >>> InferenceTrial.from_dict(t.to_dict()) == t
        True
    """

    prefill_tokens_per_s: float | None = None
    decode_tokens_per_s: float | None = None
    kv_cache_end_bytes: int = 0
    context_tokens: int | None = None

    categories: ClassVar[tuple[str, ...]] = INFERENCE_CATEGORIES
    mode: ClassVar[str | None] = "inference"

    def _plan_values(self) -> dict[str, Any]:
        values: dict[str, Any] = {"mode": self.mode}
        values.update({name: getattr(self.plan, name) for name in INFERENCE_FIELDS})
        values.update(
            prefill_tokens_per_s=self.prefill_tokens_per_s,
            decode_tokens_per_s=self.decode_tokens_per_s,
            kv_cache_end_bytes=self.kv_cache_end_bytes,
            context_tokens=self.context_tokens,
        )
        return values

    @classmethod
    def _keywords(cls, data: Mapping[str, Any]) -> dict[str, Any]:
        keywords = super()._keywords({key: value for key, value in data.items() if key not in PLAN_FIELDS})
        keywords["plan"] = InferencePlan(**{name: data[name] for name in INFERENCE_FIELDS if name in data})
        keywords.update(
            prefill_tokens_per_s=data.get("prefill_tokens_per_s"),
            decode_tokens_per_s=data.get("decode_tokens_per_s"),
            kv_cache_end_bytes=int(data.get("kv_cache_end_bytes") or 0),
            context_tokens=data.get("context_tokens"),
        )
        return keywords

