"""The memory model of the search: a plan's peak predicted from the breakdowns measured so far.

``peak = params + other + optimizer + grads + activations``, each part from the measured breakdowns: optimizer
bytes per optimizer (unmeasured: 8-bit AdamW a quarter of AdamW's; Adafactor, whose factored state is a row and a
column per matrix, and paged 8-bit AdamW, whose state lives outside PyTorch's allocator on CUDA, none), gradients
held at the peak (with accumulation, all of them), and activations as a line ``intercept + per_row * micro_batch``
per :data:`ActivationKey` (checkpointing, precision, activation offload, weights, adapter, loss). A line needs two
micro-batch sizes; from one size it leans low (proportional below it, flat above unless an out-of-memory trial
showed more); for a combination never measured, per-row bytes are a
neighbour's times the ratio each technique was measured to have, and 0 while a ratio is unknown (an unmeasured
technique might save everything).

Dry-run estimates (:func:`memlab.estimation.estimate.estimate_plans`) feed the same parts as a second source: a part (a
family's parameters, an optimizer's state, an activation line) measured by a trial comes from the trials, and one
no trial measured from the estimates, so that one estimate rules a part in or out for every plan that shares it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from memlab.plan import PLAN_FIELDS, Plan
from memlab.report import Trial
from memlab.search.space import micro_batch_of
from memlab.techniques.core.registry import REGISTRY, least_share

FIT_MARGIN = 1.1
"""A plan is skipped for memory only when its predicted peak is over ``budget * FIT_MARGIN``."""


ActivationKey = tuple[Any, ...]
"""What activations per row depend on: the value of each lever the registry gives an ``activation_key``
(checkpointing, precision, weights, activations offloaded, adapter, loss)."""

Family = tuple[Any, ...]
"""What decides the model's own bytes: the levers the registry marks ``family`` (weights, adapter, LoRA rank...).
Trials of one family say nothing certain of another's parameter, gradient and optimizer bytes."""

_FAMILY = tuple(name for name in PLAN_FIELDS if REGISTRY[name].family)
_ACTIVATIONS = tuple(
    (name, key) for name in PLAN_FIELDS if (key := REGISTRY[name].activation_key) is not None
)
# A neighbour's activation intercept is borrowed only from a line of the same precision and activation offload.
_SAME_INTERCEPT = tuple(i for i, (name, _) in enumerate(_ACTIVATIONS) if name in ("precision", "offload"))


def family(plan: Plan) -> Family:
    """The plan's :data:`Family`.

    Example:
        >>> family(Plan(adapter="lora", lora_rank=8, checkpointing=True))[:3]  # weights, adapter, rank, ...
        ('fp32', 'lora', 8)
    """
    return tuple(getattr(plan, name) for name in _FAMILY)


def activation_key(plan: Plan) -> ActivationKey:
    """What the plan's activations per row depend on (:data:`ActivationKey`).

    Example:
        >>> key = activation_key(Plan(checkpointing=True, loss="chunked"))
        >>> key == activation_key(Plan(checkpointing=True, loss="chunked", optimizer="adamw8bit"))  # no activations
        True
        >>> key == activation_key(Plan(loss="chunked"))
        False
    """
    return tuple(key(getattr(plan, name)) for name, key in _ACTIVATIONS)


@dataclass(frozen=True)
class Line:
    """Activation bytes as ``intercept + per_row * micro_batch`` up to ``known_up_to`` rows; beyond it, growing by
    ``per_row_above`` per row (what a single measured size can say safely about larger micro-batches).

    Example:
        >>> line = Line(10.0, 100.0, known_up_to=2, per_row_above=50.0)
        >>> line.at(1), line.at(2), line.at(4)
        (110.0, 210.0, 310.0)
    """

    intercept: float
    per_row: float
    known_up_to: float = math.inf
    per_row_above: float = 0.0

    def at(self, micro_batch: int) -> float:
        if micro_batch <= self.known_up_to:
            return self.intercept + self.per_row * micro_batch
        known = self.intercept + self.per_row * self.known_up_to
        return known + self.per_row_above * (micro_batch - self.known_up_to)


