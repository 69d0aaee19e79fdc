"""The search's logic and strategy (memlab.search), on fake trials from formulas and synthetic landscapes.

Issue 4 (fit): the search's pure logic, with fake trials from formulas (no model runs).

The search's strategy on synthetic landscapes: what it skips, where it stops, what it says of the plans it left, and
the suggestions when nothing fits (the landscapes are in test_strategy.py)."""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from memlab.errors import MemlabError
from memlab.plan import Plan
from memlab.report import Trial
from memlab.search import (
    FIT_MARGIN,
    SPEED_MARGIN,
    Line,
    MemoryModel,
    Search,
    SpeedModel,
    best_of,
    candidate_plans,
    default_space,
    divisors,
    faster_twins,
    fit_line,
    micro_batch_of,
    needs_at_least,
    one_point_line,
    runs_as,
    speed_prior,
)

KIB = 1024


# --- fake landscapes -----------------------------------------------------------------------------------------


@dataclass
class Landscape:
    """A made-up model: memory parts and speed of every plan from formulas, and a fake ``measure``.

    Activations are ``intercept + per_row * micro_batch`` per (checkpointing, precision, activation offload); speed
    is ``base * (micro_batch / batch) ** exponent`` times a ratio per technique, times ``(micro_batch / batch) **
    interaction`` for half precision (its gain grows with the micro-batch, which the search's model does not know).
    """

    activations: Mapping[tuple[bool, str, bool], tuple[float, float]]
    batch_size: int = 8
    params: int = 1000 * KIB
    trainable: int | None = None
    adamw8bit_fraction: float = 0.3
    ratios: Mapping[tuple[str, Any], float] = field(default_factory=dict)
    exponent: float = 0.3
    interaction: float = 0.0
    device: str = "cpu"
    noise: float = 0.0
    seed: int = 0
    measured: list[Plan] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.trainable = self.trainable or self.params
        self.rng = random.Random(self.seed)

    def parts(self, plan: Plan) -> dict[str, int]:
        assert self.trainable is not None
        size = micro_batch_of(plan, self.batch_size)
        optimizer = 2 * self.trainable * (self.adamw8bit_fraction if plan.optimizer == "adamw8bit" else 1.0)
        intercept, per_row = self.activations[(plan.checkpointing, plan.precision, plan.offloads_activations)]
        return {
            "params": self.params,
            "optimizer": 0 if plan.offloads_optimizer else int(optimizer),
            "grads": self.trainable if plan.accumulation > 1 else 0,
            "activations": int(intercept + per_row * size),
            "other": 10 * KIB,
        }

    def peak(self, plan: Plan) -> int:
        return sum(self.parts(plan).values())

    def speed(self, plan: Plan, noisy: bool = False) -> float:
        share = micro_batch_of(plan, self.batch_size) / self.batch_size
        speed = 100.0 * share**self.exponent
        for name in ("checkpointing", "precision", "optimizer", "offload"):
            speed *= self.ratios.get((name, getattr(plan, name)), 1.0)
        if plan.precision != "fp32":
            speed *= share**self.interaction
        return speed * math.exp(self.rng.gauss(0.0, self.noise)) if noisy and self.noise else speed

    def measure(self, budget: int, *, first_uncapped: bool = True):
        """A fake ``measure``; like ``fit``, it runs the first plan without the budget's cap."""

        def run(plan: Plan, index: int, total: int) -> Trial:
            self.measured.append(plan)
            if self.peak(plan) > budget and not (first_uncapped and index == 0):
                # As the real tracker does: the step stops at the first allocation over the budget, and the
                # parameters (in place before the step) are in the breakdown.
                reached = max(budget + 1, self.params)
                return Trial(plan, "oom", reached, {"params": self.params}, None, None, None,
                             self.device, error="OutOfMemoryError: memlab budget", budget=budget)
            speed = self.speed(plan, noisy=True)
            return Trial(plan, "ok", self.peak(plan), self.parts(plan), self.batch_size / speed, speed, None,
                         self.device, rows_per_step=self.batch_size, budget=None if index == 0 else budget)

        return run

    def space(self) -> dict[str, list[Any]]:
        return default_space(self.batch_size, self.device)

    def plain_peak(self) -> int:
        return self.peak(Plan(micro_batch=self.batch_size))

    def fit(self, budget: int, space: Mapping[str, list[Any]] | None = None):
        self.measured.clear()
        candidates = candidate_plans(self.batch_size, {**self.space(), **(space or {})})
        assert self.trainable is not None
        search = Search(
            candidates, budget=budget, batch_size=self.batch_size, trainable_bytes=self.trainable,
            prior=speed_prior(self.device),
        )
        result = search.run(self.measure(budget))
        return candidates, result

    def grid_best(self, budget: int, candidates: list[Plan]) -> Plan | None:
        fitting = [plan for plan in candidates if self.peak(plan) <= budget]
        return max(fitting, key=lambda plan: (self.speed(plan), -self.peak(plan))) if fitting else None


