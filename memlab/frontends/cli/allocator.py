"""The CUDA allocator's expandable segments in ``memlab estimate``: ``--expandable-segments`` (the card figure
for ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``), and where nothing fits with PyTorch's default allocator,
the plans that fit with expandable segments, with the line that sets them.

Expandable segments change what the card shows (the allocator's reserve over the allocated peak), not the step:
a plan whose allocated peak and CUDA context fit the budget while its reserve does not is estimated again with them
(:func:`expandable_suggestion`)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from memlab.estimation.cuda.allocator import assumed_allocator
from memlab.frontends.cli.gpu import cli_gpu
from memlab.live.device import ENVIRONMENT_LINE, PYTHON_LINE

__all__ = ["add_allocator_argument", "expandable_suggestion", "with_allocator"]

MOST_ESTIMATED = 2
"""The most plans estimated again with expandable segments (each is one more dry run)."""


def add_allocator_argument(parser: argparse.ArgumentParser) -> None:
    """Declare ``--expandable-segments`` on ``parser``.

    Example:
        >>> parser = argparse.ArgumentParser(prog="memlab estimate")
        >>> add_allocator_argument(parser)
        >>> parser.parse_args(["--expandable-segments"]).expandable_segments, parser.parse_args([]).expandable_segments
        (True, False)
    """
    parser.add_argument(
        "--expandable-segments", action="store_true",
        help="the card figure with the CUDA allocator's expandable segments (PYTORCH_CUDA_ALLOC_CONF="
        "expandable_segments:True; default: PyTorch's default allocator, as the processes you start without it)",
    )


def with_allocator(handler: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """``handler`` run with the allocator ``--expandable-segments`` says assumed by every estimate it makes.

    Example:
        >>> from memlab.estimation.cuda.allocator import expandable_segments_assumed
        >>> run = with_allocator(lambda args: int(expandable_segments_assumed()))
        >>> run(argparse.Namespace(expandable_segments=True)), run(argparse.Namespace())
        (1, 0)
    """

    def run(args: argparse.Namespace) -> int:
        with assumed_allocator(bool(getattr(args, "expandable_segments", False))):
            return handler(args)

    run.__doc__ = handler.__doc__
    return run


def reserve_over(trial: Any, budget: int) -> bool:
    """Whether only the allocator's reserve puts ``trial`` over ``budget``: its allocated peak and CUDA context fit,
    its card figure does not (what expandable segments can change).

    Example:
        >>> from memlab.plan import Plan
        >>> from memlab.report import Trial
        >>> trial = Trial(Plan(), "ok", 90, {}, None, None, None, "cuda", reserved_bytes=115, context_bytes=5)
        >>> reserve_over(trial, 100), reserve_over(trial, 90), reserve_over(trial, 120)
        (True, False, False)
    """
    card = trial.card_bytes
    return (trial.status == "ok" and card is not None and card > budget
            and trial.peak_bytes + (trial.context_bytes or 0) <= budget)


def expandable_suggestion(args: argparse.Namespace, model: Any, batch: Any, report: Any, *,
                          load: dict[str, Any] | None, say: Any) -> list[str]:
    """The lines after a table where nothing fits: the plans tried that fit with expandable segments (estimated
    again so, at most :data:`MOST_ESTIMATED`, the lowest card figure first), each with its card figure both ways,
    the line that sets them and the command that estimates them; none on the CPU, with ``--expandable-segments``
    already, or where no plan's reserve alone is over the budget."""
    from memlab.estimation.cuda.context import card_contexts
    from memlab.frontends.cli.estimate.next import command_for, plan_try
    from memlab.frontends.cli.estimate.progress import estimate_each
    from memlab.plan import format_bytes

    budget = report.budget
    if budget is None or getattr(args, "expandable_segments", False) or args.device == "cpu":
        return []
    over = sorted((trial for trial in report.trials if reserve_over(trial, budget)
                   and not trial.plan.expandable_segments), key=lambda t: t.card_bytes)
    over = over[:MOST_ESTIMATED]
    if not over:
        return []
    if hasattr(say, "expect"):
        say.expect(len(over))
    lines: list[str] = []
    for trial in over:
        say(f"estimating {trial.label} with the allocator's expandable segments")
        plan = trial.plan.replace(expandable_segments=True)  # the plan suggested: --try, apply and exports take it
        found = estimate_each(model, batch, [plan], budget=budget, device=args.device, say=lambda _: None,
                              gpu=cli_gpu(args), load=load)
        again = card_contexts(found.trials, cli_gpu(args))[0]
        if again.status != "ok" or again.card_bytes is None or again.card_bytes > budget:
            continue
        if not lines:
            lines.append("Fits with the CUDA allocator's expandable segments (the same step, a smaller reserve):")
        lines += [f"  {plan.label()}: card {format_bytes(again.card_bytes)} ({format_bytes(trial.card_bytes)} with "
                  "the default allocator), estimated so by:",
                  f"    {command_for(args, plan_try(plan))}"]
    if lines:
        lines += ["Set them before CUDA starts, in the shell:", f"  {ENVIRONMENT_LINE}",
                  "or first thing in Python, before torch touches CUDA:", f"  {PYTHON_LINE}"]
    return lines