def fit_line(points: Sequence[tuple[int, float]]) -> Line:
    """The least-squares line through ``(micro_batch, bytes)`` points, kept non-negative (2+ sizes needed).

    Example:
        >>> fit_line([(1, 150.0), (8, 1200.0)])
        Line(intercept=0.0, per_row=150.0, known_up_to=inf, per_row_above=0.0)
    """
    xs = [float(x) for x, _ in points]
    ys = [float(y) for _, y in points]
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    spread = sum((x - mean_x) ** 2 for x in xs)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / spread if spread else 0.0
    if slope < 0:
        return Line(mean_y, 0.0)
    intercept = mean_y - slope * mean_x
    if intercept < 0:
        return Line(0.0, sum(x * y for x, y in zip(xs, ys, strict=True)) / sum(x * x for x in xs))
    return Line(intercept, slope)


def one_point_line(
    size: int, value: float, *, intercept: float = 0.0, at_least: Sequence[tuple[int, float]] = ()
) -> Line:
    """Activations known at one micro-batch size: below it, ``intercept`` (a neighbour's, else 0) plus bytes in
    proportion to rows; above it, at least what larger plans were seen to reach before running out of memory
    (``at_least``: ``(micro_batch, bytes)`` lower bounds), else flat. Both sides lean low, so that a plan is
    never skipped for memory on a guess.

    Example:
        >>> line = one_point_line(2, 200.0, at_least=[(8, 800.0)])
        >>> line.at(1), line.at(2), line.at(8)
        (100.0, 200.0, 800.0)
    """
    intercept = min(max(intercept, 0.0), value)
    above = [(bound - value) / (rows - size) for rows, bound in at_least if rows > size]
    return Line(intercept, (value - intercept) / size, known_up_to=size, per_row_above=max([0.0, *above]))