def gpt2_like(**speed: Any) -> Landscape:
    """Memory from a measured tiny GPT-2 (8 rows x 16 tokens) on CPU: bf16 autocast adds weight copies."""
    return Landscape(
        {
            (False, "fp32", False): (16 * KIB, 147 * KIB),
            (True, "fp32", False): (19 * KIB, 82 * KIB),
            (False, "bf16", False): (56 * KIB, 92 * KIB),
            (True, "bf16", False): (44 * KIB, 47 * KIB),
        },
        params=124 * KIB,
        adamw8bit_fraction=0.26,
        **speed,
    )


def gpu_like() -> Landscape:
    """A GPU: bf16 twice as fast and better with bigger micro-batches, offload slow, batch 32 (144 plans)."""
    return Landscape(
        {
            (False, "fp32", False): (100 * KIB, 900 * KIB),
            (True, "fp32", False): (100 * KIB, 200 * KIB),
            (False, "bf16", False): (2000 * KIB, 500 * KIB),
            (True, "bf16", False): (2000 * KIB, 120 * KIB),
            (False, "fp32", True): (100 * KIB, 50 * KIB),
            (True, "fp32", True): (100 * KIB, 20 * KIB),
            (False, "bf16", True): (2000 * KIB, 30 * KIB),
            (True, "bf16", True): (2000 * KIB, 10 * KIB),
        },
        batch_size=32,
        params=4000 * KIB,
        ratios={
            ("checkpointing", True): 0.72,
            ("precision", "bf16"): 2.2,
            ("optimizer", "adamw8bit"): 0.97,
            ("offload", "optimizer"): 0.6,
            ("offload", "all"): 0.4,
        },
        interaction=0.2,
        device="cuda",
    )


def lora_like() -> Landscape:
    """Frozen base weights: few trainable bytes, so activations decide; batch 16."""
    return Landscape(
        {
            (False, "fp32", False): (0, 1500 * KIB),
            (True, "fp32", False): (50 * KIB, 300 * KIB),
            (False, "bf16", False): (4000 * KIB, 800 * KIB),
            (True, "bf16", False): (4000 * KIB, 160 * KIB),
        },
        batch_size=16,
        params=8000 * KIB,
        trainable=100 * KIB,
        ratios={("checkpointing", True): 0.7, ("precision", "bf16"): 1.5},
    )


LANDSCAPES = {
    "gpt2-cpu-bf16-slow": lambda: gpt2_like(
        ratios={("checkpointing", True): 0.8, ("precision", "bf16"): 0.9, ("optimizer", "adamw8bit"): 0.97}
    ),
    "gpt2-cpu-bf16-fast": lambda: gpt2_like(
        ratios={("checkpointing", True): 0.8, ("precision", "bf16"): 1.3, ("optimizer", "adamw8bit"): 1.02}
    ),
    "gpu": gpu_like,
    "lora": lora_like,
}


# --- the space -----------------------------------------------------------------------------------------------


def test_divisors_and_default_space_per_device():
    assert divisors(8) == [8, 4, 2, 1] and divisors(1) == [1] and divisors(6) == [6, 3, 2, 1]
    cpu = default_space(8)
    assert cpu == {
        "micro_batch": [8, 4, 2, 1],
        "checkpointing": [False, True],
        "precision": ["fp32", "bf16"],
        "optimizer": ["adamw", "adamw8bit"],
        "offload": ["none"],
    }
    assert default_space(8, "cuda", bf16_supported=False)["precision"] == ["fp32", "fp16"]
    assert default_space(8, "cuda")["offload"] == ["none", "optimizer", "all"]


def test_candidates_keep_the_effective_batch_and_list_largest_micro_batch_first():
    plans = candidate_plans(8, default_space(8), batch_rows=8)
    assert len(plans) == 32 == len(set(plans))
    assert all(plan.rows_per_step(8) == 8 for plan in plans)
    assert plans[0] == Plan()  # the full batch given is written micro_batch=None: "plain"
    assert [micro_batch_of(p, 8) for p in plans] == sorted((micro_batch_of(p, 8) for p in plans), reverse=True)
    restricted = candidate_plans(8, {"micro_batch": [None, 2], "precision": ["fp32"]}, batch_rows=4)
    assert [p.label() for p in restricted] == ["mb8x1", "mb2x4"]


