"""``memlab.measure`` and ``memlab.compare``: run plans on a live model and measure them.

The plans' type chooses, once, which runner runs them (:func:`~memlab.runner.core.runner_for`): a
:class:`memlab.Plan` runs on :class:`TrialRunner` (the :class:`~memlab.runner.core.Runner` with the
:class:`~memlab.runner.training.TrainingWorkload`), and the inference mode registers its own runner for
``InferencePlan`` (:mod:`memlab.inference.run`). What a trial does, step by step, is described in
:mod:`memlab.runner.core`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from torch import nn
from typing_extensions import Unpack

from memlab.errors import MemlabError, refuse_class
from memlab.live.batch import Batch
from memlab.live.trainer_kinds import is_trainer
from memlab.options import RunKeywords, RunOptions
from memlab.plan import Plan
from memlab.report import Report, Trial
from memlab.runner.core import Runner, register_runner, runner_for
from memlab.runner.progress import retiming_runs, run_progress
from memlab.runner.training import TrainingWorkload, check_plans
from memlab.runner.workload import RunnablePlan
from memlab.trainer.entry import live_target, noted, split_plans, trainer_state
from memlab.trainer.meta import refuse_meta
from memlab.trainer.source import keeps_trainer_batch

__all__ = ["TrialRunner", "check_plans", "compare", "keep_on_interrupt", "measure", "run_plans"]


class TrialRunner(Runner[Plan, Trial]):
    """Runs training plans on one model and batch: the :class:`~memlab.runner.core.Runner` with the
    :class:`~memlab.runner.training.TrainingWorkload` (its keywords: ``options``, ``probe``, ``clock``,
    ``listener``).

    Example:
        >>> import torch
        >>> model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
        >>> runner = TrialRunner(model, torch.randn(4, 4), RunOptions(loss_fn=lambda m, b: m(b).mean(), steps=1))
        >>> with runner.session():
        ...     trials = [runner.run(Plan()), runner.run(Plan(checkpointing=True))]
        >>> [t.status for t in trials]
        ['ok', 'ok']
    """

    workload_type = TrainingWorkload


register_runner(Plan, TrialRunner)


def measure(
    model: nn.Module, batch: Batch | None = None, plan: RunnablePlan | None = None, **options: Unpack[RunKeywords]
) -> Trial:
    """Measure one plan on the live model: peak memory by category and throughput. The model is left as it was.

    ``model`` may be a ``transformers.Trainer`` (TRL's included): then the batch may be left out (the train
    dataset's worst batch is measured, said in the trial's notes), the loss is the trainer's ``compute_loss``, and
    the plan defaults to the trainer's own settings (:mod:`memlab.trainer.entry`). On a model the plan defaults to
    ``Plan()``, as :func:`memlab.estimate`'s does (a peft model: its adapters as they are).

    Keywords are :class:`~memlab.options.RunKeywords` (``loss_fn``, ``steps``, ``warmup``, ``budget``, ``lr``,
    ``callback``); no progress bar is shown for one plan. An :class:`memlab.InferencePlan` measures a forward or a
    generation under ``torch.inference_mode()`` instead of a training step, and returns an
    :class:`~memlab.report.InferenceTrial` (see :mod:`memlab.inference`).

    Example:
        >>> import torch
        >>> model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))
        >>> trial = measure(model, torch.randn(8, 16), Plan(), loss_fn=lambda m, b: m(b).mean())
        >>> trial.status, trial.breakdown["params"] == 4 * sum(p.numel() for p in model.parameters())
        ('ok', True)
    """
    if isinstance(plan, (list, tuple)) or (isinstance(plan, Iterable) and not isinstance(plan, (str, bytes))):
        raise MemlabError(
            "measure takes one plan; write memlab.measure(model, batch, memlab.Plan(...)), or "
            "memlab.compare(model, batch, plans) for a list"
        )
    refuse_class(model, "measure")  # type(model) for model: say what to build, before anything is touched
    refuse_meta(model, "measure")  # a model on the meta device has no values to run
    batch, plan = split_plans(batch, plan)
    if plan is None and not is_trainer(model):
        plan = Plan()  # as estimate's default; a trainer's own settings are its default
    options["progress"] = False
    return compare(model, batch, None if plan is None else [plan], **options).trials[0]


def compare(
    model: nn.Module,
    batch: Batch | None = None,
    plans: Sequence[RunnablePlan] | None = None,
    **options: Unpack[RunKeywords],
) -> Report:
    """Measure every plan in turn on the live model; a plan that runs out of memory or fails does not stop the rest.

    Plans close in speed to the fastest are then timed again in turn, A B A B
    (:func:`~memlab.runner.remeasure.settle_close_race`), so that a shared machine's drift between two trials
    does not crown a winner; ``noise=0`` (time exactly ``steps`` steps) leaves that out.

    Keywords are :class:`~memlab.options.RunKeywords`. Ctrl-C stops the run; the model is restored and the
    KeyboardInterrupt raised again, carrying the trials finished so far as ``.report`` (in a notebook:
    ``sys.last_value.report``). A list of :class:`memlab.InferencePlan` compares inference settings
    (:func:`memlab.inference.compare_inference`); a list mixing both kinds is an error.

    Example:
        >>> import torch
        >>> model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))
        >>> report = compare(model, torch.randn(8, 16), [Plan(), Plan(micro_batch=2, accumulation=4)],
        ...                  loss_fn=lambda m, b: m(b).mean(), progress=False)
        >>> [t.status for t in report.trials]
        ['ok', 'ok']
    """
    refuse_class(model, "compare")
    refuse_meta(model, "compare")  # a model on the meta device has no values to run
    batch, plans = split_plans(batch, plans)
    if isinstance(plans, Iterable) and not isinstance(plans, (str, bytes, list, tuple)):
        plans = list(plans)  # a generator: looked at twice below (which runner, then each plan)
    target = live_target(model, batch, options.get("loss_fn"), generation=True)
    if plans is None:
        if target.plan is None:
            raise MemlabError("no plans were given; write memlab.compare(model, batch, [memlab.Plan(), ...])")
        plans = [target.plan]  # a trainer's own settings
    elif target.source is not None and isinstance(plans, Sequence):  # a plan on a trainer keeps its effective batch
        args = target.source.trainer.args
        plans = [keeps_trainer_batch(plan, args) if isinstance(plan, Plan) else plan for plan in plans]
    # A trainer kind's own runner (GRPO's generates first); else by the plans' type: a Plan, or anything else
    # (training's checks say what is wrong).
    runner = target.runner or runner_for(plans) or TrialRunner
    if target.source is not None:
        options["loss_fn"] = target.loss_fn
    with trainer_state(model, target.batch, target.loss_fn):  # emptied by arguments made since: the trainer's own
        report = run_plans(runner, target.model, target.batch, plans, RunOptions.from_keywords(options))
    if target.note:
        report = Report(noted(report.trials, target.note), budget=report.budget)
    return report


def run_plans(
    runner_type: type[Runner[Any, Any]], model: nn.Module, batch: Batch, plans: Any, options: RunOptions
) -> Report:
    """Measure every plan in turn on a ``runner_type`` made for the model: what ``compare`` does once it has chosen
    the runner by the plans' type (every plan is checked before the model is touched; close races are settled
    unless ``noise=0``; Ctrl-C keeps the finished trials as the KeyboardInterrupt's ``.report``).

    Example:
        >>> import torch
        >>> model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
        >>> options = RunOptions(loss_fn=lambda m, b: m(b).mean(), steps=1, noise=0, progress=False)
        >>> len(run_plans(TrialRunner, model, torch.randn(4, 4), [Plan(), Plan()], options))
        2
    """
    workload = runner_type.workload_type
    assert workload is not None, f"{runner_type.__name__} has no workload_type"
    workload.check_options(options)
    checked = workload.check_plans(plans)
    trials: list[Trial] = []
    retimed = retiming_runs(len(checked)) if options.noise > 0 else 0
    with keep_on_interrupt(trials, options.budget), run_progress(len(checked), options.progress,
                                                                 then=retimed) as progress:
        runner = runner_type(model, batch, options, listener=progress)
        for plan in checked:
            runner.check(plan)
        with runner.session():
            for index, plan in enumerate(checked):
                trials.append(runner.run(plan, index, len(checked)))
                progress.advance(index + 1)
            if options.noise > 0:
                runner.settle(trials, progress.say)
    return Report(trials, budget=options.budget)


@contextlib.contextmanager
def keep_on_interrupt(trials: list[Trial], budget: int | None) -> Iterator[None]:
    """On Ctrl-C, the trials finished so far ride on the KeyboardInterrupt as ``.report`` (a Report), and the
    interrupt is raised again: in a notebook, ``sys.last_value.report`` has them.

    Example:
        >>> finished: list[Trial] = []
        >>> try:
        ...     with keep_on_interrupt(finished, budget=None):
        ...         raise KeyboardInterrupt
        ... except KeyboardInterrupt as interrupt:
        ...     report = interrupt.report
        >>> len(report)
        0
    """
    try:
        yield
    except KeyboardInterrupt as interrupt:
        interrupt.report = Report(list(trials), budget=budget)  # type: ignore[attr-defined]
        raise

