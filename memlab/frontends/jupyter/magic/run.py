"""What a ``%%memfit`` line asks to run: the mode chosen once (:func:`request_for`), the mode's request checked before
the model is touched, and the :class:`Job` it prepares from the notebook (:func:`prepare`).

- **Training** (:class:`TrainingRequest`): ``memlab.compare`` over the ``--try`` grid, ``memlab.fit`` when
  ``--budget`` or ``--batch-size`` comes without ``--try`` (or with ``--search``), ``memlab.estimate`` with
  ``--dry-run``, and with ``--dry-run --gpus N|auto`` :func:`memlab.estimation.sharded.per_gpu.sharded_trials` (a line
  per plan and strategy, and a Report of one trial per plan and strategy). ``--apply`` puts the best plan on the live
  model as :data:`APPLIED_NAME`.
- **Inference** (:class:`InferenceRequest`, ``--inference``): ``memlab.compare`` measures the ``--try`` settings of
  :class:`memlab.InferencePlan` under ``torch.inference_mode()``; ``--budget`` with one setting (``--try`` values
  without a choice, and no ``batch_size``) finds the largest batch of it that fits (:func:`memlab.fit_inference`),
  ``--search --budget`` the fastest ``--try`` setting that fits, and ``--dry-run`` estimates them. The cell body
  stays empty: the forward, or the generation, is the model's own.

How the job is shown while it runs is :mod:`memlab.frontends.jupyter.magic.render`'s.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

from torch import nn

from memlab.errors import MemlabError
from memlab.estimation.cuda.context import card_context, live_card_context
from memlab.estimation.cuda.gpus import GpuKind, gpu_kind
from memlab.estimation.estimate import estimate, estimate_plans
from memlab.estimation.sharded.per_gpu import parse_gpus, sharded_lines, sharded_trials
from memlab.frontends.jupyter.magic.parse import DEFAULTS, body_loss_fn, lookup_name, run_options, unquote, usage_error
from memlab.inference.fit import fit_inference
from memlab.live.batch import LossFn, count_rows
from memlab.live.trainer_kinds import generates
from memlab.options import RunOptions
from memlab.plan import (
    InferencePlan,
    Plan,
    parse_axes,
    parse_grid,
    parse_inference_axes,
    parse_inference_grid,
    trainer_levers_refusal,
)
from memlab.report import CATEGORIES, INFERENCE_CATEGORIES, Report
from memlab.runner.trial import compare
from memlab.search import MAX_TRIALS, fit
from memlab.search.space import keep_rows
from memlab.trainer.apply import TrainerApplied
from memlab.trainer.entry import live_target
from memlab.trainer.source import is_trainer, trainer_model

__all__ = ["APPLIED_NAME", "InferenceRequest", "Job", "TrainingRequest", "apply_best", "host_judged", "keep_rows",
           "prepare", "request_for"]

APPLIED_NAME = "memfit_applied"
"""The user-namespace name under which ``--apply`` stores the :class:`memlab.Applied`."""

_STRATEGIES = ("fsdp1", "fsdp2", "zero2", "zero3")  # the default, when none is named: the last three


@dataclass(frozen=True)
class Job:
    """What a mode's request prepared from the notebook: the run options, the figure's memory categories, the work
    (``work(options)``, options with the live figure as callback) and what to do with its report afterwards.

    Example:
        >>> job = Job(RunOptions(), ("params",), lambda options: Report([], budget=options.budget))
        >>> len(job.work(job.options)), job.after is None
        (0, True)
    """

    options: RunOptions
    categories: tuple[str, ...]
    work: Callable[[RunOptions], Report]
    after: Callable[[Report], None] | None = None


# --- the mode, chosen once -------------------------------------------------------------------------------------


def request_for(args: Any) -> TrainingRequest | InferenceRequest:
    """The request of a parsed line: the one place where the mode (training or ``--inference``) is chosen. Each
    request checks the options that go together; a one-line UsageError if not.

    Example:
        >>> from memlab.frontends.jupyter.magic.parse import read_line
        >>> type(request_for(read_line("net xs"))).__name__, type(request_for(read_line("lm xs --inference"))).__name__
        ('TrainingRequest', 'InferenceRequest')
    """
    return InferenceRequest.from_args(args) if args.inference else TrainingRequest.from_args(args)


def prepare(request: TrainingRequest | InferenceRequest, namespace: MutableMapping[str, Any], cell: str | None) -> Job:
    """MODEL looked up in ``namespace`` (a Trainer stands for its model), checked, and handed to the request, which
    looks BATCH up and prepares the :class:`Job`; a one-line UsageError, before anything runs, for wrong input.

    Example:
        >>> import torch
        >>> from memlab.frontends.jupyter.magic.parse import read_line
        >>> namespace = {"net": torch.nn.Linear(4, 1), "xs": torch.randn(8, 4)}
        >>> job = prepare(request_for(read_line("net xs --steps 1")), namespace, "net(xs).sum()")
        >>> job.categories[0], job.options.steps
        ('params', 1)
    """
    args = request.args
    model = lookup_name(namespace, args.model, "MODEL")
    trainer = model if is_trainer(model) else None
    if trainer is not None:
        model = trainer_model(trainer)
    if not isinstance(model, nn.Module):
        raise usage_error(
            f"MODEL {args.model!r} is a {type(model).__name__}, not a torch nn.Module or a transformers Trainer; "
            "write the name of your model, e.g. %%memfit model batch"
        )
    if args.batch is None and (trainer is None or isinstance(request, InferenceRequest)):
        raise usage_error(
            "BATCH is missing; write the name of your batch after the model's, e.g. %%memfit model batch"
            + ("" if trainer is not None else " (a Trainer's batch may be left out)")
        )
    return request.prepare(namespace, model, cell, trainer=trainer)


# --- training --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TrainingRequest:
    """A training ``%%memfit`` line, read and checked (see the module docstring).

    Example:
        >>> from memlab.frontends.jupyter.magic.parse import read_line
        >>> request = TrainingRequest.from_args(read_line("net xs --budget 1GiB"))
        >>> request.search, request.options.budget, len(request.plans)
        (True, 1073741824, 1)
    """

    args: Any
    options: RunOptions
    plans: list[Plan]
    search: bool
    sharding: tuple[int | str, list[str] | None] | None
    gpu: GpuKind | None = None

    @classmethod
    def from_args(cls, args: Any) -> TrainingRequest:
        """Check the options that go together, before anything is looked up; a one-line UsageError if not."""
        search = args.search or (not args.grid and (args.budget is not None or args.batch_size is not None))
        if args.search and not args.grid:
            raise usage_error("--search searches within the --try values; add --try KEY=V1,V2, or drop --search")
        if args.grid and args.batch_size is not None and not search:
            raise usage_error(
                "--batch-size sets the effective batch of a search; add --search to search within the --try values"
            )
        if args.max_trials is not None and not search:
            raise usage_error(
                "--max-trials limits a search; add --budget SIZE (or --search with --try), or drop --max-trials"
            )
        if args.apply and args.dry_run:
            raise usage_error("--apply needs measured plans, and --dry-run only estimates them; drop one of the two")
        sharding = _sharding(args)
        gpu = _gpu(args)
        options = _for_card(run_options(args, lr=args.lr), gpu)
        try:
            plans = parse_grid(args.grid)
        except MemlabError as error:
            raise usage_error(str(error)) from None
        return cls(args, options, plans, search, sharding, gpu)

    def prepare(
        self, namespace: MutableMapping[str, Any], model: nn.Module, cell: str | None, trainer: Any = None
    ) -> Job:
        """Look BATCH up, compile the cell body into the loss and check them against the model; the Job to run.
        With a ``trainer`` (MODEL named one): its model, its ``compute_loss`` unless the cell body gives a loss, its
        effective batch, and without BATCH its train dataset's worst batch (:mod:`memlab.trainer.entry`)."""
        args = self.args
        if not any(parameter.requires_grad for parameter in model.parameters()):
            raise usage_error(
                f"MODEL {args.model!r} has no trainable parameters; set requires_grad=True on what should train"
            )
        if trainer is None:  # a built trainer's own setting (precompute_ref, the vLLM engine's) on a model refused
            refusal = trainer_levers_refusal(parse_axes(args.grid), f"MODEL {args.model!r} is a {type(model).__name__}",
                                             "name that trainer as MODEL, e.g. %%memfit trainer --try {name}=...")
            if refusal:
                raise usage_error(refusal)
        batch = None if args.batch is None else lookup_name(namespace, args.batch, "BATCH")
        target = None
        grpo = generates(trainer)
        if grpo and self.sharding is not None:
            raise usage_error(f"MODEL {args.model!r} is a GRPOTrainer, whose step memlab estimates on one device; "
                              "drop --gpus and --strategy")
        if trainer is not None:
            try:  # a GRPOTrainer's batch is what it generates: its step runs (and is estimated) on the trainer
                target = live_target(trainer, batch, generation=True)
            except MemlabError as error:
                raise usage_error(f"MODEL {args.model!r}: {error}") from None
            batch = target.batch
            print(target.note or f"Trainer {args.model}: its model and compute_loss, on {args.batch}")
        if batch is None:
            raise usage_error(
                "BATCH is missing; write the name of your batch after the model's, e.g. %%memfit model batch"
            )
        try:
            rows = count_rows(batch)
        except MemlabError as error:
            raise usage_error(f"BATCH {args.batch!r}: {error}") from None
        loss_fn = body_loss_fn(cell, namespace, args.model, args.batch or "batch")
        if loss_fn is None and target is not None:
            loss_fn = target.loss_fn
        effective = rows if target is None or target.batch_size is None else target.batch_size
        if loss_fn is None and not isinstance(batch, Mapping):
            raise usage_error(
                f"BATCH {args.batch!r} is a {type(batch).__name__}, so memlab cannot call model(**batch); "
                "write the loss in the cell body, e.g. loss = loss_fn(model(batch[0]), batch[1])"
            )
        plans, kept = self.plans, None
        if not self.search and self.sharding is None:
            try:
                plans, kept = keep_rows(self.plans, args.grid, effective, args.batch or "the batch")
            except MemlabError as error:
                raise usage_error(str(error)) from None

        gpu = self.gpu

        def on_card(trial: Any) -> Any:
            return carded(trial, gpu, model)

        def work(options: RunOptions) -> Report:
            if self.sharding is not None:
                gpus, strategies = self.sharding
                # A dry run sends the live figure no events: each one is said as it starts (--gpus auto may make
                # several per plan, minutes each on a large model), unless the cell asked for --quiet.
                say = None if args.quiet else _say
                found = sharded_trials(model, batch, plans, gpus=gpus, strategies=strategies,
                                       budget=options.budget, loss_fn=loss_fn, lr=options.lr, say=say, gpu=gpu)
                print(f"Per GPU, {args.batch} ({rows} row{'s' if rows != 1 else ''}) being each GPU's micro-batch:")
                for text in sharded_lines(found, options.budget):
                    print(text)
                return Report([host_judged(trial, options.host_budget) for _, _, trial in found if trial is not None],
                              budget=options.budget)
            if self.search:
                space = parse_axes(args.grid) or None
                size = effective if args.batch_size is None else args.batch_size
                limit = MAX_TRIALS if args.max_trials is None else args.max_trials
                return fit(*((trainer, None) if grpo else (model, batch)), batch_size=size, space=space,
                           dry_run=args.dry_run, max_trials=limit, gpu=gpu, **options.keywords())
            if args.dry_run and grpo:
                report = Report([estimate(trainer, plan, loss_fn=loss_fn, budget=options.budget, lr=options.lr,
                                          host_budget=options.host_budget, gpu=gpu) for plan in plans],
                                budget=options.budget)
                report.trials = [on_card(trial) for trial in report]
            elif args.dry_run:
                report = estimate_plans(model, batch, plans, loss_fn=loss_fn, budget=options.budget, lr=options.lr,
                                        gpu=gpu)
                report.trials = [host_judged(on_card(trial), options.host_budget) for trial in report]
            else:
                report = compare(model, batch, plans, **options.keywords())
            if kept is not None:
                for trial in report.trials:
                    trial.notes = (*trial.notes, kept)
            return report

        def after(report: Report) -> None:
            if args.apply:
                apply_best(namespace, model if trainer is None else trainer, report,
                           loss_fn if trainer is None else None, self.options.lr, args.model)

        return Job(self.options.replace(loss_fn=loss_fn), CATEGORIES, work, after)