@pytest.mark.parametrize(
    "space, message",
    [
        ({"micro_batch": [3]}, "does not divide batch_size=8; write divisors of 8: 8, 4, 2, 1"),
        ({"accumulation": [2]}, "restrict micro_batch instead"),
        ({"precison": ["bf16"]}, "not a plan setting"),
        ({"precision": "bf16"}, "must be a list"),
        ({"precision": ["fp8"]}, "write one of fp32, bf16, fp16"),
        ({"optimizer": []}, "the space is empty"),
    ],
)
def test_bad_spaces_say_what_to_write(space, message):
    with pytest.raises(MemlabError, match=message):
        candidate_plans(8, space)


def test_needs_at_least_only_where_memory_is_monotone():
    small = Plan(micro_batch=2, accumulation=4, checkpointing=True, optimizer="adamw8bit")
    assert needs_at_least(Plan(micro_batch=4, accumulation=2), small, 8)
    assert needs_at_least(small, small, 8)
    assert not needs_at_least(Plan(micro_batch=1, accumulation=8), small, 8)  # fewer rows
    assert not needs_at_least(Plan(micro_batch=4, accumulation=2, precision="bf16"), small, 8)  # not monotone
    big = Plan(micro_batch=4, accumulation=2)
    assert not needs_at_least(big.replace(checkpointing=True), big, 8)
    assert not needs_at_least(big.replace(optimizer="adamw8bit"), big, 8)
    # Without accumulation no gradient is held during the forward: never compared with accumulating plans.
    assert not needs_at_least(Plan(micro_batch=8), Plan(micro_batch=4, accumulation=2), 8)


# --- memory model --------------------------------------------------------------------------------------------


def ran(plan: Plan, activations: int, *, optimizer: int = 200, grads: int = 100, speed: float = 10.0) -> Trial:
    parts = {"params": 100, "grads": grads, "optimizer": optimizer, "activations": activations, "other": 0}
    return Trial(plan, "ok", sum(parts.values()), parts, 1.0, speed, None, "cpu", rows_per_step=8)


def test_lines_through_measured_sizes_and_safe_single_points():
    assert fit_line([(1, 150.0), (8, 1200.0)]) == Line(0.0, 150.0)
    line = fit_line([(2, 300.0), (4, 500.0), (8, 900.0)])
    assert (line.intercept, line.per_row) == (pytest.approx(100.0), pytest.approx(100.0))
    line = one_point_line(4, 400.0, intercept=40.0)
    assert line.at(1) == pytest.approx(130.0) and line.at(4) == 400.0
    assert line.at(8) == 400.0  # above the one size measured: no growth assumed without evidence
    assert one_point_line(4, 400.0, at_least=[(8, 1000.0)]).at(8) == 1000.0


def test_memory_model_predicts_a_measured_landscape():
    landscape = gpt2_like()
    plans = candidate_plans(8, landscape.space())
    measured = [Plan(micro_batch=8), Plan(micro_batch=1, accumulation=8), Plan(micro_batch=8, checkpointing=True),
                Plan(micro_batch=8, precision="bf16"), Plan(micro_batch=2, accumulation=4, precision="bf16"),
                Plan(micro_batch=8, optimizer="adamw8bit")]
    trials = [landscape.measure(10**9)(plan, 0, 1) for plan in measured]
    model = MemoryModel(trials, trainable_bytes=124 * KIB, batch_size=8)
    for plan in plans:
        error = model.predict(plan) / landscape.peak(plan) - 1
        # Known lines are exact; checkpointing (one size measured) and ckpt + bf16 (from the measured ratios) are
        # close, and never so high that a plan which fits would be skipped for memory.
        assert -0.2 <= error < FIT_MARGIN - 1, (plan.label(), error)
        if not plan.checkpointing:
            assert error == pytest.approx(0.0, abs=0.01), plan.label()


def test_memory_model_assumes_the_least_where_nothing_was_measured():
    plain = Plan(micro_batch=4, accumulation=2)
    model = MemoryModel([ran(plain, 400)], trainable_bytes=100, batch_size=8)
    assert model.optimizer_bytes(plain.replace(optimizer="adamw8bit")) == 50  # a quarter of AdamW's measured 200
    assert model.activations(plain.replace(checkpointing=True)) == 0  # never measured: might save everything
    assert model.predict(plain.replace(checkpointing=True)) == 400
    nothing = MemoryModel([], trainable_bytes=100, batch_size=8)
    assert nothing.predict(Plan(micro_batch=8)) == 100 + 200 + 100  # params, AdamW moments, gradients
    oom = Trial(Plan(micro_batch=8), "oom", 5000, {"params": 4000}, None, None, None, "cpu")
    assert MemoryModel([oom], trainable_bytes=100, batch_size=8).common == 4000


