"""``%%memfit --inference``: which run the line asks for among :class:`memlab.InferencePlan` settings, checked before
the model is touched, and the run.

``memlab.compare`` measures the ``--try`` settings under ``torch.inference_mode()``; ``--budget`` with one setting
(``--try`` values without a choice, and no ``batch_size``) finds the largest batch of it that fits
(:func:`memlab.fit_inference`), ``--search --budget`` the fastest ``--try`` setting that fits, and ``--dry-run``
estimates them. The cell body stays empty: the forward, or the generation, is the model's own.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import Any

from torch import nn

from memlab.errors import MemlabError
from memlab.estimation.cuda_context import live_card_context
from memlab.estimation.estimate import estimate_plans
from memlab.frontends.jupyter.magic_args import DEFAULTS, Job, run_options
from memlab.frontends.jupyter.magic_cell import lookup_name, usage_error
from memlab.inference.fit import fit_inference
from memlab.inference.plan import InferencePlan, parse_inference_axes, parse_inference_grid
from memlab.live.batch import count_rows
from memlab.options import RunOptions
from memlab.report import INFERENCE_CATEGORIES, Report
from memlab.runner.trial import compare

__all__ = ["InferenceRequest"]


@dataclass(frozen=True)
class InferenceRequest:
    """An ``--inference`` line, read and checked (see the module docstring).

    Example:
        >>> from memlab.frontends.jupyter.magic_args import read_line
        >>> request = InferenceRequest.from_args(read_line("lm prompts --inference --try weights=fp32,bf16"))
        >>> [plan.label() for plan in request.plans]
        ['fp32', 'bf16']
    """

    args: Any
    options: RunOptions
    plans: list[InferencePlan]
    axes: dict[str, list[Any]]

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
        options = run_options(args)
        try:
            plans = parse_inference_grid(args.grid)
            axes = parse_inference_axes(args.grid)
        except MemlabError as error:
            raise usage_error(str(error)) from None
        return cls(args, options, plans, axes)

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

        def work(options: RunOptions) -> Report:
            if args.dry_run:
                report = estimate_plans(model, batch, self.plans, budget=options.budget)
                report.trials = [live_card_context(trial, model) for trial in report]
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
