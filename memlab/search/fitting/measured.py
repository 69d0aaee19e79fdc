"""fit's measurement: the candidates run on the live model (restored bit-exact afterwards), fastest-expected first,
the search (:class:`memlab.search.strategy.Search`) skipping what cannot fit or cannot win; then the fewest
checkpointed blocks that fit, and the close contenders timed again in turn (:mod:`memlab.runner.remeasure`)."""

from __future__ import annotations

from memlab.events import TrialSettled
from memlab.plan import Plan
from memlab.report import Report, Trial
from memlab.runner.progress import retiming_runs, run_progress
from memlab.runner.remeasure import settle_close_race
from memlab.runner.trial import TrialRunner, keep_on_interrupt
from memlab.search.blocks import fewest_blocks
from memlab.search.fitting.choice import measured_suggestions
from memlab.search.fitting.dry_runs import pruning
from memlab.search.fitting.request import FitRequest
from memlab.search.fitting.space import FitSpace
from memlab.search.strategy import Search, cheap_twin
from memlab.techniques.checkpointing import checkpoint_blocks

__all__ = ["fits_only_uncapped", "measured_search"]


def measured_search(request: FitRequest, space: FitSpace) -> Report:
    """The fastest measured plan of ``space`` that fits its budget, as a Report of every trial measured in order
    (the plans skipped with the reason); where none fits, what would (:mod:`memlab.search.fitting.choice`).

    The first plan (``request.first`` where the space holds it) runs without the budget's cap: a capped run that
    does not fit stops at the budget and says only that, while the whole peak and its breakdown teach the memory
    model the most. With ``request.estimates``, dry runs prune the search (:func:`~.dry_runs.pruning`)."""
    budget, candidates, options = space.budget, space.candidates, space.options
    measured: list[Trial] = []
    estimate = pruning(request, space) if request.estimates else None
    # The bar stays open after the search, while suggestions are estimated: no silent phase after the last plan.
    progress = run_progress(len(candidates), options.progress, at_most=True, then=retiming_runs(len(candidates)),
                            keep_open=True)
    with keep_on_interrupt(measured, budget), progress as bar:
        kind = request.kind
        runner = (TrialRunner if kind is None else kind.runner)(request.model, request.batch, options, listener=bar)
        with runner.session():

            def measure(plan: Plan, index: int, total: int) -> Trial:
                trial = runner.run(plan, index, total, capped=index > 0)
                if index == 0 and fits_only_uncapped(trial, budget):
                    trial = runner.run(plan, index, total, capped=True)
                measured.append(trial)
                return trial

            search = Search(candidates, budget=budget, batch_size=request.effective_batch,
                            trainable_bytes=space.trainable, prior=space.prior, device_type=space.device.type,
                            estimate=estimate, max_trials=request.max_trials)
            if request.first is not None and request.first in search.pending:
                search.record(measure(request.first, 0, len(candidates)))
            result = search.run(measure, on_step=bar.advance)
            trials = list(result.trials)
            # Checkpointing every block fits: the fewest blocks that fit are faster (memory is monotone in blocks).
            if request.selective:
                # Its trials count against max_trials, and the estimates of every block count narrow it.
                max_trials = request.max_trials
                trials += fewest_blocks(
                    trials, budget, lambda: len(checkpoint_blocks(request.model)),
                    lambda plan: measure(plan, len(measured), len(candidates)),
                    estimate=(lambda plans: estimate([cheap_twin(plan) for plan in plans])) if estimate else None,
                    limit=None if max_trials is None else max(0, max_trials - len(measured)),
                )
            # The original index: a live figure redraws that plan's column with the new run.
            rerun = lambda plan, index: runner.run(plan, index, len(trials))  # noqa: E731 - one line, used once
            settled = settle_close_race(
                trials, rerun, budget, bar.say,
                settled=lambda trial, index: runner.announce(TrialSettled(trial, index, len(trials))),
            )
            for before, after in settled:
                measured[measured.index(before)] = after
    report = Report(trials, budget=budget, skipped=result.skipped)
    measured_suggestions(report, request, space, result.trials, measured, lambda: search.models()[0], bar)
    bar.close()
    return report


def fits_only_uncapped(trial: Trial, budget: int) -> bool:
    """Whether ``trial`` fits ``budget`` by its allocated peak (and the CUDA context) while the CUDA allocator
    reserved more than the budget leaves it.

    A cap holds the caching allocator's reserved memory (at the budget less the context), which fragmentation makes
    larger than the allocated peak; on a GPU of ``budget`` bytes such a plan may run out of memory, or the allocator
    may make do under pressure, so fit runs it again under the cap, where it either fits or reports "oom". (The GPU
    run found a plan 2% under its budget by allocated peak that reserved 32% more and ran out of memory under the
    cap.)

    Example:
        >>> import dataclasses
        >>> trial = Trial(Plan(), "ok", 90, {}, None, None, None, "cuda:0", reserved_bytes=130)
        >>> fits_only_uncapped(trial, budget=100), fits_only_uncapped(trial, budget=200)
        (True, False)
        >>> fits_only_uncapped(dataclasses.replace(trial, context_bytes=20), budget=140)
        True
    """
    context = trial.context_bytes or 0
    return (
        trial.status == "ok"
        and trial.peak_bytes + context <= budget
        and trial.reserved_bytes is not None
        and trial.reserved_bytes + context > budget
    )