class MemoryModel:
    """Predicts a plan's peak bytes from measured trials (see the module docstring for the model).

    Trials that ran (``"ok"``) give the parts of the peak; a trial that ran out of memory says its activations were
    at least its peak reached minus the fixed parts. Where nothing was measured it assumes the least a plan can
    need: AdamW keeps two moments per trainable byte, 8-bit AdamW a quarter of that, accumulation holds every
    gradient, and an unmeasured technique's activations are 0.

    Example:
        >>> def ran(plan, activations):
        ...     parts = {"params": 100, "grads": 100, "optimizer": 200, "activations": activations}
        ...     return Trial(plan, "ok", sum(parts.values()), parts, 1.0, 8.0, None, "cpu")
        >>> model = MemoryModel([ran(Plan(micro_batch=1, accumulation=8), 110),
        ...                      ran(Plan(micro_batch=4, accumulation=2), 410)], trainable_bytes=100, batch_size=8)
        >>> model.predict(Plan(micro_batch=2, accumulation=4))
        610.0
        >>> model.predict(Plan(micro_batch=2, accumulation=4, optimizer="adamw8bit"))
        460.0
    """

    def __init__(
        self, trials: Sequence[Trial], *, trainable_bytes: int, batch_size: int, estimates: Sequence[Trial] = ()
    ) -> None:
        self.trainable_bytes = float(trainable_bytes)
        self.batch_size = batch_size
        ran = [t for t in trials if t.status == "ok"]
        # Paged 8-bit state lives outside PyTorch's allocator on CUDA, where an estimate counts it on the device.
        guessed = [t for t in estimates if t.status == "ok"]
        unpaged = [t for t in guessed if t.plan.optimizer != "paged_adamw8bit"]
        self._common = {
            **medians_by(guessed, lambda t: family(t.plan), "params", "other"),
            **medians_by(ran, lambda t: family(t.plan), "params", "other"),
        }
        if ran:
            self.common = statistics.median(t.breakdown["params"] + t.breakdown["other"] for t in ran)
        else:
            # Parameters are in place before any step, so even a trial that failed shows them.
            self.common = max([self.trainable_bytes, *(float(t.breakdown["params"]) for t in trials)])
        self._optimizer = {
            **medians_by(unpaged, optimizer_key, "optimizer"), **medians_by(ran, optimizer_key, "optimizer")
        }
        self._grads = {**medians_by(guessed, grads_key, "grads"), **medians_by(ran, grads_key, "grads")}
        points = activation_points(ran, batch_size)
        for key, group in activation_points(guessed, batch_size).items():
            points.setdefault(key, group)
        self._at_least: dict[ActivationKey, list[tuple[int, float]]] = {}
        for trial in trials:
            if trial.status == "oom":
                bound = trial.peak_bytes - self.fixed_bytes(trial.plan) - self.grads_bytes(trial.plan)
                point = (micro_batch_of(trial.plan, batch_size), max(0.0, bound))
                self._at_least.setdefault(activation_key(trial.plan), []).append(point)
        self._lines: dict[ActivationKey, Line] = {
            key: fit_line(group) for key, group in points.items() if len({x for x, _ in group}) > 1
        }
        with_two_sizes = dict(self._lines)
        for key, group in points.items():
            if key not in self._lines:
                donor = self._nearest(key, with_two_sizes)
                self._lines[key] = one_point_line(
                    group[0][0],
                    statistics.fmean(v for _, v in group),
                    intercept=donor[1].intercept if donor else 0.0,
                    at_least=self._at_least.get(key, ()),
                )

    def knows(self, plan: Plan) -> bool:
        """Whether every part of the plan's peak comes from a trial or an estimate (none is a least-case guess).

        Example:
            >>> trial = Trial(Plan(), "ok", 10, {"params": 4, "activations": 6}, 1.0, 4.0, None, "cpu")
            >>> model = MemoryModel([trial], trainable_bytes=4, batch_size=4)
            >>> model.knows(Plan()), model.knows(Plan(checkpointing=True))
            (True, False)
        """
        optimizer_known = (plan.optimizer, plan.offloads_optimizer, family(plan)) in self._optimizer
        return (
            family(plan) in self._common
            and optimizer_known
            and (plan.accumulation > 1, family(plan)) in self._grads
            and activation_key(plan) in self._lines
        )

    def fixed_bytes(self, plan: Plan) -> float:
        """What does not depend on the batch split: params, other and optimizer state."""
        common = self._common.get(family(plan))
        if common is None:
            # The least an unmeasured family can hold of the measured one's parameters (the registry's
            # least_params): pure bf16 halves them, QLoRA's 4-bit base can be an eighth.
            common = self.common * least_share(plan, "least_params")
        return common + self.optimizer_bytes(plan)

    def trained_bytes(self, plan: Plan) -> float:
        """Bytes of the weights the plan trains, at least (the registry's least_trained): none known for adapters,
        half for pure bf16."""
        return self.trainable_bytes * least_share(plan, "least_trained")

    def optimizer_bytes(self, plan: Plan) -> float:
        """Optimizer state on the device: measured for this optimizer, else what it needs at least."""
        key = (plan.optimizer, plan.offloads_optimizer, family(plan))
        if key in self._optimizer:
            return self._optimizer[key]
        # The registry's optimizer_state: offloaded state is off the device, Adafactor's factored state is a row
        # and a column per matrix, paged 8-bit state lives outside PyTorch's allocator on CUDA (on a CPU it is the
        # unpaged optimizer's, and the search measures that), 8-bit AdamW keeps a quarter of AdamW's.
        share = least_share(plan, "optimizer_state")
        if share == 0.0:
            return 0.0
        adamw = self._optimizer.get((REGISTRY["optimizer"].default, False, family(plan)), 2 * self.trained_bytes(plan))
        return adamw * share

    def grads_bytes(self, plan: Plan) -> float:
        """Gradients held at the peak: measured, else all of them with accumulation and none without."""
        accumulates = plan.accumulation > 1
        return self._grads.get((accumulates, family(plan)), self.trained_bytes(plan) if accumulates else 0.0)

    def activation_line(self, plan: Plan) -> Line | None:
        """The activation line of the plan's techniques; None while a technique it uses was never measured."""
        key = activation_key(plan)
        if key in self._lines:
            return self._lines[key]
        nearest = self._nearest(key, self._lines)
        if nearest is None:
            return None
        source_key, source = nearest
        per_row = source.per_row
        for position in range(len(key)):
            if key[position] != source_key[position]:
                ratio = self._ratio(position, source_key[position], key[position])
                if ratio is None:
                    return None
                per_row *= ratio
        donor = self._nearest(key, self._lines, same=_SAME_INTERCEPT) or nearest
        return Line(donor[1].intercept, per_row)

    def activations(self, plan: Plan) -> float:
        """Predicted activation bytes at the peak (never below what out-of-memory trials imply)."""
        size = micro_batch_of(plan, self.batch_size)
        line = self.activation_line(plan)
        predicted = 0.0 if line is None else max(0.0, line.at(size))
        # A line with a non-negative intercept keeps at least size/rows of what ``rows`` needed at fewer rows.
        seen = [bound * min(1.0, size / rows) for rows, bound in self._at_least.get(activation_key(plan), ())]
        return max([predicted, *seen])

    def predict(self, plan: Plan) -> float:
        """Predicted peak bytes of a plan."""
        fixed = self.fixed_bytes(plan)
        peak = fixed + self.grads_bytes(plan) + self.activations(plan)
        # After the last backward every gradient exists next to the optimizer state, accumulation or not (unless a
        # lever frees them as they come: the registry's least_grads).
        return max(peak, fixed + self.trained_bytes(plan) * least_share(plan, "least_grads"))

    def _ratio(self, position: int, before: Any, after: Any) -> float | None:
        """Per-row activation bytes after/before changing one technique, from lines that differ only there."""
        ratios = []
        for key, line in self._lines.items():
            if key[position] != before or line.per_row <= 0:
                continue
            twin = (*key[:position], after, *key[position + 1 :])
            if twin in self._lines:
                ratios.append(self._lines[twin].per_row / line.per_row)
        return statistics.median(ratios) if ratios else None

    @staticmethod
    def _nearest(
        key: ActivationKey, lines: Mapping[ActivationKey, Line], same: tuple[int, ...] = ()
    ) -> tuple[ActivationKey, Line] | None:
        """The key (and line) that differs from ``key`` in the fewest places (and agrees at ``same``)."""
        choices = [
            (sum(a != b for a, b in zip(key, other, strict=True)), index, other)
            for index, other in enumerate(lines)
            if other != key and all(key[i] == other[i] for i in same)
        ]
        if not choices:
            return None
        chosen = min(choices, key=lambda choice: choice[:2])[2]
        return chosen, lines[chosen]