def host_judged(trial: Any, host_budget: int | None) -> Any:
    """An estimated ``trial`` judged against ``--host-budget`` too (as it is without one: an estimate has no host
    budget unless given).

    Example:
        >>> from memlab.report import Trial
        >>> trial = Trial(Plan(), "ok", 1, {}, None, None, None, "cuda", host_bytes=2048)
        >>> judged = host_judged(trial, 1024)
        >>> judged.fits, judged.verdict_figure, host_judged(trial, None) is trial
        (False, 'host', True)
    """
    return trial if host_budget is None else dataclasses.replace(trial, host_budget=host_budget)


def _say(text: str) -> None:
    print(f"memlab: {text}", flush=True)


def apply_best(
    namespace: MutableMapping[str, Any],
    model: nn.Module,
    report: Report,
    loss_fn: LossFn | None,
    lr: float,
    model_name: str,
) -> None:
    """``--apply``: put the report's best plan on ``model`` and store it as :data:`APPLIED_NAME` in ``namespace``
    (a plan applied there before to the same model is undone first); nothing when no plan fits.

    Example:
        >>> import torch
        >>> namespace = {}
        >>> apply_best(namespace, torch.nn.Linear(2, 1), Report([]), None, 1e-3, "net")
        No plan fits, so nothing was applied; net is as it was.
    """
    from memlab.runner.apply import Applied, apply

    best = report.best
    if best is None:
        print(f"No plan fits, so nothing was applied; {model_name} is as it was.")
        return
    previous = namespace.get(APPLIED_NAME)
    trainer = is_trainer(model)
    if (isinstance(previous, Applied) and previous.active and previous.model is model) or (
        isinstance(previous, TrainerApplied) and not previous.undone and previous.trainer is model
    ):
        previous.undo()
        print(f"Undid the previous {APPLIED_NAME} ({previous.plan.label()}) first.")
    applied = apply(model, best.plan) if trainer else apply(model, best.plan, loss_fn=loss_fn, lr=lr)
    namespace[APPLIED_NAME] = applied
    train = f"{model_name}.train()" if trainer else f"{APPLIED_NAME}.step(batch)"
    print(
        f"Applied {best.label} to {model_name} as {APPLIED_NAME}: train with {train}; undo with {APPLIED_NAME}.undo()"
    )


