"""Does a report call a tie a tie, and a real difference a difference, on a busy machine?

Two questions, each asked again and again while a process spins on every other core (another tenant):

1. *The same plan twice.* ``memlab.compare(model, batch, [Plan(), Plan()])``: the two trials do the same work, so
   the report must name a tie (the second among ``Report.ties``), never a winner.
2. *A plan truly 30% slower.* The same plan with a loss that also runs a no-grad forward over some of the rows,
   the fewest that make its step at least 30% slower (calibrated first, then checked by timing both in
   alternation, step by step, in one process, where drift hits both alike). Measured as ``compare`` measures (a
   close race timed again in turn), the report must rank the slow one slower: ``best`` is the fast one and the
   slow one is not among its ties.

The model is ``memlab demo``'s Llama and batch. Each run measures with memlab's defaults (timing goes on until the
median's 95% interval is within 5%, at most 10 s a trial); the order of the two trials alternates from run to run.

Run from the repository root::

    python -m benchmarks.ties --threads 1    # CPU: 20 runs of each question beside a busy core; about 15 minutes
"""

from __future__ import annotations

import json
import math
import os
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from benchmarks import common
from benchmarks.stability import busy_neighbours

NAME = "ties"
RUNS = {"smoke": (2, 2), "small": (20, 10), "full": (20, 10)}
"""Runs of (the same plan twice, the 30%-slower plan) for each size."""
TARGET_SLOWDOWN = 0.30


def extra_forward_loss(rows: int) -> Callable[[nn.Module, dict[str, torch.Tensor]], torch.Tensor]:
    """The default loss, plus forwards without gradients over ``rows`` rows in all (the whole micro-batch as many
    times as it takes, then its first rows): more work, the same memory pattern for the trained step, and slowed
    by a busy machine exactly as the step itself is."""

    def loss(model: nn.Module, micro_batch: dict[str, torch.Tensor]) -> torch.Tensor:
        total = int(next(iter(micro_batch.values())).shape[0])
        left = rows
        with torch.no_grad():
            while left > 0:
                model(**{key: value[: min(left, total)] for key, value in micro_batch.items()})
                left -= total
        return model(**micro_batch).loss

    return loss


