"""The search's strategy on synthetic landscapes: what it skips, where it stops, what it says of the plans it left, and
the suggestions when nothing fits (the landscapes are in test_search.py).
"""

from __future__ import annotations

import math

import pytest
from test_search import KIB, LANDSCAPES, gpt2_like, gpu_like, lora_like, ran

from memlab.errors import MemlabError
from memlab.plan import Plan
from memlab.report import Trial
from memlab.search import (
    MemoryModel,
    Search,
    SpeedModel,
    candidate_plans,
    default_space,
    faster_twins,
    runs_as,
    speed_prior,
)


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
