"""fit's choice: the report's ``best`` is the fastest plan that fits (:class:`~memlab.report.Report`); where nothing
in the space fits, what would, estimated: a trainer kind's own suggestions (a GRPOTrainer's config changes), else
plans outside the space (:mod:`memlab.search.suggest`), the allocator's expandable segments on CUDA
(:mod:`memlab.search.allocator`) and the longest sequences that would fit
(:func:`memlab.search.limits.shorter_sequences`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from memlab.plan import Plan
from memlab.report import Report, Trial
from memlab.runner.progress import RunProgress
from memlab.search.allocator import expandable_suggestions
from memlab.search.fitting.request import FitRequest
from memlab.search.fitting.space import FitSpace
from memlab.search.limits import shorter_sequences
from memlab.search.memory import MemoryModel
from memlab.search.space import TECHNIQUE_DEFAULTS, micro_batch_of
from memlab.search.suggest import combined_suggestions, suggestions

__all__ = ["dry_run_suggestions", "lightest_plan", "measured_suggestions"]


def dry_run_suggestions(report: Report, request: FitRequest, space: FitSpace, dry_run: Callable[[Plan], Trial]) -> None:
    """Where no dry run of ``report`` fits, what would, put in the report as a measured search suggests it (from the
    plan of the lowest figure): a trainer kind's own suggestions, else lever combinations outside the space
    (:func:`memlab.search.suggest.combined_suggestions`), each estimated by ``dry_run``, autocast in the card's half
    precision. Nothing where no dry run ran."""
    ran = [trial for trial in report.trials if trial.status == "ok"]
    if not ran:
        return
    lowest = min(ran, key=lambda trial: trial.verdict_bytes)
    kind, budget = request.kind, space.budget
    if kind is not None and kind.suggest is not None:  # a trainer kind's own: its config changes
        report.suggestions, report.shorter_sequences = kind.suggest(
            lowest.plan, budget=budget, device=space.estimated_for, lr=space.options.lr, gpu=request.gpu)
    else:
        report.suggestions = combined_suggestions(lowest, lambda plans: [dry_run(plan) for plan in plans],
                                                  budget=budget, rows=request.effective_batch, prior=space.prior,
                                                  want=2, tries=4, half=space.half)


def lightest_plan(candidates: Sequence[Plan], memory: MemoryModel, batch_size: int) -> Plan:
    """The candidate the memory model predicts lightest; least-case predictions tie where nothing was measured:
    then the fewest rows and the most levers on.

    Example:
        >>> plans = [Plan(micro_batch=4), Plan(micro_batch=2, accumulation=2)]
        >>> lightest_plan(plans, MemoryModel([], trainable_bytes=0, batch_size=4), 4).label()
        'mb2x2'
    """
    return min(candidates, key=lambda plan: (
        memory.predict(plan), micro_batch_of(plan, batch_size), not plan.checkpointing,
        *(getattr(plan, name) == TECHNIQUE_DEFAULTS[name] for name in ("loss", "precision", "optimizer")),
    ))


def measured_suggestions(report: Report, request: FitRequest, space: FitSpace, searched: Sequence[Trial],
                         measured: Sequence[Trial], memory: Callable[[], MemoryModel], bar: RunProgress) -> None:
    """Where no measured trial of ``report`` fits, what would, estimated and put in the report, saying each phase on
    ``bar`` (which it closes): a trainer kind's own config changes from its lightest ``measured`` plan; else plans
    outside the searched space (:func:`memlab.search.suggest.suggestions`, from the search's own trials,
    ``searched``) from the lightest candidate the memory model (``memory()``) predicts, the allocator's expandable
    segments first on CUDA, and the longest sequences that would fit. Ctrl-C while estimating them
    carries the finished search on the interrupt (``.report``), as during it."""
    if report.best is not None:
        return
    kind, budget, options = request.kind, space.budget, space.options
    if kind is not None:
        if measured:  # a trainer kind's own: its config changes
            bar.unbounded("estimating what changes the training")
            lightest = min(measured, key=lambda trial: trial.peak_bytes).plan
            report.suggestions, report.shorter_sequences = kind.suggest(lightest, budget=budget, device=space.device,
                                                                        lr=options.lr)
        return
    model, batch = request.model, request.batch
    bar.unbounded("estimating plans outside the searched space")
    try:
        lightest = lightest_plan(space.candidates, memory(), request.effective_batch)
        report.suggestions = suggestions(model, batch, searched, space.levers, options, space.prior, lightest)
        if space.device.type == "cuda":  # the allocator's lever first: it changes nothing of the step
            report.suggestions[:0] = expandable_suggestions(model, batch, measured, options)
        bar.unbounded("estimating the longest sequences that would fit")
        report.shorter_sequences = shorter_sequences(model, batch, lightest, budget, device=space.device,
                                                     loss_fn=options.loss_fn, lr=options.lr)
    except KeyboardInterrupt as interrupt:
        # Ctrl-C while estimating suggestions: the finished search rides on the interrupt, as during it.
        interrupt.report = report  # type: ignore[attr-defined]
        raise
    finally:
        bar.close()
