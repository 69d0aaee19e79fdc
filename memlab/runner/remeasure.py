"""Settle a close race: re-measure the plans close in speed in alternation (A B A B), so drift does not decide.

``compare`` (when timing bounds the noise) and ``fit`` both settle their close races this way before they answer.

A shared machine drifts (another tenant's job starts, a GPU clocks down): two plans measured minutes apart can differ
by more than they differ from each other. Re-running the contenders in turn, round after round, exposes them to the
same drift, and their speeds are then taken from those rounds alone.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable, Sequence

from memlab.plan import Plan
from memlab.report import Report, Trial

__all__ = [
    "DRIFT_MARGIN",
    "MAX_CONTENDERS",
    "ROUNDS",
    "close_contenders",
    "remeasure_interleaved",
    "settle_close_race",
]

ROUNDS = 3
"""How many times each contender runs again, in alternation: with its first run, four runs, enough for
:func:`~memlab.report.noise.runs_speed_interval` to leave out one run that a burst disturbed."""
MAX_CONTENDERS = 3
"""At most this many plans are re-measured: the best and the trials closest to it."""
DRIFT_MARGIN = 0.5
"""Trials within this fraction of the best's speed are timed again with it, tied within their own noise or not:
another process sharing the core halves a step's speed for as long as it runs, so a plan first timed then can look
twice as slow as it is."""


def close_contenders(trials: Sequence[Trial], budget: int | None, limit: int = MAX_CONTENDERS) -> list[Trial]:
    """The trials a re-measurement must settle: the best, its ties (:attr:`Report.ties`), and the trials that fit
    within ``DRIFT_MARGIN`` of its speed, fastest first, at most ``limit``; empty when no other trial is that close.

    The margin is there because a trial's interval bounds the noise *during* its steps, not the drift between two
    trials measured minutes apart: on a shared CPU the same search crowned different winners run after run
    (``benchmarks/results/stability-cpu.json``) when only ties were timed again.

    Example:
        >>> fast = Trial(Plan(), "ok", 9, {}, 0.5, 16.0, None, "cpu", rows_per_step=8, step_times=(0.4, 0.6))
        >>> close = Trial(Plan(checkpointing=True), "ok", 5, {}, 0.55, 14.5, None, "cpu", rows_per_step=8,
        ...               step_times=(0.5, 0.6))
        >>> slow = Trial(Plan(accumulation=2), "ok", 5, {}, 2.0, 4.0, None, "cpu", rows_per_step=8,
        ...              step_times=(1.9, 2.1))
        >>> [t.label for t in close_contenders([fast, close, slow], budget=None)]
        ['plain', 'ckpt']
    """
    report = Report(list(trials), budget=budget)
    best = report.best
    if best is None or best.samples_per_s is None:
        return []
    floor = (1 - DRIFT_MARGIN) * best.samples_per_s
    near = [
        trial
        for trial in report.trials
        if trial is not best and report.fits(trial) and (trial.samples_per_s or 0.0) >= floor
    ]
    close = list({id(trial): trial for trial in [best, *report.ties, *near]}.values())
    if len(close) < 2:
        return []
    ranked = sorted(close, key=lambda trial: trial.samples_per_s or 0.0, reverse=True)
    return ranked[:limit]


def remeasure_interleaved(
    contenders: Sequence[Trial], measure: Callable[[Trial], Trial], rounds: int = ROUNDS
) -> list[Trial]:
    """Run the contenders again in turn, ``rounds`` times (A B A B), and return each contender with its speed from
    all its runs, the first included (their timed steps kept, the step time the median of the runs' medians, within
    the interval that spans them: :func:`~memlab.report.noise.runs_speed_interval`), and its memory from the
    highest peak of all its runs.

    ``measure`` gets the contender's first trial and runs its plan again. The same plan may be a contender twice (a
    compare of a plan with itself): contenders are told apart by position, not by plan. A contender that fails in
    a re-run (out of memory under the cap, an error) is returned as that failed run: a plan that fits only
    sometimes is no answer.

    Example:
        >>> order = []
        >>> def measure(trial):
        ...     order.append(trial.label)
        ...     return Trial(trial.plan, "ok", 9, {}, 0.5, 16.0, None, "cpu", rows_per_step=8, step_times=(0.5, 0.5))
        >>> first = Trial(Plan(), "ok", 9, {}, 1.0, 8.0, None, "cpu", rows_per_step=8, step_times=(1.0, 1.0))
        >>> second = Trial(Plan(checkpointing=True), "ok", 5, {}, 1.0, 8.0, None, "cpu", rows_per_step=8)
        >>> again = remeasure_interleaved([first, second], measure, rounds=2)
        >>> order, again[0].step_times, again[0].step_runs
        (['plain', 'ckpt', 'plain', 'ckpt'], (1.0, 1.0, 0.5, 0.5, 0.5, 0.5), (2, 2, 2))
    """
    runs: list[list[Trial]] = [[] for _ in contenders]
    for _ in range(rounds):
        for position, trial in enumerate(contenders):
            runs[position].append(measure(trial))
    settled = []
    for position, (trial, again) in enumerate(zip(contenders, runs, strict=True)):
        failed = next((run for run in again if run.status != "ok"), None)
        if failed is not None:
            note = f"fitted when first measured, then failed when re-measured: {failed.error}"
            settled.append(dataclasses.replace(failed, notes=(*failed.notes, note)))
            continue
        others = ", ".join(other.label for index, other in enumerate(contenders) if index != position)
        note = f"timed again in turn with {others} ({rounds} rounds): close in speed when first measured"
        settled.append(_pooled(trial, again, note))
    return settled


def settle_close_race(
    trials: list[Trial],
    run: Callable[[Plan, int], Trial],
    budget: int | None,
    say: Callable[[str], None] | None = None,
    *,
    settled: Callable[[Trial, int], None] | None = None,
) -> list[tuple[Trial, Trial]]:
    """Time the :func:`close_contenders` of ``trials`` again in turn and put the settled trials in their places
    (``trials`` is changed in place); returns the (before, after) pairs, empty when the race was not close.

    ``run(plan, index)`` measures ``plan`` again as the ``index``-th trial (a live figure redraws that column);
    ``say`` is told which plans are timed again; ``settled(trial, index)`` gets each pooled trial and its index
    (``compare`` and ``fit`` send it on as :class:`~memlab.events.TrialSettled`).

    Example:
        >>> def run(plan, index):
        ...     return Trial(plan, "ok", 9, {}, 0.5, 16.0, None, "cpu", rows_per_step=8, step_times=(0.5, 0.5))
        >>> trials = [Trial(Plan(), "ok", 9, {}, 0.5, 16.0, None, "cpu", rows_per_step=8, step_times=(0.4, 0.6))
        ...           for _ in range(2)]
        >>> pairs = settle_close_race(trials, run, budget=None)
        >>> len(pairs), trials[0].step_runs
        (2, (2, 2, 2, 2))
    """
    contenders = close_contenders(trials, budget)
    if not contenders:
        return []
    if say is not None:
        say(f"timing {', '.join(t.label for t in contenders)} again, in turn")

    def measure_again(trial: Trial) -> Trial:
        index = next(i for i, candidate in enumerate(trials) if candidate is trial)
        return run(trial.plan, index)

    pairs = list(zip(contenders, remeasure_interleaved(contenders, measure_again), strict=True))
    for before, after in pairs:
        index = next(i for i, candidate in enumerate(trials) if candidate is before)
        trials[index] = after
        if settled is not None:
            settled(after, index)
    return pairs


def _pooled(trial: Trial, runs: Sequence[Trial], note: str) -> Trial:
    """``trial`` with the speed of all its runs (the first and ``runs``: every timed step, and ``step_runs`` so that
    its interval spans the runs' medians), its step time the median of the runs' medians, and the memory of the
    highest peak.

    Why the median of the medians, not of every step: each run is one vote, as in its interval
    (:func:`~memlab.report.noise.runs_speed_interval`), so the speed lies within it. The median of the pooled steps
    followed the run with the most steps: a first run of many slow steps, which the interval leaves out as the
    slowest, drew the demo's best plan at 113 samples/s under its own interval of 147 to 159 (issue 71).
    """
    timed = [run for run in [trial, *runs] if run.step_times]
    step_times = tuple(seconds for run in timed for seconds in run.step_times)
    highest = max([trial, *runs], key=lambda run: run.peak_bytes)
    medians = [statistics.median(run.step_times) for run in timed]
    step_time = statistics.median(medians) if medians else trial.step_time_s
    rows, tokens = trial.rows_per_step, _tokens_per_step(trial)
    return dataclasses.replace(
        highest,
        step_times=step_times,
        step_runs=tuple(len(run.step_times) for run in timed),
        step_time_s=step_time,
        samples_per_s=rows / step_time if rows and step_time else trial.samples_per_s,
        tokens_per_s=tokens / step_time if tokens and step_time else None,
        notes=(*trial.notes, note),
    )


def _tokens_per_step(trial: Trial) -> float | None:
    if trial.tokens_per_s is None or not trial.step_time_s:
        return None
    return trial.tokens_per_s * trial.step_time_s