def test_out_of_memory_trials_raise_the_activation_floor():
    small = ran(Plan(micro_batch=1, accumulation=8), 100)
    oom = Trial(Plan(micro_batch=8), "oom", 2400, {"params": 100}, None, None, None, "cpu")
    model = MemoryModel([small, oom], trainable_bytes=100, batch_size=8)
    # At 8 rows activations were at least 2400 - params 100 - AdamW 200 = 2100 bytes: 2000 more over 7 rows,
    # and (a line with a non-negative intercept) at least half of that at 4 rows, more than the line says.
    assert model.activations(Plan(micro_batch=8)) == pytest.approx(2100)
    assert model.activation_line(Plan(micro_batch=4, accumulation=2)).at(4) == pytest.approx(100 + 3 * 2000 / 7)
    assert model.activations(Plan(micro_batch=4, accumulation=2)) == pytest.approx(2100 / 2)


# --- speed model ---------------------------------------------------------------------------------------------


def test_speed_is_predicted_only_where_the_measurements_determine_it():
    plans = candidate_plans(8, {"micro_batch": [8, 4], "checkpointing": [False, True], "precision": ["fp32", "bf16"]})
    plain, bf16, ckpt, both = plans[:4]
    model = SpeedModel([ran(plain, 0, speed=10), ran(bf16, 0, speed=20)], plans, batch_size=8)
    assert model.predict(bf16) == pytest.approx(20)
    assert model.predict(ckpt) is None  # checkpointing never measured...
    assert model.upper(ckpt) == 10  # ...but it recomputes: at most as fast as plain
    model = SpeedModel([ran(plain, 0, speed=10), ran(bf16, 0, speed=20), ran(ckpt, 0, speed=8)], plans, batch_size=8)
    assert model.predict(both) == pytest.approx(16)
    assert model.upper(both) == pytest.approx(16 / SPEED_MARGIN)
    smaller = both.replace(micro_batch=4, accumulation=2)
    assert model.predict(smaller) is None
    assert model.upper(smaller) == pytest.approx(16 / SPEED_MARGIN)  # at most its larger-micro-batch twin
    assert model.upper(plain.replace(micro_batch=4, accumulation=2)) == 10  # a measured twin bounds exactly
    prior = speed_prior("cuda")
    unmeasured = SpeedModel([], plans, batch_size=8, prior=prior)
    assert unmeasured.expected(bf16) > unmeasured.expected(plain) > unmeasured.expected(ckpt)


# --- the stop rule -------------------------------------------------------------------------------------------


def test_stop_rule_speed_margin():
    """A determined plan is measured only when predicted faster than SPEED_MARGIN (0.9) x the best so far."""
    # Levers that may make a step faster or slower (checkpointing could only slow it: see the twin tests).
    plans = candidate_plans(8, {"micro_batch": [8], "optimizer": ["adamw", "adamw8bit"], "precision": ["fp32", "bf16"]})
    plain, bf16, eight_bit, both = plans
    for eight_bit_speed, measured in ((8.0, False), (9.6, True)):
        search = Search(plans, budget=10**6, batch_size=8, trainable_bytes=100)
        for plan, speed in ((plain, 10.0), (bf16, 10.0), (eight_bit, eight_bit_speed)):
            search.pending.remove(plan)
            search.record(ran(plan, 100, speed=speed))
        # 8-bit + bf16 is predicted at its 8-bit speed: 0.8 x best is skipped, 0.96 x best is measured.
        assert (search.next_plan() == both) is measured
        if not measured:
            assert search.skipped[0][0] == both and search.skipped[0][1].startswith("cannot beat the best")


def test_stop_rule_fit_margin():
    """A plan is skipped for memory only when predicted over FIT_MARGIN (1.1) x the budget; borderline is measured."""
    plans = candidate_plans(8, {"micro_batch": [8, 4, 2, 1]})
    # Activations 100 + 100 per row: 200 at 1 row, 900 at 8; with params, AdamW and gradients (400) the model
    # predicts 900 bytes for 4 rows.
    measured = [ran(plans[0], 900, grads=0, speed=10.0), ran(plans[3], 200, speed=5.0)]
    assert MemoryModel(measured, trainable_bytes=100, batch_size=8).predict(plans[1]) == pytest.approx(900)
    assert FIT_MARGIN == 1.1
    for budget, measures_it in ((900 / 1.05, True), (900 / 1.15, False)):
        search = Search(plans, budget=int(budget), batch_size=8, trainable_bytes=100)
        for trial in measured:
            search.record(trial)
        assert search.next_plan() is not None
        reasons = {p.label(): reason for p, reason in search.skipped}
        assert (plans[1] in search.pending) is measures_it  # measured after plans predicted to fit
        assert reasons.get("mb4x2", "").startswith("predicted not to fit") is not measures_it