def carded(trial: Any, gpu: GpuKind | None, model: nn.Module) -> Any:
    """A dry run's ``trial`` with the CUDA context of the card: the kind ``--gpu`` names, else the GPU the model is on
    (the default kind's for a model off the GPU).

    Example:
        >>> from memlab.report import Trial
        >>> trial = Trial(Plan(), "ok", 1, {}, None, None, None, "cuda", reserved_bytes=1)
        >>> carded(trial, gpu_kind("L4-24GB"), nn.Linear(1, 1)).context_bytes == gpu_kind("L4-24GB").context_bytes
        True
    """
    return card_context(trial, gpu) if gpu is not None else live_card_context(trial, model)


def _gpu(args: Any) -> GpuKind | None:
    """The GPU kind ``--gpu`` names (None without it); a one-line UsageError for a live run or a kind memlab does not
    know, saying what to write.

    Example:
        >>> from memlab.frontends.jupyter.magic.parse import read_line
        >>> _gpu(read_line("net xs --dry-run --gpu RTX4090-24GB")).name, _gpu(read_line("net xs")) is None
        ('RTX4090-24GB', True)
    """
    if args.gpu is None:
        return None
    name = str(unquote(args.gpu))
    if not args.dry_run:
        raise usage_error(f"--gpu {name} names the GPU a dry run is for, and without --dry-run memlab measures on the "
                          f"device the model is on; add --dry-run, e.g. %%memfit model batch --dry-run --gpu {name}")
    try:
        return gpu_kind(name)
    except MemlabError as error:
        raise usage_error(str(error).replace("gpu=", "--gpu ", 1)) from None


