"""fit's dry runs, on fake tensors (the live model is copied onto them, never touched): the estimates that prune a
measured search (:func:`pruning`: plans estimated not to fit are skipped unmeasured), and the search made of dry
runs alone (:func:`dry_run_search`, ``fit(..., dry_run=True)``: plans estimated in order of expected speed until one
fits). A trainer kind with its own step (a GRPOTrainer's) brings its own dry run (``request.kind.estimate``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from memlab.plan import Plan
from memlab.report import Report, Trial
from memlab.runner.trial import keep_on_interrupt
from memlab.search.blocks import fewest_blocks
from memlab.search.fitting.choice import dry_run_suggestions
from memlab.search.fitting.request import FitRequest
from memlab.search.fitting.space import FitSpace
from memlab.search.space import fits
from memlab.search.speed import SpeedModel
from memlab.techniques.checkpointing import checkpoint_blocks

__all__ = ["dry_run_search", "pruning"]

Estimates = Callable[[Sequence[Plan]], list[Trial]]
"""``estimates(plans) -> trials``: plans estimated on fake tensors, in order."""


def pruning(request: FitRequest, space: FitSpace) -> Estimates:
    """The dry runs a measured search prunes with, on the device the model is on: a trainer kind's own where it has
    one, else the model's (:func:`memlab.estimation.estimate.estimate_plans`) with what the trainer holds beside the
    model added (``request.held``)."""
    kind, held, options = request.kind, request.held, space.options

    def estimates(plans: Sequence[Plan]) -> list[Trial]:
        from memlab.estimation.estimate import estimate_plans  # here: estimate builds on the search's runner

        if kind is not None:
            return list(kind.estimate(plans, budget=space.budget, device=space.device, lr=options.lr))
        trials = estimate_plans(request.model, request.batch, plans, loss_fn=options.loss_fn, budget=space.budget,
                                lr=options.lr, device=space.device).trials
        return [held(trial) for trial in trials] if held is not None else list(trials)

    return estimates


def plan_dry_run(request: FitRequest, space: FitSpace) -> Callable[[Plan], Trial]:
    """``dry_run(plan) -> trial``: the plan's dry run (a trainer kind's own where it has one), what the trainer holds
    beside the model added, with the card's context: the GPU kind asked for (``request.gpu``), else the GPU the model
    is on (or the default kind's). A model on the meta device is estimated for CUDA, as ``memlab.estimate`` does."""
    from memlab.estimation.cuda.context import card_context, live_card_context
    from memlab.estimation.estimate import estimate

    model, kind, held, gpu, options = request.model, request.kind, request.held, request.gpu, space.options
    device = space.estimated_for

    def dry_run(plan: Plan) -> Trial:
        trial = estimate(model, request.batch, plan, loss_fn=options.loss_fn, budget=space.budget, lr=options.lr,
                         device=device, host_budget=options.host_budget, gpu=gpu) \
            if kind is None else kind.estimate([plan], budget=space.budget, device=device, lr=options.lr, gpu=gpu)[0]
        trial = trial if held is None else held(trial)
        return card_context(trial, gpu) if gpu is not None else live_card_context(trial, model)

    return dry_run


def dry_run_search(request: FitRequest, space: FitSpace) -> Report:
    """Estimate the candidates on fake tensors in order of expected speed (the prior: nothing is timed) until one is
    estimated to fit: that one is the answer, and the plans after it are skipped as expected slower (with
    ``request.selective``, the fewest checkpointed blocks that fit are then estimated too). For ``request.gpu``,
    each is estimated for that GPU kind (its card figure, its CUDA context). Where none fits, the suggestions are
    estimated too (:func:`memlab.search.fitting.choice.dry_run_suggestions`).

    Example:
        >>> import torch
        >>> from memlab.options import RunOptions
        >>> from memlab.search.fitting.space import fit_space
        >>> request = FitRequest(torch.nn.Linear(4, 1), torch.randn(4, 4), dry_run=True,
        ...                      options=RunOptions(budget="1MiB", loss_fn=lambda model, batch: model(batch).mean()),
        ...                      space={"precision": ["fp32"], "optimizer": ["adamw"], "checkpointing": [False],
        ...                             "offload": ["none"]}).checked()
        >>> report = dry_run_search(request, fit_space(request))
        >>> report.best.plan.label(), report.best.estimated, len(report.skipped)
        ('plain', True, 2)
    """
    budget = space.budget
    speed = SpeedModel([], space.candidates, batch_size=request.effective_batch, prior=space.prior)
    order = sorted(space.candidates, key=speed.expected, reverse=True)
    dry_run = plan_dry_run(request, space)
    trials: list[Trial] = []
    with keep_on_interrupt(trials, budget):
        for position, plan in enumerate(order):
            trials.append(dry_run(plan))
            if fits(trials[-1], budget):
                reason = f"expected slower: {plan.label()} is expected faster and is estimated to fit"
                if request.selective:  # the same dry run, fewer blocks
                    trials += fewest_blocks(trials, budget, lambda: len(checkpoint_blocks(request.model)), dry_run)
                return Report(trials, budget=budget, skipped=[(slower, reason) for slower in order[position + 1 :]])
        report = Report(trials, budget=budget)
        dry_run_suggestions(report, request, space, dry_run)
    return report