def optimizer_key(trial: Trial) -> tuple[str, bool, Family]:
    return (trial.plan.optimizer, trial.plan.offloads_optimizer, family(trial.plan))


def grads_key(trial: Trial) -> tuple[bool, Family]:
    return (trial.plan.accumulation > 1, family(trial.plan))


def activation_points(trials: Sequence[Trial], batch_size: int) -> dict[ActivationKey, list[tuple[int, float]]]:
    """The ``(micro_batch, activation bytes)`` points of the trials that ran, by :data:`ActivationKey`.

    Example:
        >>> trial = Trial(Plan(micro_batch=2, accumulation=2), "ok", 9, {"activations": 5}, 1.0, 4.0, None, "cpu")
        >>> activation_points([trial], 4) == {activation_key(trial.plan): [(2, 5.0)]}
        True
    """
    points: dict[ActivationKey, list[tuple[int, float]]] = {}
    for trial in trials:
        if trial.status == "ok":
            point = (micro_batch_of(trial.plan, batch_size), float(trial.breakdown["activations"]))
            points.setdefault(activation_key(trial.plan), []).append(point)
    return points


def medians_by(trials: Sequence[Trial], key: Callable[[Trial], Any], *categories: str) -> dict[Any, float]:
    """The median of the categories' summed bytes over the trials of each key."""
    groups: dict[Any, list[int]] = {}
    for trial in trials:
        groups.setdefault(key(trial), []).append(sum(trial.breakdown[category] for category in categories))
    return {name: float(statistics.median(values)) for name, values in groups.items()}