def _for_card(options: RunOptions, gpu: GpuKind | None) -> RunOptions:
    """``options`` with the budget the card's memory where ``--gpu`` names one and ``--budget`` is not given, as
    ``memlab estimate --gpu`` judges."""
    return options.replace(budget=gpu.memory_bytes) if gpu is not None and options.budget is None else options


def _sharding(args: Any) -> tuple[int | str, list[str] | None] | None:
    """``(gpus, strategies)`` of a sharded dry run (``--gpus``/``--strategy``), None without them; a one-line
    UsageError for a live run, a wrong value or an option that does not go with them."""
    if args.gpus is None and args.strategy is None:
        return None
    given = " ".join(f"--{name} {value}" for name, value in (("gpus", args.gpus), ("strategy", args.strategy)) if value)
    if not args.dry_run:
        raise usage_error(
            f"{given} estimates training sharded over several GPUs, and memlab never shards a live run; add "
            "--dry-run, e.g. %%memfit model batch --dry-run --gpus 8 --strategy fsdp2 --budget 80GiB"
        )
    if args.gpus is None:
        raise usage_error(
            f"--strategy {args.strategy} needs a number of GPUs; add --gpus N, e.g. --gpus 8, or --gpus auto "
            "with --budget"
        )
    try:
        gpus = parse_gpus(unquote(args.gpus))
    except MemlabError:
        raise usage_error(
            f"--gpus {args.gpus!r} is not a number of GPUs; write an int >= 1 such as --gpus 8, or --gpus auto "
            "with --budget"
        ) from None
    if gpus == "auto" and args.budget is None:
        raise usage_error("--gpus auto finds the smallest number of GPUs that fits a budget; add --budget, "
                          "e.g. --gpus auto --budget 80GiB")
    strategies = None
    if args.strategy is not None:
        name = str(unquote(args.strategy)).strip().lower()
        if name not in _STRATEGIES:
            raise usage_error(
                f"--strategy {args.strategy!r} is unknown; write --strategy fsdp1, fsdp2, zero2 or zero3 (or leave it "
                "out for fsdp2, zero2 and zero3)"
            )
        strategies = [name]
    if args.search or args.batch_size is not None:
        raise usage_error(
            f"{'--search' if args.search else '--batch-size'} does not go with {given}: a sharded dry run estimates "
            "exactly the --try plans; drop it"
        )
    return gpus, strategies


