"""``fit``: the fastest plan whose measured peak fits a memory budget at a fixed effective batch.

The space is every combination of micro_batch (a divisor of ``batch_size``; accumulation makes up the rest),
checkpointing, precision, optimizer and offload. Measuring all of it is slow, so the search measures a few plans,
fits two small models to what it measured, and skips what cannot fit or cannot win:

- Memory (:class:`MemoryModel`): ``peak = params + other + optimizer + grads + activations``, each part from the
  measured breakdowns: optimizer bytes per optimizer (8-bit AdamW unmeasured: a quarter of AdamW's), gradients
  held at the peak (with accumulation, all of them), and activations as a line ``intercept + per_row *
  micro_batch`` per (checkpointing, precision, activation offload). A line needs two micro-batch sizes; from one
  size it leans low (proportional below it, flat above unless an out-of-memory trial showed more); for a
  combination never measured, per-row bytes are a neighbour's times the ratio each technique was measured to have,
  and 0 while a ratio is unknown (an unmeasured technique might save everything). The first plan runs without the
  budget's cap, so its whole breakdown is known even when it does not fit.
- Speed (:class:`SpeedModel`): ``log(samples/s)`` is a sum of one effect per setting, fitted by least squares. A
  plan's speed is predicted only where the measurements determine it; otherwise it could be the fastest and must
  be measured. On CUDA throughput is assumed never to fall when micro_batch grows with the same techniques, so a
  plan is at most as fast as its larger-micro-batch twin (on a CPU that does not hold; every size is measured).
- Stop rule (:class:`Search`): a plan is skipped when it needs at least the memory of a plan that did not fit
  (:func:`needs_at_least`), when its predicted peak is over ``FIT_MARGIN * budget`` (1.1; borderline plans are
  measured), or when it cannot beat the best so far: a predicted speed must exceed ``SPEED_MARGIN * best`` (0.9,
  the model's error) and a measured twin's speed must exceed ``best``. The rest are measured fastest-expected
  first (plans predicted to fit before borderline ones) until none is left, so the answer is a measured trial.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from memlab.errors import MemlabError
from memlab.plan import PLAN_FIELDS, Plan, format_bytes, parse_budget
from memlab.report import Report, Trial

if TYPE_CHECKING:
    from torch import nn

    from memlab.batch import Batch, LossFn
    from memlab.events import Callback

__all__ = [
    "FIT_MARGIN",
    "SPEED_MARGIN",
    "MemoryModel",
    "Search",
    "SpeedModel",
    "SpeedPrior",
    "candidate_plans",
    "default_space",
    "divisors",
    "fit",
    "needs_at_least",
    "run_search",
    "speed_prior",
]

FIT_MARGIN = 1.1
"""A plan is skipped for memory only when its predicted peak is over ``budget * FIT_MARGIN``."""

SPEED_MARGIN = 0.9
"""A plan is skipped for speed when its predicted samples/s is at most ``SPEED_MARGIN * best``."""

TECHNIQUES = ("checkpointing", "precision", "optimizer", "offload")
"""The plan fields other than the batch split, in the order candidates are listed."""

_DEFAULTS = {name: getattr(Plan(), name) for name in TECHNIQUES}
# Lower rank = fewer optimizer bytes for the same parameters; optimizers not listed compare only with themselves.
_OPTIMIZER_RANK = {"adamw8bit": 0, "adamw": 1}

MeasureFn = Callable[[Plan, int, int], Trial]
"""``measure(plan, index, total) -> Trial``: how the search measures one plan (``TrialRunner.run`` in ``fit``)."""


# --- the space -----------------------------------------------------------------------------------------------


def divisors(number: int) -> list[int]:
    """The divisors of ``number``, largest first.

    Example:
        >>> divisors(12)
        [12, 6, 4, 3, 2, 1]
    """
    return [d for d in range(number, 0, -1) if number % d == 0]


def default_space(
    batch_size: int, device_type: str = "cpu", bf16_supported: bool = True
) -> dict[str, list[Any]]:
    """The axes ``fit`` searches by default on a device.

    micro_batch: every divisor of ``batch_size``; checkpointing off and on; precision fp32 and the device's fast
    half precision (bf16, or fp16 on a GPU without bf16); optimizer AdamW and 8-bit AdamW; offload only on CUDA
    (on a CPU there is nothing to move it to, so it can never help).

    Example:
        >>> default_space(4)
        {'micro_batch': [4, 2, 1], 'checkpointing': [False, True], 'precision': ['fp32', 'bf16'], \
'optimizer': ['adamw', 'adamw8bit'], 'offload': ['none']}
        >>> default_space(2, "cuda", bf16_supported=False)["precision"], default_space(2, "cuda")["offload"]
        (['fp32', 'fp16'], ['none', 'optimizer', 'all'])
    """
    half = "bf16" if device_type != "cuda" or bf16_supported else "fp16"
    return {
        "micro_batch": divisors(batch_size),
        "checkpointing": [False, True],
        "precision": ["fp32", half],
        "optimizer": ["adamw", "adamw8bit"],
        "offload": ["none", "optimizer", "all"] if device_type == "cuda" else ["none"],
    }


def candidate_plans(
    batch_size: int, space: Mapping[str, Sequence[Any]], *, batch_rows: int | None = None
) -> list[Plan]:
    """Every plan of ``space`` at the effective batch ``batch_size``, largest micro-batch first.

    ``space`` maps plan fields to the values to try; ``micro_batch`` values must divide ``batch_size`` (``None``
    means all of it) and ``accumulation`` follows from them. Fields not given keep the plain plan's value. When
    ``batch_rows`` equals ``batch_size``, the full-batch plan is written ``micro_batch=None`` (labelled "plain").

    Example:
        >>> [p.label() for p in candidate_plans(4, {"micro_batch": [4, 2], "checkpointing": [False, True]})]
        ['mb4x1', 'mb4x1 ckpt', 'mb2x2', 'mb2x2 ckpt']
        >>> candidate_plans(4, {"micro_batch": [3]})
        Traceback (most recent call last):
        ...
        memlab.errors.MemlabError: micro_batch=3 does not divide batch_size=4; write divisors of 4: 4, 2, 1
    """
    for key in space:
        if key == "accumulation":
            raise MemlabError(
                "accumulation follows from batch_size / micro_batch; restrict micro_batch instead, "
                "e.g. space={'micro_batch': [8, 4]}"
            )
        if key not in PLAN_FIELDS:
            raise MemlabError(f"{key!r} is not a plan setting; write keys among {', '.join(PLAN_FIELDS)}")
    if isinstance(space.get("micro_batch"), (str, bytes)):
        raise MemlabError("space values are lists; write for example space={'micro_batch': [8, 4]}")
    micro: list[int] = []
    for value in space.get("micro_batch", divisors(batch_size)):
        size = batch_size if value is None else value
        if isinstance(size, bool) or not isinstance(size, int) or size < 1 or batch_size % size:
            listed = ", ".join(str(d) for d in divisors(batch_size))
            raise MemlabError(
                f"micro_batch={value!r} does not divide batch_size={batch_size}; write divisors of {batch_size}: "
                f"{listed}"
            )
        if size not in micro:
            micro.append(size)
    axes: list[list[Any]] = []
    for name in TECHNIQUES:
        values = space.get(name, [_DEFAULTS[name]])
        if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
            raise MemlabError(f"space[{name!r}] must be a list; write for example {{{name!r}: [{values!r}]}}")
        axes.append(list(dict.fromkeys(values)))
    if not micro or not all(axes):
        raise MemlabError("the space is empty; give every axis at least one value")
    plans = []
    for size in micro:
        for values in _product(axes):
            plan = Plan(
                micro_batch=None if size == batch_size == batch_rows else size,
                accumulation=batch_size // size,
                **dict(zip(TECHNIQUES, values, strict=True)),
            )
            plans.append(plan)
    return plans


def _product(axes: list[list[Any]]) -> list[tuple[Any, ...]]:
    combinations: list[tuple[Any, ...]] = [()]
    for values in axes:
        combinations = [(*combination, value) for combination in combinations for value in values]
    return combinations


def micro_batch_of(plan: Plan, batch_size: int) -> int:
    """Rows per micro-batch of a candidate (``micro_batch=None`` means the whole effective batch)."""
    return plan.micro_batch or batch_size // plan.accumulation


def fits(trial: Trial, budget: int) -> bool:
    """True when the trial ran and its peak is within ``budget``."""
    return trial.status == "ok" and trial.peak_bytes <= budget


def best_of(trials: Iterable[Trial], budget: int) -> Trial | None:
    """The fastest trial that fits (a tie goes to the lower peak), as :attr:`Report.best` chooses."""
    fitting = [t for t in trials if fits(t, budget) and t.samples_per_s is not None]
    if not fitting:
        return None
    return max(fitting, key=lambda t: (t.samples_per_s or 0.0, -t.peak_bytes))


def needs_at_least(plan: Plan, other: Plan, batch_size: int) -> bool:
    """Whether ``plan`` needs at least the memory of ``other``, whatever the model (so if ``other`` does not fit,
    neither does ``plan``).

    True when both use the same precision and offload, ``plan`` has at least ``other``'s micro-batch, checkpoints
    only if ``other`` does, and its optimizer keeps at least as much state. Going from accumulation to none is
    never compared: without accumulation the gradients need not be held while activations are.

    Example:
        >>> small = Plan(micro_batch=2, accumulation=4, checkpointing=True)
        >>> needs_at_least(Plan(micro_batch=4, accumulation=2), small, 8)
        True
        >>> needs_at_least(Plan(micro_batch=4, accumulation=2, precision="bf16"), small, 8)
        False
    """
    if plan.precision != other.precision or plan.offload != other.offload:
        return False
    if plan.checkpointing and not other.checkpointing:
        return False
    if plan.optimizer != other.optimizer:
        mine, theirs = _OPTIMIZER_RANK.get(plan.optimizer), _OPTIMIZER_RANK.get(other.optimizer)
        if mine is None or theirs is None or mine < theirs:
            return False
    if plan.accumulation == 1 and other.accumulation > 1:
        return False
    return micro_batch_of(plan, batch_size) >= micro_batch_of(other, batch_size)


# --- memory --------------------------------------------------------------------------------------------------

ActivationKey = tuple[bool, str, bool]
"""What activations per row depend on: (checkpointing, precision, activations offloaded)."""


def activation_key(plan: Plan) -> ActivationKey:
    return (plan.checkpointing, plan.precision, plan.offloads_activations)


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

    def __init__(self, trials: Sequence[Trial], *, trainable_bytes: int, batch_size: int) -> None:
        self.trainable_bytes = float(trainable_bytes)
        self.batch_size = batch_size
        ran = [t for t in trials if t.status == "ok"]
        if ran:
            self.common = statistics.median(t.breakdown["params"] + t.breakdown["other"] for t in ran)
        else:
            # Parameters are in place before any step, so even a trial that failed shows them.
            self.common = max([self.trainable_bytes, *(float(t.breakdown["params"]) for t in trials)])
        self._optimizer = _medians(ran, lambda t: (t.plan.optimizer, t.plan.offloads_optimizer), "optimizer")
        self._grads = _medians(ran, lambda t: t.plan.accumulation > 1, "grads")
        points: dict[ActivationKey, list[tuple[int, float]]] = {}
        for trial in ran:
            point = (micro_batch_of(trial.plan, batch_size), float(trial.breakdown["activations"]))
            points.setdefault(activation_key(trial.plan), []).append(point)
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

    def fixed_bytes(self, plan: Plan) -> float:
        """What does not depend on the batch split: params, other and optimizer state."""
        return self.common + self.optimizer_bytes(plan)

    def optimizer_bytes(self, plan: Plan) -> float:
        """Optimizer state on the device: measured for this optimizer, else what it needs at least."""
        key = (plan.optimizer, plan.offloads_optimizer)
        if key in self._optimizer:
            return self._optimizer[key]
        if plan.offloads_optimizer:
            return 0.0
        adamw = self._optimizer.get(("adamw", False), 2 * self.trainable_bytes)
        return adamw / 4 if plan.optimizer == "adamw8bit" else adamw

    def grads_bytes(self, plan: Plan) -> float:
        """Gradients held at the peak: measured, else all of them with accumulation and none without."""
        accumulates = plan.accumulation > 1
        return self._grads.get(accumulates, self.trainable_bytes if accumulates else 0.0)

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
        donor = self._nearest(key, self._lines, same=(1, 2)) or nearest
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
        # After the last backward every gradient exists next to the optimizer state, accumulation or not.
        return max(peak, fixed + self.trainable_bytes)

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


def _medians(trials: Sequence[Trial], key: Callable[[Trial], Any], category: str) -> dict[Any, float]:
    groups: dict[Any, list[int]] = {}
    for trial in trials:
        groups.setdefault(key(trial), []).append(trial.breakdown[category])
    return {name: float(statistics.median(values)) for name, values in groups.items()}


# --- speed ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SpeedPrior:
    """What to expect of a plan's speed before it is measured; it only orders the plans to measure.

    Args:
        micro_batch_exponent: samples/s grows as ``micro_batch ** exponent`` (bigger micro-batches are faster).
        ratios: expected samples/s relative to the plain plan, per ``(field, value)``.
        monotone: whether throughput can be assumed never to fall when micro_batch grows (same techniques). True
            on GPUs; on CPUs bigger activations can cost more per row (the allocator maps and unmaps large blocks
            every step), so there every micro-batch size must be measured before it can be ruled out.

    Example:
        >>> speed_prior("cuda").ratio("precision", "bf16") > speed_prior("cpu").ratio("precision", "bf16")
        True
    """

    micro_batch_exponent: float = 0.3
    ratios: Mapping[tuple[str, Any], float] = field(default_factory=dict)
    monotone: bool = True

    def ratio(self, name: str, value: Any) -> float:
        return self.ratios.get((name, value), 1.0)


def speed_prior(device_type: str) -> SpeedPrior:
    """Rough speed ratios of each technique on a device: checkpointing recomputes (about 3/4 the speed), half
    precision is fast on GPUs and not on CPUs (fp16 on CPU is slow), offload moves data over the bus.

    Example:
        >>> speed_prior("cpu").ratio("checkpointing", True)
        0.75
    """
    gpu = device_type == "cuda"
    return SpeedPrior(
        micro_batch_exponent=0.3 if gpu else 0.1,
        monotone=gpu,
        ratios={
            ("checkpointing", True): 0.75,
            ("precision", "bf16"): 1.6 if gpu else 1.0,
            ("precision", "fp16"): 1.6 if gpu else 0.3,
            ("optimizer", "adamw8bit"): 0.97,
            ("offload", "optimizer"): 0.7,
            ("offload", "activations"): 0.6,
            ("offload", "all"): 0.5,
        },
    )


class SpeedModel:
    """Predicts samples/s from measured trials: ``log(samples/s)`` is a sum of one effect per setting.

    The effects are fitted by least squares (``numpy.linalg.pinv``). A plan's prediction is *determined* when its
    settings lie in the span of the measured ones (for example: plain, bf16 and checkpointing measured determine
    "bf16 + checkpointing"); :meth:`upper` is infinite for a plan that is not determined and has no determined
    larger-micro-batch twin.

    Example:
        >>> def ran(plan, speed):
        ...     return Trial(plan, "ok", 1, {}, 8 / speed, speed, None, "cpu")
        >>> plans = candidate_plans(8, {"micro_batch": [8, 4], "checkpointing": [False, True],
        ...                             "precision": ["fp32", "bf16"]})
        >>> [p.label() for p in plans[:4]]
        ['mb8x1', 'mb8x1 bf16', 'mb8x1 ckpt', 'mb8x1 ckpt bf16']
        >>> model = SpeedModel([ran(plans[0], 10.0), ran(plans[1], 20.0), ran(plans[2], 8.0)], plans, batch_size=8)
        >>> round(model.predict(plans[3]), 6)  # checkpointing x0.8 and bf16 x2, measured apart
        16.0
        >>> model.predict(plans[4]), model.upper(plans[4])  # mb4x2: not determined, at most as fast as mb8x1
        (None, 10.0)
    """

    def __init__(
        self,
        trials: Sequence[Trial],
        plans: Sequence[Plan],
        *,
        batch_size: int,
        prior: SpeedPrior | None = None,
        margin: float = SPEED_MARGIN,
    ) -> None:
        self.batch_size = batch_size
        self.prior = prior or SpeedPrior()
        self.margin = margin
        sizes = sorted({micro_batch_of(p, batch_size) for p in plans} | {_size(t, batch_size) for t in trials})
        self.reference_size = sizes[-1]
        self.levels: list[tuple[str, Any]] = [("micro_batch", s) for s in sizes[:-1]]
        for name in TECHNIQUES:
            values = dict.fromkeys([getattr(p, name) for p in plans] + [getattr(t.plan, name) for t in trials])
            self.levels += [(name, value) for value in values if value != _DEFAULTS[name]]
        self._index = {level: i + 1 for i, level in enumerate(self.levels)}
        self._prior = np.zeros(len(self.levels) + 1)
        for (name, value), i in self._index.items():
            if name == "micro_batch":
                self._prior[i] = self.prior.micro_batch_exponent * math.log(value / self.reference_size)
            else:
                self._prior[i] = math.log(self.prior.ratio(name, value))
        self.measured: dict[Plan, float] = {}
        for trial in trials:
            if trial.status == "ok" and trial.samples_per_s:
                self.measured[trial.plan] = float(trial.samples_per_s)
        if self.measured:
            rows = np.array([self.features(plan) for plan in self.measured])
            speeds = np.log(np.array(list(self.measured.values())))
            inverse = np.linalg.pinv(rows)
            self._theta: np.ndarray | None = inverse @ speeds
            self._projection = inverse @ rows
            self._prior[0] = float(np.mean(speeds - rows[:, 1:] @ self._prior[1:]))
        else:
            self._theta = None
            self._projection = np.zeros((len(self._prior), len(self._prior)))

    def features(self, plan: Plan) -> np.ndarray:
        vector = np.zeros(len(self.levels) + 1)
        vector[0] = 1.0
        size = micro_batch_of(plan, self.batch_size)
        if size != self.reference_size:
            vector[self._index[("micro_batch", size)]] = 1.0
        for name in TECHNIQUES:
            value = getattr(plan, name)
            if value != _DEFAULTS[name]:
                vector[self._index[(name, value)]] = 1.0
        return vector

    def determined(self, plan: Plan) -> bool:
        """True when the measured trials determine this plan's predicted speed."""
        if self._theta is None:
            return False
        x = self.features(plan)
        return bool(np.linalg.norm(x - x @ self._projection) < 1e-6)

    def predict(self, plan: Plan) -> float | None:
        """Predicted samples/s, or None where the measurements do not determine it."""
        if self._theta is None or not self.determined(plan):
            return None
        return float(math.exp(self.features(plan) @ self._theta))

    def expected(self, plan: Plan) -> float:
        """Best guess of samples/s, to order plans: the fit where it is determined, the prior for the rest."""
        x = self.features(plan)
        known = x @ self._projection
        fitted = float(known @ self._theta) if self._theta is not None else 0.0
        return math.exp(fitted + float((x - known) @ self._prior))

    def upper(self, plan: Plan) -> float:
        """The most samples/s the plan can have under the model's assumptions (``inf`` when unknown).

        A measured plan: its measured speed. A determined plan: its prediction / ``margin`` (the model's error).
        Otherwise, where the prior says throughput is monotone in micro_batch, the smallest such bound of a twin
        with a larger micro-batch and the same techniques.
        """
        own = self._own_upper(plan)
        if own is not None or not self.prior.monotone:
            return math.inf if own is None else own
        size = micro_batch_of(plan, self.batch_size)
        bounds = [
            bound
            for twin in self._twins(plan)
            if micro_batch_of(twin, self.batch_size) > size and (bound := self._own_upper(twin)) is not None
        ]
        return min(bounds, default=math.inf)

    def _own_upper(self, plan: Plan) -> float | None:
        if plan in self.measured:
            return self.measured[plan]
        predicted = self.predict(plan)
        return None if predicted is None else predicted / self.margin

    def _twins(self, plan: Plan) -> list[Plan]:
        twins = []
        for (name, size), _ in self._index.items():
            if name == "micro_batch":
                twins.append(plan.replace(micro_batch=size, accumulation=self.batch_size // size))
        if self.reference_size != micro_batch_of(plan, self.batch_size):
            accumulation = self.batch_size // self.reference_size
            twins.append(plan.replace(micro_batch=self.reference_size, accumulation=accumulation))
            if accumulation == 1:
                twins.append(plan.replace(micro_batch=None, accumulation=1))
        return twins


def _size(trial: Trial, batch_size: int) -> int:
    return micro_batch_of(trial.plan, batch_size)


# --- the search ----------------------------------------------------------------------------------------------


class Search:
    """The state of one search: what was measured, what was skipped (and why), and what to measure next.

    Call :meth:`next_plan` (None when done), measure it, hand the trial to :meth:`record`; or let
    :func:`run_search` do the loop.

    Args:
        candidates: the plans to choose from (:func:`candidate_plans`).
        budget: bytes the chosen plan's measured peak must stay within.
        batch_size: the effective batch every candidate keeps.
        trainable_bytes: bytes of the trainable parameters (what gradients and AdamW state are sized by).
        prior: expected speeds before measuring (:func:`speed_prior`).
        fit_margin: skip for memory only above ``budget * fit_margin``.
        speed_margin: skip a determined plan when its predicted speed is at most ``speed_margin * best``.

    Example:
        >>> plans = candidate_plans(2, {"micro_batch": [2, 1]})
        >>> search = Search(plans, budget=1000, batch_size=2, trainable_bytes=100)
        >>> first = search.next_plan(); first.label()
        'mb2x1'
        >>> search.record(Trial(first, "ok", 900, {"params": 100}, 0.1, 20.0, None, "cpu", rows_per_step=2))
        >>> search.next_plan() is None, search.skipped[0][0].label()
        (True, 'mb1x2')
    """

    def __init__(
        self,
        candidates: Sequence[Plan],
        *,
        budget: int,
        batch_size: int,
        trainable_bytes: int,
        prior: SpeedPrior | None = None,
        fit_margin: float = FIT_MARGIN,
        speed_margin: float = SPEED_MARGIN,
    ) -> None:
        self.candidates = list(dict.fromkeys(candidates))
        self.budget = budget
        self.batch_size = batch_size
        self.trainable_bytes = trainable_bytes
        self.prior = prior or SpeedPrior()
        self.fit_margin = fit_margin
        self.speed_margin = speed_margin
        self.trials: list[Trial] = []
        self.skipped: list[tuple[Plan, str]] = []
        self.pending: list[Plan] = list(self.candidates)

    @property
    def best(self) -> Trial | None:
        """The fastest measured trial that fits the budget so far."""
        return best_of(self.trials, self.budget)

    def models(self) -> tuple[MemoryModel, SpeedModel]:
        """The memory and speed models fitted to the trials so far."""
        memory = MemoryModel(self.trials, trainable_bytes=self.trainable_bytes, batch_size=self.batch_size)
        speed = SpeedModel(
            self.trials, self.candidates, batch_size=self.batch_size, prior=self.prior, margin=self.speed_margin
        )
        return memory, speed

    def next_plan(self) -> Plan | None:
        """Skip what cannot fit or cannot win, then the plan to measure next (None when none is left)."""
        memory, speed = self.models()
        best = self.best
        keep = []
        for plan in self.pending:
            reason = self.skip_reason(plan, memory, speed, best)
            if reason is None:
                keep.append(plan)
            else:
                self.skipped.append((plan, reason))
        self.pending = keep
        if not keep and not self.trials and self.skipped:
            # Nothing looks possible: still measure the plan predicted to need least, so that the report shows
            # how far off the budget is.
            closest = min(self.skipped, key=lambda item: memory.predict(item[0]))
            self.skipped.remove(closest)
            return closest[0]
        if not keep:
            return None
        probe = self._memory_probe()
        if probe is not None:
            return probe
        return max(
            keep,
            key=lambda plan: (memory.predict(plan) <= self.budget, speed.expected(plan), -memory.predict(plan)),
        )

    def skip_reason(
        self, plan: Plan, memory: MemoryModel, speed: SpeedModel, best: Trial | None
    ) -> str | None:
        """Why ``plan`` need not be measured, or None when it must be."""
        for trial in self.trials:
            if not fits(trial, self.budget) and trial.status != "error" and needs_at_least(
                plan, trial.plan, self.batch_size
            ):
                return f"cannot fit: needs at least the memory of {trial.label}, which did not fit"
        predicted = memory.predict(plan)
        if predicted > self.budget * self.fit_margin:
            return (
                f"predicted not to fit: peak {format_bytes(predicted)}, more than {self.fit_margin - 1:.0%} over "
                f"the budget {format_bytes(self.budget)}"
            )
        if best is not None and best.samples_per_s is not None:
            bound = speed.upper(plan)
            if bound <= best.samples_per_s:
                return (
                    f"cannot beat the best: at most {bound:.3g} samples/s predicted, "
                    f"{best.label} ran at {best.samples_per_s:.3g}"
                )
        return None

    def _memory_probe(self) -> Plan | None:
        """After a first plan that ran out of memory: the same techniques at the smallest micro-batch, so that the
        memory model learns the fixed parts (params, gradients, optimizer state) and a first activation size."""
        if len(self.trials) != 1 or self.trials[0].status != "oom":
            return None
        first = self.trials[0].plan
        smallest = min(micro_batch_of(p, self.batch_size) for p in self.pending)
        for plan in self.pending:
            if micro_batch_of(plan, self.batch_size) == smallest and all(
                getattr(plan, name) == getattr(first, name) for name in TECHNIQUES
            ):
                return plan
        return None

    def record(self, trial: Trial) -> None:
        """Add a measured trial (its plan leaves the pending list)."""
        self.trials.append(trial)
        if trial.plan in self.pending:
            self.pending.remove(trial.plan)


@dataclass
class SearchResult:
    """What :func:`run_search` did: the trials in the order measured, the plans skipped with the reason."""

    trials: list[Trial]
    skipped: list[tuple[Plan, str]]
    best: Trial | None


def run_search(
    candidates: Sequence[Plan],
    measure: MeasureFn,
    *,
    budget: int,
    batch_size: int,
    trainable_bytes: int,
    prior: SpeedPrior | None = None,
    fit_margin: float = FIT_MARGIN,
    speed_margin: float = SPEED_MARGIN,
    on_step: Callable[[int], None] | None = None,
) -> SearchResult:
    """Measure candidates one at a time until none left can fit and win (see the module docstring).

    ``measure(plan, index, total)`` returns the plan's Trial; ``on_step(done)`` is told how many candidates are
    settled (measured or skipped) after each step, for a progress bar.

    Example:
        >>> def fake(plan, index, total):  # smaller micro-batches: less memory, slower
        ...     rows = plan.micro_batch or 8
        ...     peak = 100 + 50 * rows
        ...     status = "ok" if peak <= 400 else "oom"
        ...     return Trial(plan, status, peak, {"params": 50, "activations": 50 * rows}, 1.0,
        ...                  10.0 * rows ** 0.5 if status == "ok" else None, None, "cpu", budget=400)
        >>> result = run_search(candidate_plans(8, {}), fake, budget=400, batch_size=8, trainable_bytes=50)
        >>> result.best.label, len(result.trials), len(candidate_plans(8, {}))
        ('mb4x2', 3, 4)
    """
    search = Search(
        candidates, budget=budget, batch_size=batch_size, trainable_bytes=trainable_bytes, prior=prior,
        fit_margin=fit_margin, speed_margin=speed_margin,
    )
    total = len(search.candidates)
    while (plan := search.next_plan()) is not None:
        if on_step is not None:
            on_step(len(search.trials) + len(search.skipped))
        search.record(measure(plan, len(search.trials), total))
    if on_step is not None:
        on_step(total)
    return SearchResult(search.trials, search.skipped, search.best)


# --- fit -----------------------------------------------------------------------------------------------------


def fit(
    model: nn.Module,
    batch: Batch,
    *,
    budget: int | str | None = None,
    batch_size: int | None = None,
    loss_fn: LossFn | None = None,
    steps: int = 3,
    warmup: int = 1,
    lr: float = 1e-5,
    callback: Callback | None = None,
    progress: bool = True,
    dry_run: bool = False,
    space: Mapping[str, Sequence[Any]] | None = None,
) -> Report:
    """The fastest plan whose measured peak fits ``budget`` at the effective batch ``batch_size``.

    Plans are measured on the live model (restored bit-exact afterwards) fastest-expected first, and plans that
    cannot fit or cannot beat the best so far are skipped (see the module docstring for how). The first plan runs
    without the budget's cap, so that its whole peak is known even when it does not fit (on CUDA it is still
    limited by the device); every other plan runs capped at the budget, as ``measure(..., budget=budget)`` does.
    Every trial records the budget (the first one too), so ``trial.fits`` agrees with ``report.fits(trial)``.
    The returned Report holds every measured trial in order; its ``best`` is the answer (None when nothing fits),
    and its ``skipped`` lists the plans not measured with the reason.

    Args:
        model: the model to train, on its device.
        batch: one batch (dict of tensors, tensor, or tuple); rows repeat where ``batch_size`` asks for more.
        budget: bytes or a size such as ``"8GiB"``. Default: on CUDA the device's free memory plus what the model
            holds there; on CPU it must be given.
        batch_size: the effective batch (rows per optimizer step); default: the rows of ``batch``.
        loss_fn, steps, warmup, lr, callback: as for :func:`memlab.measure`.
        progress: show a progress bar.
        dry_run: rank by :func:`memlab.estimate.estimate` (fake tensors, nothing runs): plans are estimated in
            order of expected speed and the first estimated to fit is the answer; nothing is timed.
        space: restrict the axes, e.g. ``{"precision": ["fp32"], "micro_batch": [8, 4]}`` (keys are Plan fields;
            ``accumulation`` follows from ``batch_size / micro_batch``). Default: :func:`default_space`.

    Example:
        >>> import torch
        >>> model = torch.nn.Sequential(torch.nn.Linear(16, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
        >>> report = fit(model, torch.randn(8, 16), budget="1MiB", loss_fn=lambda m, b: m(b).mean(),
        ...              steps=1, progress=False, space={"precision": ["fp32"], "optimizer": ["adamw"]})
        >>> report.best.fits, report.best.rows_per_step
        (True, 8)
    """
    import torch

    from memlab.batch import count_rows
    from memlab.measure.cuda import cuda_bf16_supported
    from memlab.module_state import trainable_parameters, unique_parameters
    from memlab.step import model_device
    from memlab.trial import TrialRunner, progress_bar

    if not isinstance(model, torch.nn.Module):
        raise MemlabError(f"model must be a torch nn.Module, not {type(model).__name__}")
    rows = count_rows(batch)
    if batch_size is None:
        batch_size = rows
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise MemlabError(f"batch_size={batch_size!r} is not allowed; write a whole number >= 1, e.g. batch_size=32")
    device = model_device(model)
    budget_bytes = parse_budget(budget)
    if budget_bytes is None:
        if device.type != "cuda":
            raise MemlabError(
                f"fit on {device.type} needs a budget; write for example budget='8GiB' or budget='500MB'"
            )
        held = sum(t.numel() * t.element_size() for t in [*unique_parameters(model), *model.buffers()])
        budget_bytes = int(torch.cuda.mem_get_info(device)[0]) + held
    resolved_space: dict[str, Sequence[Any]] = dict(
        default_space(batch_size, device.type, device.type == "cuda" and cuda_bf16_supported(device))
    )
    if space is not None:
        if not isinstance(space, Mapping):
            raise MemlabError("space must be a dict of plan fields to values, e.g. {'precision': ['fp32', 'bf16']}")
        resolved_space.update(space)
    candidates = candidate_plans(batch_size, resolved_space, batch_rows=rows)
    trainable = sum(p.numel() * p.element_size() for p in trainable_parameters(model))
    prior = speed_prior(device.type)
    if dry_run:
        return _dry_run(model, batch, candidates, budget_bytes, batch_size, prior, loss_fn, lr)
    runner = TrialRunner(
        model, batch, loss_fn=loss_fn, steps=steps, warmup=warmup, budget=budget_bytes, lr=lr, callback=callback
    )
    with runner.session(), progress_bar(len(candidates), progress) as bar:

        def measure(plan: Plan, index: int, total: int) -> Trial:
            bar.set_postfix_str(plan.label())
            if index > 0:
                return runner.run(plan, index, total)
            # The first plan runs without the budget's cap: a capped run that does not fit stops at the budget and
            # says only that, while the whole peak and its breakdown teach the memory model the most. Its Trial
            # (and the TrialFinished event that carries it) is then held to the budget like every other trial, so
            # ``trial.fits`` says whether it fits the budget.
            runner.budget = None
            runner.callback = _with_budget(callback, budget_bytes)
            try:
                return dataclasses.replace(runner.run(plan, index, total), budget=budget_bytes)
            finally:
                runner.budget = budget_bytes
                runner.callback = callback

        def advance(done: int) -> None:
            bar.update(done - bar.n)

        result = run_search(
            candidates, measure, budget=budget_bytes, batch_size=batch_size, trainable_bytes=trainable,
            prior=prior, on_step=advance,
        )
    return Report(result.trials, budget=budget_bytes, skipped=result.skipped)


def _with_budget(callback: Callback | None, budget: int) -> Callback | None:
    """``callback``, with the Trial of a ``TrialFinished`` event held to ``budget`` (for fit's uncapped first run).

    Example:
        >>> from memlab.events import TrialFinished
        >>> seen = []
        >>> trial = Trial(Plan(), "ok", 900, {"params": 900}, 0.5, 8.0, None, "cpu")
        >>> _with_budget(seen.append, 800)(TrialFinished(trial=trial, index=0, total=1))
        >>> seen[0].trial.budget, seen[0].trial.fits
        (800, False)
    """
    if callback is None:
        return None
    from memlab.events import TrialFinished

    def forward(event: Any) -> None:
        if isinstance(event, TrialFinished):
            event = dataclasses.replace(event, trial=dataclasses.replace(event.trial, budget=budget))
        callback(event)

    return forward


def _dry_run(
    model: nn.Module,
    batch: Batch,
    candidates: Sequence[Plan],
    budget: int,
    batch_size: int,
    prior: SpeedPrior,
    loss_fn: LossFn | None,
    lr: float,
) -> Report:
    """Estimate candidates on fake tensors in order of expected speed (the prior: nothing is timed) until one is
    estimated to fit: that one is the answer, and the plans after it are skipped as expected slower."""
    from memlab.estimate import estimate
    from memlab.step import model_device

    speed = SpeedModel([], candidates, batch_size=batch_size, prior=prior)
    order = sorted(candidates, key=speed.expected, reverse=True)
    device = model_device(model)
    trials: list[Trial] = []
    for position, plan in enumerate(order):
        trials.append(estimate(model, batch, plan, loss_fn=loss_fn, budget=budget, lr=lr, device=device))
        if fits(trials[-1], budget):
            reason = f"expected slower: {plan.label()} is expected faster and is estimated to fit"
            return Report(trials, budget=budget, skipped=[(slower, reason) for slower in order[position + 1 :]])
    return Report(trials, budget=budget)
