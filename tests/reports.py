"""Reports as a budget search makes them, built from numbers rather than runs: for tests of figures and tables,
which are about layout, not about what a model measures."""

from __future__ import annotations

from memlab.plan import Plan, parse_grid
from memlab.report import Report, Trial

MIB = 1024**2


def plans(count: int) -> list[Plan]:
    """``count`` different plans, as a budget search makes them."""
    grid = parse_grid(
        ["micro_batch=all,1,2,4,8", "checkpointing=off,on", "precision=fp32,bf16", "optimizer=adamw,adamw8bit"]
    )
    grid += parse_grid(["micro_batch=1,2,4,8,16", "offload=optimizer", "checkpointing=off,on", "precision=fp32,bf16"])
    grid += [Plan(micro_batch=size, accumulation=64 // size) for size in (1, 2, 4, 8, 16, 32, 64)] * 40
    return grid[:count]


def report_of(count: int, *, budget_mib: float | None = 2048, error_at: int | None = None) -> Report:
    """``count`` trials: most ran (timed six times, so each has an interval), every ninth ran out of memory."""
    trials = []
    for index, plan in enumerate(plans(count)):
        peak = int((300 + 37 * (index % 50)) * MIB)
        if index == error_at:
            trials.append(Trial(plan, "error", 0, {}, None, None, None, "cpu", error="RuntimeError: <lambda> & 'x'"))
        elif index % 9 == 4:
            trials.append(Trial(plan, "oom", peak, {}, None, None, None, "cpu", error="out of memory"))
        else:
            speed = 10.0 + index % 7
            times = tuple(8 / speed * (1 + 0.02 * step) for step in range(6))
            parts = {"params": peak // 4, "grads": peak // 4, "optimizer": peak // 4, "activations": peak // 8}
            trial = Trial(plan, "ok", peak, parts, 8 / speed, speed, None, "cpu", rows_per_step=8, step_times=times)
            trials.append(trial)
    return Report(trials, budget=None if budget_mib is None else int(budget_mib * MIB))