# --- whole searches ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(LANDSCAPES))
@pytest.mark.parametrize("budget_share", [1.2, 0.9, 0.6, 0.45, 0.3])
def test_search_finds_the_grids_winner_with_fewer_trials(name, budget_share):
    landscape = LANDSCAPES[name]()
    budget = int(landscape.plain_peak() * budget_share)
    candidates, result = landscape.fit(budget)
    expected = landscape.grid_best(budget, candidates)
    assert (result.best.plan if result.best else None) == expected
    assert len(result.trials) < len(candidates)
    if budget_share >= 0.6:
        assert len(result.trials) <= 0.5 * len(candidates)
    # Every candidate is either measured once or skipped with a reason; the answer was measured and fits.
    measured = [t.plan for t in result.trials]
    assert len(measured) == len(set(measured)) and measured == landscape.measured
    assert sorted(map(repr, measured + [p for p, _ in result.skipped])) == sorted(map(repr, candidates))
    assert all(reason for _, reason in result.skipped)
    if result.best is not None:
        assert result.best.peak_bytes <= budget and result.best is best_of(result.trials, budget)


def test_search_with_noisy_speeds_stays_close_to_the_best():
    shortfalls = []
    for seed in range(6):
        landscape = gpt2_like(ratios={("checkpointing", True): 0.8, ("precision", "bf16"): 1.1}, noise=0.05, seed=seed)
        budget = int(landscape.plain_peak() * 0.6)
        candidates, result = landscape.fit(budget)
        expected = landscape.grid_best(budget, candidates)
        assert result.best is not None and expected is not None
        shortfalls.append(1 - landscape.speed(result.best.plan) / landscape.speed(expected))
    assert max(shortfalls) < 0.15 and sum(shortfalls) / len(shortfalls) < 0.05, shortfalls


@pytest.mark.parametrize("name, most", [("gpt2-cpu-bf16-slow", 8), ("gpu", 6)])
def test_a_generous_budget_needs_few_trials(name, most):
    """On a GPU larger micro-batches are never slower, so the full batch rules the rest out; on a CPU each micro-batch
    size (4 here) is measured once, with the techniques that might be faster."""
    landscape = LANDSCAPES[name]()
    candidates, result = landscape.fit(landscape.plain_peak() * 2)
    assert result.best is not None and result.best.plan == landscape.grid_best(landscape.plain_peak() * 2, candidates)
    assert len(result.trials) <= most


def test_nothing_fits_measures_little_and_reports_why():
    landscape = lora_like()
    budget = landscape.params // 2
    candidates, result = landscape.fit(budget)
    assert result.best is None
    assert 1 <= len(result.trials) <= 2 and not any(t.peak_bytes <= budget for t in result.trials)
    assert {reason.split(":")[0] for _, reason in result.skipped} <= {"cannot fit", "predicted not to fit"}
    tiny = gpt2_like()
    candidates, result = tiny.fit(1000)  # below the parameters: known before measuring anything
    assert result.best is None and len(result.trials) == 1 and len(result.skipped) == len(candidates) - 1


def test_a_restricted_space_is_respected():
    landscape = gpu_like()
    budget = int(landscape.plain_peak() * 0.6)
    space = {"micro_batch": [32, 16, 8], "precision": ["bf16"], "offload": ["none"]}
    candidates, result = landscape.fit(budget, space=space)
    assert len(candidates) == 3 * 2 * 1 * 2 * 1
    assert all(p.precision == "bf16" and p.offload == "none" for p in landscape.measured)
    assert result.best is not None and result.best.plan == landscape.grid_best(budget, candidates)