# --- inference -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class InferenceRequest:
    """An ``--inference`` line, read and checked (see the module docstring).

    Example:
        >>> from memlab.frontends.jupyter.magic.parse import read_line
        >>> request = InferenceRequest.from_args(read_line("lm prompts --inference --try weights=fp32,bf16"))
        >>> [plan.label() for plan in request.plans]
        ['fp32', 'bf16']
    """

    args: Any
    options: RunOptions
    plans: list[InferencePlan]
    axes: dict[str, list[Any]]
    gpu: GpuKind | None = None

    @classmethod
    def from_args(cls, args: Any) -> InferenceRequest:
        """Refuse what is for training, and check the options that go together; a one-line UsageError if not."""
        refused = [
            ("--apply", args.apply, "inference changes nothing to apply"),
            ("--batch-size", args.batch_size is not None, "write --try batch_size=N (or --budget alone for the "
             "largest batch that fits)"),
            ("--gpus", args.gpus is not None, "inference is measured on one device"),
            ("--strategy", args.strategy is not None, "inference is measured on one device"),
            ("--lr", args.lr != DEFAULTS.lr, "inference runs no optimizer"),
            ("--max-trials", args.max_trials is not None, "an inference search measures every --try setting"),
            ("--search", args.search and args.dry_run, "a dry run estimates memory, not speed (--dry-run --budget "
             "marks each --try setting against the budget)"),
        ]
        for flag, given, why in refused:
            if given:
                raise usage_error(f"{flag} does not go with --inference: {why}; drop {flag}")
        if args.search and (not args.grid or args.budget is None):
            raise usage_error(
                "--search --inference finds the fastest --try setting within --budget; add --try KEY=V1,V2 and "
                "--budget SIZE, or drop --search"
            )
        gpu = _gpu(args)
        options = _for_card(run_options(args), gpu)
        try:
            plans = parse_inference_grid(args.grid)
            axes = parse_inference_axes(args.grid)
        except MemlabError as error:
            raise usage_error(str(error)) from None
        return cls(args, options, plans, axes, gpu)

    def prepare(
        self, namespace: MutableMapping[str, Any], model: nn.Module, cell: str | None, trainer: Any = None
    ) -> Job:
        """Look BATCH up and check that the cell body is empty; the Job to run."""
        args = self.args
        batch = lookup_name(namespace, args.batch, "BATCH")
        try:
            count_rows(batch)
        except MemlabError as error:
            raise usage_error(f"BATCH {args.batch!r}: {error}") from None
        if (cell or "").strip():
            raise usage_error(
                "the cell body is a training loss, and --inference runs the model's forward (or generation) itself; "
                "leave the body empty"
            )

        gpu = self.gpu

        def work(options: RunOptions) -> Report:
            if args.dry_run:
                report = estimate_plans(model, batch, self.plans, budget=options.budget, gpu=gpu)
                report.trials = [carded(trial, gpu, model) for trial in report]
                return report
            if args.search:
                return fit_inference(model, batch, goal="speed", space=self.axes, **options.keywords())
            if args.budget is not None and "batch_size" not in self.axes and all(
                len(values) == 1 for values in self.axes.values()
            ):
                # --budget with one setting (or none): the largest batch of that setting that fits.
                return fit_inference(model, batch, self.plans[0], goal="batch", **options.keywords())
            return compare(model, batch, self.plans, **options.keywords())

        return Job(self.options, INFERENCE_CATEGORIES, work)