def default_loss(model: nn.Module, micro_batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return model(**micro_batch).loss


def interleaved_slowdown(model: nn.Module, batch: dict[str, Any], slow_loss: Callable[..., Any], rounds: int) -> float:
    """The slow loss's step time over the default's, timed step by step in alternation (A B A B) by hand, so that
    a busy neighbour slows both alike: the median of the per-round ratios."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-9)
    originals = {name: value.detach().clone() for name, value in model.state_dict().items()}

    def step(loss_fn: Callable[..., Any]) -> float:
        started = time.perf_counter()
        loss_fn(model, batch).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return time.perf_counter() - started

    step(default_loss), step(slow_loss)  # warm-up
    ratios = [step(slow_loss) / step(default_loss) for _ in range(rounds)]
    model.load_state_dict(originals)
    return statistics.median(ratios)


def calibrate_rows(model: nn.Module, batch: dict[str, Any], rounds: int) -> tuple[int, float]:
    """How many rows of extra forward make the step at least 30% slower (the fewest that do, by the whole batch's
    slowdown, interleaved), and the slowdown they give."""
    total = int(batch["input_ids"].shape[0])
    whole = interleaved_slowdown(model, batch, extra_forward_loss(total), rounds) - 1
    rows = max(1, math.ceil(total * TARGET_SLOWDOWN / max(whole, 1e-9)))
    return rows, interleaved_slowdown(model, batch, extra_forward_loss(rows), rounds) - 1


def same_plan_twice(model: nn.Module, batch: dict[str, Any], number: int) -> dict[str, Any]:
    """One compare of the plain plan with itself: did it report a tie?"""
    import memlab

    started = time.perf_counter()
    report = memlab.compare(model, batch, [memlab.Plan(), memlab.Plan()], progress=False)
    first, second = report.trials
    winner = report.best
    return {
        "tie": len(report.ties) == 1,
        "best": None if winner is None else report.trials.index(winner),
        "samples_per_s": [common.rounded(first.samples_per_s, 3), common.rounded(second.samples_per_s, 3)],
        "timed_steps": [len(first.step_times), len(second.step_times)],
        "seconds": common.rounded(time.perf_counter() - started, 1),
        "run": number,
    }


def truly_slower(model: nn.Module, batch: dict[str, Any], slow_loss: Callable[..., Any], number: int) -> dict[str, Any]:
    """The plain plan with the default loss and with the slower one, measured as ``compare`` measures two plans:
    one after the other (the order alternating with ``number``), then, where the race is close, both again in turn
    (:func:`memlab.runner.remeasure.settle_close_race`, what ``compare`` and ``fit`` call). Two losses need two
    runners (a runner has one loss); everything else is compare's. Is the slower ranked slower?"""
    from memlab.options import RunOptions
    from memlab.plan import Plan
    from memlab.report import Report
    from memlab.runner.remeasure import settle_close_race
    from memlab.runner.trial import TrialRunner

    started = time.perf_counter()
    order = [("fast", default_loss), ("slow", slow_loss)]
    if number % 2:
        order.reverse()
    runners = [TrialRunner(model, batch, RunOptions(loss_fn=loss_fn, progress=False)) for _, loss_fn in order]
    trials = [runner.run(Plan(), index, len(runners)) for index, runner in enumerate(runners)]
    settled = settle_close_race(trials, lambda plan, index: runners[index].run(plan, index, len(runners)), None)
    by_name = {name: trial for (name, _), trial in zip(order, trials, strict=True)}
    fast, slow = by_name["fast"], by_name["slow"]
    report = Report([fast, slow])
    return {
        "ranked_slower": report.best is fast and slow not in report.ties,
        "tie": slow in report.ties or fast in report.ties,
        "first": order[0][0],
        "timed_again_in_turn": bool(settled),
        "samples_per_s": {name: common.rounded(trial.samples_per_s, 3) for name, trial in by_name.items()},
        "slowdown": common.rounded((fast.samples_per_s or 0) / (slow.samples_per_s or 1) - 1, 3),
        "timed_steps": {name: len(trial.step_times) for name, trial in by_name.items()},
        "seconds": common.rounded(time.perf_counter() - started, 1),
        "run": number,
    }


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Ask both questions ``RUNS`` times beside spinning neighbours; write ``ties-<device>.json``."""
    parser = common.build_parser((__doc__ or NAME).splitlines()[0])
    args = parser.parse_args(argv)
    common.quiet()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    device = common.resolve_device(args, parser)
    if device.type != "cpu":
        parser.error("this benchmark is about a busy shared CPU; run it with --device cpu")
    from memlab.frontends.demo import default_batch, default_model

    result = common.metadata_for(NAME, device, args.size)
    model, batch = default_model(), default_batch()
    same_runs, slower_runs = RUNS[args.size]
    busy = max((os.cpu_count() or 1) - 1, 1)
    neighbours = busy_neighbours(busy)
    try:
        rows, calibrated = calibrate_rows(model, batch, rounds=9 if args.size != "smoke" else 2)
        slow_loss = extra_forward_loss(rows)
        same = []
        for number in range(same_runs):
            same.append(same_plan_twice(model, batch, number))
            print(f"same plan twice, run {number + 1}: {same[-1]}", flush=True)
        slower = []
        for number in range(slower_runs):
            slower.append(truly_slower(model, batch, slow_loss, number))
            print(f"30% slower, run {number + 1}: {slower[-1]}", flush=True)
        checked = interleaved_slowdown(model, batch, slow_loss, rounds=15 if args.size != "smoke" else 2) - 1
    finally:
        for neighbour in neighbours:
            neighbour.kill()
            neighbour.wait()
    slowdowns = [run["slowdown"] for run in slower]
    result["busy_neighbours"] = busy
    result["same_plan_twice"] = {
        "runs": same,
        "ties": sum(run["tie"] for run in same),
        "of": len(same),
    }
    result["truly_slower"] = {
        "extra_forward_rows": rows,
        "rows": int(batch["input_ids"].shape[0]),
        "slowdown_interleaved_before": common.rounded(calibrated, 3),
        "slowdown_interleaved_after": common.rounded(checked, 3),
        "slowdown_measured_min": min(slowdowns),
        "slowdown_measured_median": common.median(slowdowns),
        "slowdown_measured_max": max(slowdowns),
        "runs": slower,
        "ranked_slower": sum(run["ranked_slower"] for run in slower),
        "of": len(slower),
    }
    path = common.write_json(result, args.out / f"{common.result_stem(NAME, device, args.size)}.json")
    print(
        json.dumps(
            {
                "same plan twice: ties": f"{result['same_plan_twice']['ties']} of {len(same)}",
                "30% slower: ranked slower": f"{result['truly_slower']['ranked_slower']} of {len(slower)}",
                "slowdown (interleaved)": [common.rounded(calibrated, 3), common.rounded(checked, 3)],
            }
        )
    )
    print(f"wrote {path}")
    return result


if __name__ == "__main__":
    main()