def _timed(plan: Plan, step_times: tuple[float, ...], rows: int = 8) -> Trial:
    median = sorted(step_times)[len(step_times) // 2]
    return Trial(plan, "ok", 100, {"params": 10}, median, rows / median, None, "cuda:0", rows_per_step=rows,
                 step_times=step_times, budget=1000)


@pytest.mark.parametrize(("twin_times", "skipped"), [((1.02, 1.05, 1.08), False), ((1.5, 1.55, 1.6), True)])
def test_a_plan_is_ruled_out_for_speed_only_beyond_the_noise(twin_times, skipped) -> None:
    # On a GPU mb4x2 ckpt is at most as fast as its twin mb8x1 ckpt. The twin measured a little slower than the
    # best (plain), inside the best's noise: mb4x2 ckpt may still win and must be measured; far slower, it cannot.
    plans = candidate_plans(8, {"micro_batch": [8, 4], "checkpointing": [False, True], "precision": ["fp32"],
                                "optimizer": ["adamw"], "offload": ["none"]})
    search = Search(plans, budget=1000, batch_size=8, trainable_bytes=10, prior=speed_prior("cuda"))
    best = _timed(Plan(micro_batch=8), (0.9, 1.0, 1.1))
    search.record(best)
    search.record(_timed(Plan(micro_batch=8, checkpointing=True), twin_times))
    memory, speed = search.models()
    reason = search.skip_reason(Plan(micro_batch=4, accumulation=2, checkpointing=True), memory, speed, search.best)
    assert (reason is not None and reason.startswith("cannot beat the best")) is skipped


# --- issue 15: the whole space, adapters included ------------------------------------------------------------


def test_chunked_and_full_loss_trials_do_not_share_an_activation_line():
    full = ran(Plan(micro_batch=4, accumulation=2), 400)
    model = MemoryModel([full], trainable_bytes=100, batch_size=8)
    chunked = Plan(micro_batch=4, accumulation=2, loss="chunked")
    assert model.activations(full.plan) == 400
    assert model.activations(chunked) == 0  # never measured: it might save everything, so it is not ruled out
    both = MemoryModel([full, ran(chunked, 150)], trainable_bytes=100, batch_size=8)
    assert both.activations(chunked) == 150 and both.activations(full.plan) == 400


def test_unmeasured_optimizers_are_assumed_to_hold_the_least_they_can():
    plain = Plan(micro_batch=4, accumulation=2)
    model = MemoryModel([ran(plain, 400, optimizer=800)], trainable_bytes=100, batch_size=8)
    assert model.optimizer_bytes(plain.replace(optimizer="adamw8bit")) == 200  # a quarter of AdamW's
    # Adafactor's factored state is a row and a column per matrix; paged state leaves the allocator on CUDA.
    assert model.optimizer_bytes(plain.replace(optimizer="adafactor")) == 0
    assert model.optimizer_bytes(plain.replace(optimizer="paged_adamw8bit")) == 0
    adafactor = ran(plain.replace(optimizer="adafactor"), 400, optimizer=30)
    measured = MemoryModel([ran(plain, 400, optimizer=800), adafactor], trainable_bytes=100, batch_size=8)
    assert measured.optimizer_bytes(plain.replace(optimizer="adafactor", checkpointing=True)) == 30


def test_estimates_fill_the_parts_no_trial_measured_and_trials_win_where_both_exist():
    lora = Plan(micro_batch=4, accumulation=2, adapter="lora")
    estimated = Trial(lora, "ok", 900, {"params": 500, "grads": 20, "optimizer": 80, "activations": 300,
                                         "other": 0}, None, None, None, "cpu", estimated=True)
    plain = ran(Plan(micro_batch=4, accumulation=2), 400)
    without = MemoryModel([plain], trainable_bytes=100, batch_size=8)
    model = MemoryModel([plain], trainable_bytes=100, batch_size=8, estimates=[estimated])
    assert not without.knows(lora) and model.knows(lora)
    assert without.predict(lora) < 900 == model.predict(lora)
    # The estimate's parts serve every plan that shares them: another optimizer keeps the adapter's parameters.
    assert model.fixed_bytes(lora.replace(optimizer="adamw8bit")) == 500 + 80 / 4
    measured = MemoryModel([plain, ran(lora, 250)], trainable_bytes=100, batch_size=8, estimates=[estimated])
    assert measured.activations(lora) == 250 and measured.predict(lora) == 100 + 100 + 200 + 250


def test_a_plan_is_at_most_as_fast_as_its_twin_without_a_technique_that_only_adds_work():
    lora = Plan(micro_batch=8, adapter="lora", lora_rank=8)
    slower = lora.replace(checkpointing=True, loss="chunked", adapter="qlora")
    assert lora in faster_twins(slower) and len(faster_twins(slower)) == 7
    plans = candidate_plans(8, {"micro_batch": [8], "checkpointing": [False, True], "adapter": ["lora", "qlora"],
                                "lora_rank": [8], "loss": ["full", "chunked"], "precision": ["fp32"]})
    model = SpeedModel([ran(lora, 0, speed=20.0)], plans, batch_size=8, prior=speed_prior("cpu"))
    assert model.predict(slower) is None  # not determined by one trial...
    assert model.upper(slower) == 20.0  # ...but it does LoRA's work and more
    assert model.upper(lora.replace(precision="bf16")) == math.inf  # bf16 may be faster: unknown


def test_plans_that_run_alike_on_a_cpu_are_measured_once():
    plans = candidate_plans(8, {"micro_batch": [8], "offload": ["none", "optimizer", "all"],
                                "optimizer": ["adamw", "adamw8bit", "paged_adamw8bit"], "precision": ["fp32"]})
    assert runs_as(Plan(offload="all", optimizer="paged_adamw8bit"), "cpu") == Plan(optimizer="adamw8bit")
    search = Search(plans, budget=10**6, batch_size=8, trainable_bytes=100, device_type="cpu")
    assert sorted(p.label() for p in search.pending) == ["mb8x1", "mb8x1 adamw8bit"]
    assert len(search.skipped) == len(plans) - 2
    assert all(reason.startswith("same run as ") and " on cpu: " in reason for _, reason in search.skipped)
    on_gpu = Search(plans, budget=10**6, batch_size=8, trainable_bytes=100, device_type="cuda")
    assert len(on_gpu.pending) == len(plans) and not on_gpu.skipped


def test_plans_estimated_not_to_fit_are_skipped_unmeasured():
    landscape = gpt2_like(ratios={("checkpointing", True): 0.8, ("precision", "bf16"): 1.3})
    budget = int(landscape.plain_peak() * 0.45)
    candidates = candidate_plans(8, landscape.space())
    asked: list[Plan] = []

    def estimate(plans):
        asked.extend(plans)
        return [Trial(p, "ok", landscape.peak(p), landscape.parts(p), None, None, None, "cpu", estimated=True)
                for p in plans]

    plain = Search(candidates, budget=budget, batch_size=8, trainable_bytes=124 * KIB, prior=speed_prior("cpu"))
    without = plain.run(landscape.measure(budget))
    landscape.measured.clear()
    search = Search(candidates, budget=budget, batch_size=8, trainable_bytes=124 * KIB, prior=speed_prior("cpu"),
                    estimate=estimate)
    result = search.run(landscape.measure(budget))
    assert asked and all(p.accumulation <= 2 for p in asked)  # estimated with at most 2 micro-batches
    assert result.best is not None and result.best.plan == landscape.grid_best(budget, candidates)
    # Fewer trials, and fewer of them wasted on plans that do not fit.
    assert len(result.trials) < len(without.trials)
    failed = [len([t for t in run.trials if t.status == "oom"]) for run in (result, without)]
    assert failed[0] < failed[1], failed
    assert any(reason.startswith("estimated (dry run on fake tensors) not to fit") for _, reason in result.skipped)


def test_a_plan_whose_faster_twin_was_measured_and_fits_is_not_measured():
    # ckpt does plain's work and more: once plain fits, ckpt can tie it but never beat it, however its interval falls.
    plans = candidate_plans(8, {"micro_batch": [8], "checkpointing": [False, True], "precision": ["fp32"]})
    search = Search(plans, budget=10**6, batch_size=8, trainable_bytes=100)
    plain = Trial(plans[0], "ok", 900, {"params": 100}, 0.1, 80.0, None, "cpu", rows_per_step=8,
                  step_times=(0.08, 0.1, 0.12, 0.09, 0.11, 0.1))  # a wide interval: the old bound let ckpt through
    search.record(plain)
    assert search.next_plan() is None
    [(skipped, reason)] = search.skipped
    assert skipped.checkpointing and reason.startswith("cannot beat the best: it does the work of mb8x1 and more")


def test_the_search_stops_at_max_trials_and_says_why_for_each_plan_left():
    landscape = LANDSCAPES["gpt2-cpu-bf16-fast"]()
    budget = int(landscape.plain_peak() * 0.45)
    candidates = candidate_plans(8, landscape.space())
    unlimited = Search(candidates, budget=budget, batch_size=8, trainable_bytes=124 * KIB, prior=speed_prior("cpu"))
    everything = unlimited.run(landscape.measure(budget))
    assert len(everything.trials) > 3
    landscape.measured.clear()
    search = Search(candidates, budget=budget, batch_size=8, trainable_bytes=124 * KIB, prior=speed_prior("cpu"),
                    max_trials=3)
    result = search.run(landscape.measure(budget))
    assert len(result.trials) == 3 and [t.plan for t in result.trials] == [t.plan for t in everything.trials[:3]]
    limited = [reason for _, reason in result.skipped if "max_trials=3" in reason]
    assert limited and all("expected" in reason and "predicted peak" in reason for reason in limited)
    assert len(result.trials) + len(result.skipped) == len(candidates)


@pytest.mark.parametrize("max_trials", [0, -1, True, 2.5, "15"])
def test_fit_refuses_a_max_trials_that_is_not_a_whole_number(max_trials):
    import torch

    from memlab.search import fit

    model = torch.nn.Linear(4, 1)
    before = model.weight.detach().clone()
    with pytest.raises(MemlabError, match="write a whole number >= 1, e.g. max_trials=15"):
        fit(model, torch.randn(2, 4), budget="1MiB", loss_fn=lambda m, b: m(b).sum(), max_trials=max_trials)
    assert torch.equal(model.weight, before)


def test_suggestions_consider_adafactor_where_the_space_left_it_out():
    from memlab.report import Trial
    from memlab.search.suggest import OUTSIDE_THE_SPACE, alternatives

    assert {"optimizer": "adafactor"} in OUTSIDE_THE_SPACE
    low = Trial(Plan(), "oom", 90, {}, None, None, None, "cpu")
    plans = alternatives([low], default_space(8, "cpu"))
    assert Plan(optimizer="adafactor") in plans
    assert Plan(optimizer="adafactor") not in alternatives([low], {"optimizer": ["adamw", "adafactor"]})


def test_suggestions_are_judged_on_the_card_figure_where_the_estimate_models_it(monkeypatch):
    import importlib

    import torch

    from memlab.options import RunOptions
    from memlab.report import Report, Trial
    from memlab.search.suggest import suggestions

    class EvenPrior:  # every lever value expected as fast
        def ratio(self, name, value):
            return 1.0

    def estimates(model, batch, plans, **options):  # allocated 60 of 100 each; the card 95 for LoRA, 70 otherwise
        return Report([Trial(plan, "ok", 60, {}, None, None, None, "cuda", budget=100, reserved_bytes=62,
                             context_bytes=33 if plan.adapter == "lora" else 8) for plan in plans])

    monkeypatch.setattr(importlib.import_module("memlab.estimation.estimate"), "estimate_plans", estimates)
    low = Trial(Plan(), "oom", 190, {}, None, None, None, "cpu")
    options = RunOptions(budget=100, loss_fn=lambda m, b: m(b).sum())
    suggested = suggestions(torch.nn.Linear(4, 1), torch.randn(2, 4), [low], default_space(8, "cpu"), options,
                            EvenPrior())
    assert suggested and all(trial.verdict_figure == "card" for trial in suggested)
    assert all(trial.plan.adapter != "lora" for trial in suggested)  # its allocated 60 fits; its card 95 does not


def test_suggestions_estimate_only_alternatives_whose_least_parameters_leave_room(monkeypatch):
    import importlib

    import torch

    from memlab.options import RunOptions
    from memlab.report import Report, Trial
    from memlab.search.suggest import suggestions

    class EvenPrior:
        def ratio(self, name, value):
            return 1.0

    estimated: list[Plan] = []

    def estimates(model, batch, plans, **options):  # each estimated plan needs exactly its least parameters
        estimated.extend(plans)
        return Report([Trial(plan, "ok", 10, {}, None, None, None, "cpu", budget=options["budget"]) for plan in plans])

    monkeypatch.setattr(importlib.import_module("memlab.estimation.estimate"), "estimate_plans", estimates)
    # 800 bytes of parameters measured: pure bf16 weights hold at least 400, QLoRA's 4-bit base 100, LoRA and
    # Adafactor all 800. With a budget of 300 only QLoRA leaves the margin (100 x 1.1 <= 300).
    low = Trial(Plan(), "oom", 1000, {"params": 800, "activations": 200}, None, None, None, "cpu")
    options = RunOptions(budget=300, loss_fn=lambda m, b: m(b).sum())
    suggested = suggestions(torch.nn.Linear(4, 1), torch.randn(2, 4), [low], default_space(8, "cpu"), options,
                            EvenPrior())
    assert [plan.adapter for plan in estimated] == ["qlora"]
    assert [trial.plan.adapter for trial in suggested] == ["qlora"]
    estimated.clear()
    options = RunOptions(budget=50, loss_fn=lambda m, b: m(b).sum())  # not even QLoRA: nothing is estimated
    assert suggestions(torch.nn.Linear(4, 1), torch.randn(2, 4), [low], default_space(8, "cpu"), options,
                       EvenPrior()) == [] and estimated == []
