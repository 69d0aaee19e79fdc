"""The strategy of the search: measure a few plans, skip what cannot fit or cannot win, repeat.

A plan is skipped when it needs at least the memory of a plan that did not fit (:func:`needs_at_least`), when its
predicted peak is over ``FIT_MARGIN * budget`` (borderline plans are measured), when a measured plan that fits does
its work or less (:func:`~memlab.search.space.faster_twins`: it can tie that plan, never beat it), or when it cannot
beat the best so far beyond the noise: a predicted speed over ``SPEED_MARGIN`` must reach, and a measured twin's
interval must reach, the low end of the best's interval (:func:`~memlab.report.data.speed_range`). The
rest are measured fastest-expected first (plans predicted to fit before borderline ones) until none is left, or
until ``max_trials`` were measured, so the answer is a measured trial.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from memlab.plan import Plan, format_bytes
from memlab.report import Trial
from memlab.report.data import speed_range
from memlab.report.views.svg import axis_number
from memlab.search.memory import FIT_MARGIN, MemoryModel
from memlab.search.space import TECHNIQUES, best_of, faster_twins, fits, micro_batch_of, needs_at_least, runs_as
from memlab.search.speed import SPEED_MARGIN, SpeedModel, SpeedPrior
from memlab.techniques.adapters import with_adapter
from memlab.techniques.core.registry import REGISTRY

MeasureFn = Callable[[Plan, int, int], Trial]
"""``measure(plan, index, total) -> Trial``: how the search measures one plan (``TrialRunner.run`` in ``fit``)."""

EstimateFn = Callable[[Sequence[Plan]], Sequence[Trial]]
"""``estimate(plans) -> trials``: dry runs of plans on fake tensors
(:func:`memlab.estimation.estimate.estimate_plans`).
"""

ESTIMATES_AT_ONCE = 4
"""Plans estimated together when the search needs an estimate (the fake model is built once per call)."""


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
        device_type: where the plans run ("cpu": offload and paged optimizers run as the plans without them).
        estimate: dry runs on fake tensors, asked for plans whose peak rests on a part nothing has shown yet.
        max_trials: measure at most this many plans (None: no limit); the plans left are skipped, with why.

    Example:
        >>> from memlab.search.space import candidate_plans
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
        device_type: str | None = None,
        estimate: EstimateFn | None = None,
        max_trials: int | None = None,
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
        self.pending: list[Plan] = []
        self.estimate = estimate
        self.max_trials = max_trials
        self.estimates: list[Trial] = []
        self._estimated: set[Plan] = set()
        self._ranks = {plan.lora_rank for plan in self.candidates if with_adapter(plan)}
        for plan in self.candidates:
            same = runs_as(plan, device_type) if device_type is not None else plan
            if same != plan and same in self.candidates:
                why = "; ".join(
                    lever.on_cpu_note for name, lever in REGISTRY.items()
                    if lever.on_cpu_note and getattr(plan, name) != getattr(same, name)
                )
                self.skipped.append((plan, f"same run as {same.label()} on {device_type}: {why}"))
            else:
                self.pending.append(plan)

    @property
    def best(self) -> Trial | None:
        """The fastest measured trial that fits the budget so far."""
        return best_of(self.trials, self.budget)

    def models(self) -> tuple[MemoryModel, SpeedModel]:
        """The memory and speed models fitted to the trials so far."""
        memory = MemoryModel(
            self.trials, trainable_bytes=self.trainable_bytes, batch_size=self.batch_size, estimates=self.estimates
        )
        speed = SpeedModel(
            self.trials, self.candidates, batch_size=self.batch_size, prior=self.prior, margin=self.speed_margin
        )
        return memory, speed

    def next_plan(self) -> Plan | None:
        """Skip what cannot fit or cannot win, then the plan to measure next (None when none is left).

        With an ``estimate`` function, after the first trial, a plan whose predicted peak rests on a part no trial
        or estimate has shown yet is estimated first (with the next few such plans, the search's order), and the
        choice made again.
        """
        while True:
            memory, speed = self.models()
            chosen = self._choose(memory, speed)
            # The first plan is measured as it is (uncapped in fit): its whole breakdown teaches the most.
            if not self.trials or chosen is None or self.estimate is None or memory.knows(chosen):
                return chosen
            if chosen in self._estimated:
                return chosen
            ranked = sorted(self.pending, key=self._order(memory, speed), reverse=True)
            unknown = [plan for plan in ranked if plan not in self._estimated and not memory.knows(plan)]
            batch = [chosen, *[plan for plan in unknown if plan != chosen][: ESTIMATES_AT_ONCE - 1]]
            self._estimated.update(batch)
            self.estimates += [trial for trial in self.estimate([cheap_twin(plan) for plan in batch])]

    def _order(self, memory: MemoryModel, speed: SpeedModel) -> Callable[[Plan], tuple[bool, float, float]]:
        return lambda plan: (memory.predict(plan) <= self.budget, speed.expected(plan), -memory.predict(plan))

    def _choose(self, memory: MemoryModel, speed: SpeedModel) -> Plan | None:
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
            self.pending = [closest[0]]
            return closest[0]
        if not keep:
            return None
        probe = self._memory_probe()
        if probe is not None:
            return probe
        return max(keep, key=self._order(memory, speed))

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
            how = "estimated (dry run on fake tensors)" if plan in self._estimated else "predicted"
            return (
                f"{how} not to fit: peak {format_bytes(predicted)}, more than {self.fit_margin - 1:.0%} over "
                f"the budget {format_bytes(self.budget)}"
            )
        if best is not None and best.samples_per_s is not None:
            twin = self._measured_faster_twin(plan)
            if twin is not None:
                return (
                    f"cannot beat the best: it does the work of {twin.label} and more, and {twin.label} fits "
                    f"({axis_number(twin.samples_per_s or 0)} samples/s)"
                )
            # Beaten only beyond the noise: the most the plan may do (a measured twin: its interval's high end) is at
            # most the least that the best's median may be.
            bound = speed.upper(plan)
            slowest_best = speed_range(best)[0]
            if bound <= slowest_best:
                return (
                    f"cannot beat the best: at most {axis_number(bound)} samples/s predicted, "
                    f"{best.label} ran at {axis_number(best.samples_per_s)} "
                    f"(at least {axis_number(slowest_best)} within its noise)"
                )
        return None

    def _measured_faster_twin(self, plan: Plan) -> Trial | None:
        """A measured trial that fits and does ``plan``'s work or less (:func:`faster_twins`): ``plan`` is at most
        as fast, so it can tie that trial but never beat it."""
        fitting = {trial.plan: trial for trial in self.trials
                   if fits(trial, self.budget) and trial.host_fits and trial.samples_per_s}
        return next((fitting[twin] for twin in faster_twins(plan, self._ranks) if twin in fitting), None)

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

    def run(self, measure: MeasureFn, on_step: Callable[[int], None] | None = None) -> SearchResult:
        """Measure candidates one at a time until none left can fit and win (see the module docstring).

        ``measure(plan, index, total)`` returns the plan's Trial; ``on_step(done)`` is told how many candidates are
        settled (measured or skipped) after each step, for a progress bar.

        Example:
            >>> from memlab.search.space import candidate_plans
            >>> def fake(plan, index, total):  # smaller micro-batches: less memory, slower
            ...     rows = plan.micro_batch or 8
            ...     peak = 100 + 50 * rows
            ...     status = "ok" if peak <= 400 else "oom"
            ...     return Trial(plan, status, peak, {"params": 50, "activations": 50 * rows}, 1.0,
            ...                  10.0 * rows ** 0.5 if status == "ok" else None, None, "cpu", budget=400)
            >>> search = Search(candidate_plans(8, {}), budget=400, batch_size=8, trainable_bytes=50)
            >>> result = search.run(fake)
            >>> result.best.label, len(result.trials), len(search.candidates)
            ('mb4x2', 3, 4)
        """
        total = len(self.candidates)
        while (plan := self.next_plan()) is not None:
            if self.max_trials is not None and len(self.trials) >= self.max_trials:
                self._stop_at_the_limit()
                break
            if on_step is not None:
                on_step(len(self.trials) + len(self.skipped))
            self.record(measure(plan, len(self.trials), total))
        if on_step is not None:
            on_step(total)
        return SearchResult(self.trials, self.skipped, self.best)

    def _stop_at_the_limit(self) -> None:
        """Skip every plan still pending, each with its expected speed, because ``max_trials`` were measured."""
        memory, speed = self.models()
        ranked = sorted(self.pending, key=self._order(memory, speed), reverse=True)
        for plan in ranked:
            self.skipped.append((
                plan,
                f"not measured: fit measures at most max_trials={self.max_trials} plans (raise it to measure more); "
                f"expected {axis_number(speed.expected(plan))} samples/s, "
                f"predicted peak {format_bytes(memory.predict(plan))}",
            ))
        self.pending = []

    def record(self, trial: Trial) -> None:
        """Add a measured trial (its plan leaves the pending list)."""
        self.trials.append(trial)
        if trial.plan in self.pending:
            self.pending.remove(trial.plan)


def cheap_twin(plan: Plan) -> Plan:
    """The plan to estimate for ``plan``: the same techniques and micro-batch with at most 2 micro-batches (an
    estimate runs every micro-batch, and memory depends only on whether gradients are held between them).

    Example:
        >>> cheap_twin(Plan(micro_batch=1, accumulation=8, checkpointing=True)).label()
        'mb1x2 ckpt'
    """
    return plan.replace(accumulation=min(plan.accumulation, 2))


@dataclass
class SearchResult:
    """What :meth:`Search.run` did: the trials in the order measured, the plans skipped with the reason."""

    trials: list[Trial]
    skipped: list[tuple[Plan, str]]
    best: Trial | None
