"""The speed model of the search: ``log(samples/s)`` as a sum of one effect per setting, with a prior per device.

A plan's speed is predicted only where the measurements determine it; otherwise it could be the fastest and must be
measured. A plan is at most as fast as its twin without a technique that only adds work (checkpointing, the chunked
loss, offload, QLoRA instead of LoRA: :data:`~memlab.search.space.SLOWER_WITH`). On CUDA throughput is also assumed
never to fall when micro_batch grows with the same techniques, so a plan is at most as fast as its larger-micro-batch
twin (on a CPU that does not hold; every size is measured).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from memlab.plan import Plan
from memlab.report import Trial
from memlab.report.data import speed_range
from memlab.search.space import TECHNIQUE_DEFAULTS, TECHNIQUES, faster_twins, micro_batch_of
from memlab.techniques.core.registry import REGISTRY

SPEED_MARGIN = 0.9
"""A plan is skipped for speed when its predicted samples/s is at most ``SPEED_MARGIN * best``."""


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
    """Rough speed ratios of each technique on a device, as the registry declares them (each lever's ``speed``):
    checkpointing recomputes (about 3/4 the speed), half precision is fast on GPUs and not on CPUs (fp16 on CPU is
    slow), offload moves data over the bus, adapters skip the base's weight gradients.

    Example:
        >>> speed_prior("cpu").ratio("checkpointing", True)
        0.75
    """
    gpu = device_type == "cuda"
    return SpeedPrior(
        micro_batch_exponent=0.3 if gpu else 0.1,
        monotone=gpu,
        ratios={
            (name, value): on_gpu if gpu else on_cpu
            for name, lever in REGISTRY.items()
            for value, (on_gpu, on_cpu) in lever.speed.items()
        },
    )


class SpeedModel:
    """Predicts samples/s from measured trials: ``log(samples/s)`` is a sum of one effect per setting.

    The effects are fitted by least squares (``numpy.linalg.pinv``). A plan's prediction is *determined* when its
    settings lie in the span of the measured ones (for example: plain, bf16 and checkpointing measured determine
    "bf16 + checkpointing"); :meth:`upper` is infinite for a plan that is not determined and has no determined
    larger-micro-batch twin.

    Example:
        >>> from memlab.search.space import candidate_plans
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
        sizes = sorted({micro_batch_of(p, batch_size) for p in [*plans, *(t.plan for t in trials)]})
        self.reference_size = sizes[-1]
        self.levels: list[tuple[str, Any]] = [("micro_batch", s) for s in sizes[:-1]]
        for name in TECHNIQUES:
            values = dict.fromkeys([getattr(p, name) for p in plans] + [getattr(t.plan, name) for t in trials])
            self.levels += [(name, value) for value in values if value != TECHNIQUE_DEFAULTS[name]]
        self._index = {level: i + 1 for i, level in enumerate(self.levels)}
        self._prior = np.zeros(len(self.levels) + 1)
        for (name, value), i in self._index.items():
            if name == "micro_batch":
                self._prior[i] = self.prior.micro_batch_exponent * math.log(value / self.reference_size)
            else:
                self._prior[i] = math.log(self.prior.ratio(name, value))
        self.measured: dict[Plan, float] = {}
        self._measured_most: dict[Plan, float] = {}
        for trial in trials:
            if trial.status == "ok" and trial.samples_per_s:
                self.measured[trial.plan] = float(trial.samples_per_s)
                self._measured_most[trial.plan] = max(float(trial.samples_per_s), speed_range(trial)[1])
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

    def _has_levels(self, plan: Plan) -> bool:
        """Whether every setting of ``plan`` is a level of the model (a twin outside the space may not be)."""
        size = micro_batch_of(plan, self.batch_size)
        if size != self.reference_size and ("micro_batch", size) not in self._index:
            return False
        return all(
            getattr(plan, name) == TECHNIQUE_DEFAULTS[name] or (name, getattr(plan, name)) in self._index
            for name in TECHNIQUES
        )

    def features(self, plan: Plan) -> np.ndarray:
        vector = np.zeros(len(self.levels) + 1)
        vector[0] = 1.0
        size = micro_batch_of(plan, self.batch_size)
        if size != self.reference_size:
            vector[self._index[("micro_batch", size)]] = 1.0
        for name in TECHNIQUES:
            value = getattr(plan, name)
            if value != TECHNIQUE_DEFAULTS[name]:
                vector[self._index[(name, value)]] = 1.0
        return vector

    def determined(self, plan: Plan) -> bool:
        """True when the measured trials determine this plan's predicted speed."""
        if self._theta is None or not self._has_levels(plan):
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

        A measured plan: the high end of its speed's interval (its speed within noise). A determined plan: its
        prediction / ``margin`` (the model's error). Otherwise the smallest such bound of a twin that does the same
        work or less: without a technique that only adds work (:data:`~memlab.search.space.SLOWER_WITH`), and,
        where the prior says throughput is monotone in micro_batch, with a larger micro-batch.
        """
        if plan in self.measured:
            return self._measured_most[plan]
        size = micro_batch_of(plan, self.batch_size)
        ranks = [value for name, value in self._index if name == "lora_rank"] + [TECHNIQUE_DEFAULTS["lora_rank"]]
        candidates = [plan, *faster_twins(plan, ranks)]
        if self.prior.monotone:
            candidates += [
                twin
                for lighter in list(candidates)
                for twin in self._twins(lighter)
                if micro_batch_of(twin, self.batch_size) > size
            ]
        bounds = [bound for twin in candidates if (bound := self._own_upper(twin)) is not None]
        return min(bounds, default=math.inf)

    def _own_upper(self, plan: Plan) -> float | None:
        if plan in self.measured:
            return self._measured_most[plan]
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
