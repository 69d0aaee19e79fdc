"""``memlab.fit`` against the exhaustive grid and the seeds' halve-and-double recipe: trial time and the winner.

On a Llama built from its config, with a budget at ``--budget-fraction`` (default 0.6) of the plain full-batch
plan's peak (measured once first, not counted for anyone), so that a real choice is needed:

- fit: ``memlab.fit(model, batch, budget=B, batch_size=N)`` over its default space.
- grid: ``memlab.compare`` over every plan of the same space (micro_batch over the divisors of N, checkpointing,
  precision, optimizer, and offload on CUDA); its best is the fastest plan that fits.
- recipe (the seeds'): from the plain plan at the full batch, halve the micro-batch and double the accumulation
  until a plan fits; when micro-batch 1 does not fit either, switch the next technique on, in a fixed order
  (checkpointing, then half precision, then 8-bit AdamW), and start again from the full batch. The first plan that
  fits is the answer.

All three run with the same ``steps``, ``warmup`` and budget, ``--repeats`` times (default 2) in mirrored order
(fit, grid, recipe, then recipe, grid, fit), so that a machine getting busier or quieter weighs on each alike;
bitsandbytes is loaded and warmed up before anything is timed. Recorded per method and repeat: each trial's plan,
status, peak, samples/s and wall time, the trial time, and the winner; and over the repeats, the trial time as a
share of the grid's (the goal for fit is at most 30%). Whether a winner is the grid's (same repeat): the same
plan, or else *within noise*: every winner is measured again in ``rounds`` alternating rounds, and a winner is
within noise of the grid's when its median samples/s is at least 90% of the grid winner's, or the two ranges of
re-measured samples/s overlap.

Then, for the levers the search grew since (adapters, pure bf16 weights, Adafactor, paged and fused optimizers,
the chunked loss): fit over the *whole* space (every Plan field with every value, adapters included: thousands of
plans) at several budgets, counting its measured trials (the goal: at most 15) and whether its ``max_trials`` cut
it short; and fit against the exhaustive grid over a smaller space with those levers (``MIXED_SPACE``), both
winners measured again in turn.

On a CPU the benchmark uses one torch thread by default (``--threads``): with two threads on a shared 2-core
machine, OpenMP waits on the other core and step times swing several-fold.

Run from the repository root::

    python -m benchmarks.fit_vs_grid            # --small: CPU, a few minutes
    python -m benchmarks.fit_vs_grid --full     # CUDA GPU, a bigger Llama
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn

from benchmarks import common

NAME = "fit_vs_grid"
GOAL = 0.30
"""fit's trial time as a share of the grid's, at most."""
NOISE_SHARE = 0.9
"""fit's winner is within noise of the grid's when its re-measured median samples/s is at least this share."""
WHOLE_SPACE: dict[str, list[Any]] = {
    "checkpointing": [False, True], "precision": ["fp32", "bf16"], "weights": ["fp32", "bf16"],
    "optimizer": ["adamw", "adamw8bit", "paged_adamw8bit", "adafactor"], "offload": ["none", "optimizer", "all"],
    "adapter": ["none", "lora", "qlora"], "lora_rank": [8, 16], "loss": ["full", "chunked"],
}
"""Every Plan field with every value (micro_batch: every divisor of the batch), adapters included."""
WHOLE_FRACTIONS = (0.3, 0.45, 0.6, 0.8)
"""Budgets (shares of the plain plan's peak) at which fit searches the whole space."""
WHOLE_GOAL = 15
"""Measured trials fit may take over the whole space, at most."""
MIXED_SPACE: dict[str, list[Any]] = {
    "checkpointing": [False, True], "precision": ["fp32"], "weights": ["fp32", "bf16"],
    "optimizer": ["adamw", "adafactor"], "offload": ["none"], "adapter": ["none", "lora"], "loss": ["full"],
}
"""A smaller space with the newer levers, small enough for the exhaustive grid (with three micro-batch sizes: 48
plans). Every axis of fit's default space is named, so that fit searches exactly the grid's plans."""


@dataclass(frozen=True)
class Size:
    """The model (a Llama from its config), the effective batch, and how many steps each trial times."""

    hidden: int
    layers: int
    heads: int
    vocab: int
    batch_size: int
    length: int
    steps: int
    warmup: int
    rounds: int
    repeats: int


SIZES = {
    "smoke": Size(
        hidden=32, layers=2, heads=2, vocab=128, batch_size=2, length=16, steps=1, warmup=1, rounds=1, repeats=1
    ),
    "small": Size(
        hidden=128, layers=4, heads=4, vocab=1024, batch_size=8, length=64, steps=3, warmup=1, rounds=3, repeats=2
    ),
    "full": Size(
        hidden=1024, layers=12, heads=16, vocab=32000, batch_size=16, length=1024, steps=3, warmup=1, rounds=3,
        repeats=2,
    ),
}


@dataclass
class Method:
    """What one method did: its trials in order with the wall time of each, its winner, and its total time."""

    name: str
    trials: list[Any] = field(default_factory=list)
    trial_walls: list[float] = field(default_factory=list)
    winner: Any | None = None
    wall_s: float = 0.0
    skipped: int = 0
    reasons: Counter[str] = field(default_factory=Counter)

    def trial_time(self) -> float:
        return sum(self.trial_walls)


class _Clock:
    """A callback that times each trial from its TrialStarted to its TrialFinished event."""

    def __init__(self) -> None:
        self.walls: list[float] = []
        self._started = 0.0

    def __call__(self, event: Any) -> None:
        from memlab.events import TrialFinished, TrialStarted

        if isinstance(event, TrialStarted):
            self._started = time.perf_counter()
        elif isinstance(event, TrialFinished):
            self.walls.append(time.perf_counter() - self._started)


def half_precision(device: torch.device) -> str:
    """bf16 on the CPU and on GPUs that have it, fp16 on older GPUs."""
    if device.type == "cuda" and not torch.cuda.is_bf16_supported():
        return "fp16"
    return "bf16"


def run_fit(model: nn.Module, batch: Any, size: Size, budget: int, space: Mapping[str, Any] | None = None) -> Method:
    """memlab's ``fit`` over its default space (or ``space``), with its default ``max_trials``."""
    from memlab.search import fit

    clock = _Clock()
    started = time.perf_counter()
    report = fit(
        model, batch, budget=budget, batch_size=size.batch_size, space=space, steps=size.steps, warmup=size.warmup,
        callback=clock, progress=False,
    )
    method = Method(
        "fit", list(report.trials), clock.walls, report.best, time.perf_counter() - started, len(report.skipped)
    )
    method.reasons = Counter(reason.split(":")[0] for _, reason in report.skipped)
    return method


def run_grid(model: nn.Module, batch: Any, size: Size, budget: int, plans: Sequence[Any]) -> Method:
    """Every plan of the space, measured with ``compare``."""
    import memlab

    clock = _Clock()
    started = time.perf_counter()
    report = memlab.compare(
        model, batch, plans, budget=budget, steps=size.steps, warmup=size.warmup, callback=clock, progress=False
    )
    return Method("grid", list(report.trials), clock.walls, report.best, time.perf_counter() - started)


def recipe_plans(batch_size: int, half: str) -> list[list[Any]]:
    """The seeds' recipe as stages of plans: each stage halves the micro-batch from the full batch down to 1, and
    each next stage has one more technique on (checkpointing, then half precision, then 8-bit AdamW).

    Example:
        >>> [[p.label() for p in stage] for stage in recipe_plans(4, "bf16")[:2]]
        [['plain', 'mb2x2', 'mb1x4'], ['ckpt', 'mb2x2 ckpt', 'mb1x4 ckpt']]
    """
    from memlab.plan import Plan

    sizes = [batch_size]
    while sizes[-1] > 1:
        sizes.append(sizes[-1] // 2 if sizes[-1] % 2 == 0 else 1)
    techniques = [{}, {"checkpointing": True}, {"checkpointing": True, "precision": half}]
    techniques.append({**techniques[-1], "optimizer": "adamw8bit"})
    return [
        [
            Plan(micro_batch=None if micro == batch_size else micro, accumulation=batch_size // micro, **extra)
            for micro in sizes
        ]
        for extra in techniques
    ]


def run_recipe(model: nn.Module, batch: Any, size: Size, budget: int, half: str) -> Method:
    """The seeds' recipe: the first plan of :func:`recipe_plans`, in order, that fits."""
    from memlab.options import RunOptions
    from memlab.runner.trial import TrialRunner

    clock = _Clock()
    runner = TrialRunner(
        model, batch, RunOptions(steps=size.steps, warmup=size.warmup, budget=budget, callback=clock)
    )
    method = Method("recipe")
    started = time.perf_counter()
    with runner.session():
        for plan in [plan for stage in recipe_plans(size.batch_size, half) for plan in stage]:
            trial = runner.run(plan, len(method.trials))
            method.trials.append(trial)
            if trial.fits:
                method.winner = trial
                break
    method.wall_s = time.perf_counter() - started
    method.trial_walls = clock.walls
    return method


def remeasure(model: nn.Module, batch: Any, plans: Sequence[Any], size: Size, budget: int) -> list[list[float]]:
    """Samples/s of each plan measured again, ``size.rounds`` rounds, the order turning each round."""
    import memlab

    speeds: list[list[float]] = [[] for _ in plans]
    for number in range(size.rounds):
        order = list(range(len(plans)))
        shift = number % len(order)
        for index in order[shift:] + order[:shift]:
            trial = memlab.measure(model, batch, plans[index], steps=size.steps, warmup=size.warmup, budget=budget)
            if trial.samples_per_s is not None:
                speeds[index].append(trial.samples_per_s)
    return speeds


def within_noise(fit_speeds: Sequence[float], grid_speeds: Sequence[float]) -> bool:
    """fit's median samples/s is at least NOISE_SHARE of the grid winner's, or the two ranges overlap.

    Example:
        >>> within_noise([9.5, 10.0], [10.0, 10.2]), within_noise([5.0, 5.5], [10.0, 10.5])
        (True, False)
    """
    if not fit_speeds or not grid_speeds:
        return False
    fit_median, grid_median = common.median(fit_speeds), common.median(grid_speeds)
    assert fit_median is not None and grid_median is not None
    overlap = max(fit_speeds) >= min(grid_speeds)
    return fit_median >= NOISE_SHARE * grid_median or overlap


def _trial_row(trial: Any, wall: float | None) -> dict[str, Any]:
    return {
        "plan": trial.label,
        "status": trial.status,
        "fits": trial.fits,
        "peak_bytes": trial.peak_bytes,
        "samples_per_s": common.rounded(trial.samples_per_s, 2),
        "wall_s": common.rounded(wall, 2),
    }


def _winner(method: Method, speeds: dict[Any, list[float]]) -> dict[str, Any] | None:
    winner = method.winner
    if winner is None:
        return None
    return {
        "plan": winner.label,
        "plan_fields": asdict(winner.plan),
        "peak_bytes": winner.peak_bytes,
        "rows_per_step": winner.rows_per_step,
        "samples_per_s_in_search": common.rounded(winner.samples_per_s, 2),
        "samples_per_s_remeasured": [round(s, 2) for s in speeds.get(winner.plan, [])],
    }


def _versus_grid(method: Method, grid: Method, speeds: dict[Any, list[float]]) -> dict[str, Any]:
    """How one run compares with the grid's run of the same repeat."""
    mine = method.winner.plan if method.winner is not None else None
    theirs = grid.winner.plan if grid.winner is not None else None
    same = mine == theirs
    again, grid_again = speeds.get(mine, []), speeds.get(theirs, [])
    ranked = sorted((t for t in grid.trials if t.fits and t.samples_per_s), key=lambda t: -t.samples_per_s)
    return {
        "winner_matches_grid": same,
        "winner_within_noise_of_grid": same or within_noise(again, grid_again),
        "remeasured_speed_over_grid_winner": (
            round((common.median(again) or 0.0) / (common.median(grid_again) or 1.0), 3)
            if again and grid_again else None
        ),
        "winner_rank_in_grid": next((i + 1 for i, t in enumerate(ranked) if t.plan == mine), None),
    }


def _describe(runs: list[Method], grid_runs: list[Method], speeds: dict[Any, list[float]]) -> dict[str, Any]:
    data: dict[str, Any] = {
        "trials_run": [len(run.trials) for run in runs],
        "trial_time_s": round(sum(run.trial_time() for run in runs), 2),
        "runs": [],
    }
    grid_time = sum(run.trial_time() for run in grid_runs)
    for run, grid in zip(runs, grid_runs, strict=True):
        entry: dict[str, Any] = {
            "trials_run": len(run.trials),
            "trial_time_s": round(run.trial_time(), 2),
            "wall_s": round(run.wall_s, 2),
            "winner": _winner(run, speeds),
        }
        if run is not grid:
            entry.update(_versus_grid(run, grid, speeds))
        if run.name == "fit":
            entry["skipped"] = run.skipped
        entry["trials"] = [_trial_row(t, w) for t, w in zip(run.trials, run.trial_walls, strict=False)]
        data["runs"].append(entry)
    if runs is not grid_runs:
        data["trial_time_over_grid"] = round(data["trial_time_s"] / grid_time, 3)
        data["trials_over_grid"] = round(sum(data["trials_run"]) / sum(len(g.trials) for g in grid_runs), 3)
        data["winner_matches_grid"] = [entry["winner_matches_grid"] for entry in data["runs"]]
        data["winner_within_noise_of_grid"] = [entry["winner_within_noise_of_grid"] for entry in data["runs"]]
    if runs and runs[0].name == "fit":
        data["goal_trial_time_over_grid"] = GOAL
        data["goal_met"] = data["trial_time_over_grid"] <= GOAL
    return data


def warm_up_libraries() -> None:
    """Load bitsandbytes and run one 8-bit AdamW step, so that no method pays for the first import."""
    from memlab.plan import Plan
    from memlab.techniques.optimizer import build_optimizer

    weight = nn.Parameter(torch.zeros(64, 64))
    weight.grad = torch.ones_like(weight)
    build_optimizer([weight], Plan(optimizer="adamw8bit"), 1e-5).step()


def run(size: Size, device: torch.device, fraction: float, repeats: int) -> dict[str, Any]:
    """Calibrate the budget, run fit, the grid and the recipe, measure the winners again, describe it all."""
    import memlab
    from memlab.live.device import cuda_bf16_supported
    from memlab.search import candidate_plans, default_space
    from memlab.techniques.loss import chunked_loss_applies

    model = common.llama_model(
        hidden=size.hidden, layers=size.layers, heads=size.heads, vocab=size.vocab, positions=size.length
    ).to(device)
    batch = common.to_device(common.lm_batch(vocab=size.vocab, rows=size.batch_size, length=size.length), device)
    warm_up_libraries()
    plain = memlab.measure(model, batch, memlab.Plan(), steps=1, warmup=size.warmup)
    if plain.status != "ok":
        raise RuntimeError(f"the calibration trial failed: {plain.error}")
    budget = int(fraction * plain.peak_bytes)
    # The same space fit searches by default: with the chunked loss, which applies to this Llama.
    space = default_space(size.batch_size, device.type, device.type == "cuda" and cuda_bf16_supported(device),
                          chunked_loss=chunked_loss_applies(model))
    plans = candidate_plans(size.batch_size, space, batch_rows=size.batch_size)
    common.release(device)

    methods = {
        "fit": lambda: run_fit(model, batch, size, budget),
        "grid": lambda: run_grid(model, batch, size, budget, plans),
        "recipe": lambda: run_recipe(model, batch, size, budget, half_precision(device)),
    }
    runs: dict[str, list[Method]] = {name: [] for name in methods}
    for repeat in range(repeats):
        for name in list(methods) if repeat % 2 == 0 else list(methods)[::-1]:
            runs[name].append(methods[name]())
            common.release(device)
    winners = list(dict.fromkeys(m.winner.plan for ms in runs.values() for m in ms if m.winner is not None))
    speeds = dict(zip(winners, remeasure(model, batch, winners, size, budget), strict=True)) if winners else {}
    common.release(device)
    whole = whole_space(model, batch, size, plain.peak_bytes)
    mixed = mixed_space(model, batch, size, budget)
    return {
        "model": {
            "class": type(model).__name__,
            "parameters": sum(p.numel() for p in model.parameters()),
            **{k: v for k, v in asdict(size).items() if k in ("hidden", "layers", "heads", "vocab")},
        },
        "batch": {"batch_size": size.batch_size, "length": size.length},
        "steps": size.steps,
        "warmup": size.warmup,
        "rounds": size.rounds,
        "repeats": repeats,
        "budget_bytes": budget,
        "budget_rule": f"{fraction} x the plain full-batch plan's peak ({plain.peak_bytes} bytes)",
        "space": space,
        "grid_size": len(plans),
        "noise_rule": (
            f"winners re-measured in {size.rounds} alternating rounds; a winner is within noise of the grid's when "
            f"its median samples/s is at least {NOISE_SHARE} x the grid winner's, or the two ranges overlap"
        ),
        "methods": {name: _describe(ms, runs["grid"], speeds) for name, ms in runs.items()},
        "summary": {
            **_summary(runs, speeds),
            "whole_space_plans": whole["plans"],
            "whole_space_trials_run": whole["trials_run"],
            "whole_space_goal_met": whole["goal_met"],
            "whole_space_stopped_by_max_trials": whole["stopped_by_max_trials"],
            "mixed_space_winners": {"fit": (mixed["fit"]["winner"] or {}).get("plan"),
                                    "grid": (mixed["grid"]["winner"] or {}).get("plan")},
            "mixed_space_fit_within_noise_of_grid": mixed["fit"]["winner_within_noise_of_grid"],
        },
        "whole_space": whole,
        "mixed_space": mixed,
    }


def whole_space(model: nn.Module, batch: Any, size: Size, plain_peak: int) -> dict[str, Any]:
    """fit over :data:`WHOLE_SPACE` at each of :data:`WHOLE_FRACTIONS`: how many plans, how many measured, whether
    ``max_trials`` cut the search short, and the answer."""
    from memlab.search import MAX_TRIALS, candidate_plans, divisors

    space = {"micro_batch": divisors(size.batch_size), **WHOLE_SPACE}
    plans = len(candidate_plans(size.batch_size, space, batch_rows=size.batch_size))
    runs: list[dict[str, Any]] = []
    for fraction in WHOLE_FRACTIONS:
        method = run_fit(model, batch, size, int(fraction * plain_peak), space)
        winner = method.winner
        runs.append({
            "budget_fraction": fraction,
            "budget_bytes": int(fraction * plain_peak),
            "trials_run": len(method.trials),
            "stopped_by_max_trials": method.reasons.get("not measured", 0),
            "skipped_by_reason": dict(method.reasons.most_common()),
            "winner": winner.label if winner is not None else None,
            "winner_peak_bytes": winner.peak_bytes if winner is not None else None,
            "winner_samples_per_s": common.rounded(winner.samples_per_s, 2) if winner is not None else None,
            "wall_s": round(method.wall_s, 1),
            "trials": [_trial_row(t, w) for t, w in zip(method.trials, method.trial_walls, strict=False)],
        })
        common.release(next(model.parameters()).device)
    trials: list[int] = [run["trials_run"] for run in runs]
    return {
        "space": space,
        "plans": plans,
        "max_trials": MAX_TRIALS,
        "goal_trials": WHOLE_GOAL,
        "runs": runs,
        "trials_run": trials,
        "goal_met": max(trials) <= WHOLE_GOAL,
        "stopped_by_max_trials": sum(1 for run in runs if run["stopped_by_max_trials"]),
    }


def mixed_space(model: nn.Module, batch: Any, size: Size, budget: int) -> dict[str, Any]:
    """fit and the exhaustive grid over :data:`MIXED_SPACE` (adapters, pure bf16, Adafactor) at one budget; both
    winners measured again in turn: is fit's the grid's, or within noise of it?"""
    from memlab.search import candidate_plans, divisors

    space = {"micro_batch": divisors(size.batch_size)[:3], **MIXED_SPACE}
    plans = candidate_plans(size.batch_size, space, batch_rows=size.batch_size)
    found = run_fit(model, batch, size, budget, space)
    common.release(next(model.parameters()).device)
    grid = run_grid(model, batch, size, budget, plans)
    common.release(next(model.parameters()).device)
    winners = list(dict.fromkeys(m.winner.plan for m in (found, grid) if m.winner is not None))
    speeds = dict(zip(winners, remeasure(model, batch, winners, size, budget), strict=True)) if winners else {}
    return {
        "space": space,
        "grid_size": len(plans),
        "budget_bytes": budget,
        "fit": {"trials_run": len(found.trials), "trial_time_s": round(found.trial_time(), 2),
                "winner": _winner(found, speeds), **_versus_grid(found, grid, speeds)},
        "grid": {"trials_run": len(grid.trials), "trial_time_s": round(grid.trial_time(), 2),
                 "winner": _winner(grid, speeds)},
    }


def _summary(runs: dict[str, list[Method]], speeds: dict[Any, list[float]]) -> dict[str, Any]:
    """The headline numbers: time shares, whether the grid agrees with itself, and each winner's re-measured speed."""
    grid_time = sum(run.trial_time() for run in runs["grid"])
    grid_winners = [run.winner.label if run.winner else None for run in runs["grid"]]
    return {
        "fit_trial_time_over_grid": round(sum(run.trial_time() for run in runs["fit"]) / grid_time, 3),
        "recipe_trial_time_over_grid": round(sum(run.trial_time() for run in runs["recipe"]) / grid_time, 3),
        "winners": {name: [run.winner.label if run.winner else None for run in ms] for name, ms in runs.items()},
        "grid_winner_same_in_every_repeat": len(set(grid_winners)) == 1,
        "remeasured_median_samples_per_s": {
            plan.label(): common.rounded(common.median(values), 2) for plan, values in speeds.items()
        },
    }


def markdown(result: dict[str, Any]) -> str:
    """One row per method and repeat: trials, trial time, winner, and whether it matches the grid's."""
    rows = []
    for name, method in result["methods"].items():
        for number, entry in enumerate(method["runs"]):
            winner = entry["winner"] or {}
            rows.append([
                name,
                number + 1,
                entry["trials_run"],
                entry["trial_time_s"],
                method.get("trial_time_over_grid", 1.0) if number == 0 else None,
                winner.get("plan", "nothing fits"),
                common.mib(winner.get("peak_bytes")),
                common.rounded(common.median(winner.get("samples_per_s_remeasured") or []), 2),
                {True: "yes", False: "no"}.get(entry.get("winner_matches_grid", True)),
                {True: "yes", False: "no"}.get(entry.get("winner_within_noise_of_grid", True)),
            ])
    headers = [
        "method", "repeat", "trials", "trial time s", "time / grid (all repeats)", "winner", "peak MiB",
        "samples/s (re-measured)", "same as grid", "within noise",
    ]
    tables = [common.markdown_table(headers, rows)]
    whole = result.get("whole_space")
    if whole:
        tables.append(common.markdown_table(
            ["budget / plain peak", "plans", "trials", "cut by max_trials", "winner", "peak MiB", "samples/s"],
            [[run["budget_fraction"], whole["plans"], run["trials_run"], run["stopped_by_max_trials"],
              run["winner"] or "nothing fits", common.mib(run["winner_peak_bytes"]), run["winner_samples_per_s"]]
             for run in whole["runs"]],
        ))
    mixed = result.get("mixed_space")
    if mixed:
        tables.append(common.markdown_table(
            ["mixed space", "plans", "trials", "trial time s", "winner", "samples/s (re-measured)", "within noise"],
            [[name, mixed["grid_size"], mixed[name]["trials_run"], mixed[name]["trial_time_s"],
              (mixed[name]["winner"] or {}).get("plan", "nothing fits"),
              common.rounded(common.median((mixed[name]["winner"] or {}).get("samples_per_s_remeasured") or []), 2),
              {True: "yes", False: "no"}.get(mixed[name].get("winner_within_noise_of_grid", True))]
             for name in ("fit", "grid")],
        ))
    return "\n\n".join(tables)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the comparison, print it, write ``fit_vs_grid-<device>.json``; return the result."""
    parser = common.build_parser((__doc__ or NAME).splitlines()[0])
    parser.add_argument(
        "--budget-fraction", type=float, default=0.6,
        help="the budget as a share of the plain full-batch plan's peak (default 0.6)",
    )
    parser.add_argument(
        "--repeats", type=int, default=None, help="runs of each method, in mirrored order (default: 2; --smoke: 1)"
    )
    args = parser.parse_args(argv)
    common.quiet()
    device = common.resolve_device(args, parser)
    if device.type == "cpu" and args.threads is None:
        torch.set_num_threads(1)  # steadier timings on a shared CPU than threads that wait for each other
    result = common.metadata_for(NAME, device, args.size)
    size = SIZES[args.size]
    result.update(run(size, device, args.budget_fraction, args.repeats or size.repeats))
    result["markdown"] = markdown(result)
    path = common.write_json(result, args.out / f"{common.result_stem(NAME, device, args.size)}.json")
    print(result["markdown"])
    print(f"wrote {path}")
    return result


if __name__ == "__main__":
    main()
