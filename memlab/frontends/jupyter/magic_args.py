"""The ``%%memfit`` magic's options: their declarations (``%%memfit?`` shows them), the reading of a magic's line,
and what both modes' requests share (:func:`run_options`, :class:`Job`).

The mode (training or ``--inference``) is chosen once, in :meth:`memlab.frontends.jupyter.magic.MemfitMagics`'s
parsing, by building the mode's request from what :func:`parse_line` read: a
:class:`~memlab.frontends.jupyter.magic_training.TrainingRequest` or an
:class:`~memlab.frontends.jupyter.magic_inference.InferenceRequest`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from IPython.core.error import UsageError
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from memlab.errors import MemlabError
from memlab.frontends.cli_errors import sentence, unknown_arguments
from memlab.frontends.jupyter.magic_cell import usage_error
from memlab.frontends.levers import lever_help, lever_specs
from memlab.inference.plan import InferencePlan
from memlab.options import RunOptions
from memlab.plan import Plan
from memlab.report import Report
from memlab.search import MAX_TRIALS

__all__ = ["ARGUMENTS", "DEFAULTS", "USAGE", "Job", "memfit_arguments", "parse_line", "read_line", "run_options",
           "unquote"]

DEFAULTS = RunOptions()
"""The run options a magic's line leaves as they are."""

USAGE = (
    "write %%memfit MODEL BATCH [--try KEY=V1,V2 ...] [--budget SIZE] [--batch-size N] [--steps N] "
    "[--warmup N] [--noise F] [--time-limit S] [--lr LR] [--search] [--apply] [--dry-run [--gpus N|auto] "
    "[--strategy fsdp2|zero2|zero3]] [--inference] [--quiet] [--verbose]; "
    "%%memfit? shows the help"
)
"""What the one-line error of an unreadable line ends with."""

ARGUMENTS = [
    argument("model", metavar="MODEL", help="name of the torch nn.Module (or transformers Trainer) in the notebook"),
    argument(
        "batch", metavar="BATCH", nargs="?", default=None,
        help="name of the batch in the notebook (dict of tensors, tensor, tuple); with a Trainer it may be left out: "
        "its train dataset's worst batch is measured",
    ),
    argument(
        "--try",
        dest="grid",
        nargs="+",
        action="extend",
        metavar="KEY=V1,V2",
        default=[],
        help=(
            "plans to compare: every combination of the values (repeated --try options make one grid), e.g. "
            "precision=fp32,bf16 checkpointing=off,on micro_batch=8,2. The levers: " + lever_help(lever_specs(Plan))
            + ". With --inference: " + lever_help(lever_specs(InferencePlan))
        ),
    ),
    argument(
        "--budget",
        metavar="SIZE",
        help="memory budget such as 8GiB, 500MB, 1.5G: search for the fastest plan that fits it",
    ),
    argument(
        "--batch-size",
        dest="batch_size",
        type=int,
        metavar="N",
        help="effective batch size (rows per optimizer step) to keep while searching; default: the rows of BATCH",
    ),
    argument(
        "--steps", type=int, metavar="N", default=DEFAULTS.steps, help="the fewest timed optimizer steps per plan"
    ),
    argument("--warmup", type=int, metavar="N", default=DEFAULTS.warmup, help="untimed warm-up steps per plan"),
    argument(
        "--noise",
        type=float,
        metavar="F",
        default=DEFAULTS.noise,
        help=(
            "time more steps until the 95%% interval of the median step time is within +-F of it "
            f"(default {DEFAULTS.noise:g}, i.e. {DEFAULTS.noise * 100:g}%%; 0: exactly --steps steps)"
        ),
    ),
    argument(
        "--time-limit",
        dest="time_limit",
        type=float,
        metavar="S",
        default=DEFAULTS.time_limit,
        help=f"stop timing a plan after S seconds of timed steps, noise or not (default {DEFAULTS.time_limit:g})",
    ),
    argument("--lr", type=float, metavar="LR", default=DEFAULTS.lr, help="learning rate of the optimizer"),
    argument(
        "--apply",
        action="store_true",
        help="put the best plan on the live model afterwards, as memfit_applied (memfit_applied.undo() undoes it)",
    ),
    argument(
        "--dry-run",
        dest="dry_run",
        action="store_true",
        help="estimate the plans on fake tensors instead of running them (nothing is trained)",
    ),
    argument(
        "--gpus",
        metavar="N|auto",
        help=(
            "with --dry-run: estimate training sharded over N GPUs (the peak per GPU, BATCH being what each GPU "
            "sees); auto, with --budget, finds the smallest N that fits, for each strategy"
        ),
    ),
    argument(
        "--strategy",
        metavar="fsdp2|zero2|zero3",
        help=(
            "with --dry-run --gpus: how training is sharded, FSDP2 (accelerate) or DeepSpeed ZeRO-2 / ZeRO-3 "
            "(default: all three); r = _ then r.best.plan.to_accelerate_config(gpus=N, strategy=...) exports it"
        ),
    ),
    argument(
        "--search",
        action="store_true",
        help="with --try: search for the fastest plan that fits --budget within the --try values",
    ),
    argument(
        "--max-trials",
        type=int,
        metavar="N",
        default=None,
        help=f"a search measures at most N plans, those expected fastest first (default {MAX_TRIALS})",
    ),
    argument(
        "--inference",
        action="store_true",
        help=(
            "measure inference instead of training: a forward (or, with new_tokens=N, a generation) under "
            "torch.inference_mode(), with the --try settings of memlab.InferencePlan; --budget alone finds the "
            "largest batch_size that fits; leave the cell body empty"
        ),
    ),
    argument("--quiet", action="store_true", help="no figure; only the table at the end"),
    argument(
        "--verbose",
        action="store_true",
        help="let third-party warnings (transformers, bitsandbytes...) through while plans run; quiet by default",
    ),
]
"""The magic's options, in the order ``%%memfit?`` lists them."""

Function = TypeVar("Function", bound=Callable[..., Any])


def memfit_arguments(function: Function) -> Function:
    """Declare :data:`ARGUMENTS` on the magic ``function``, as a stack of ``@argument`` decorators would.

    Example:
        >>> def memfit(line):
        ...     "Measure plans."
        >>> parse_line(memfit_arguments(memfit), "model batch --try precision=fp32,bf16").grid
        ['precision=fp32,bf16']
    """
    for declare in reversed(ARGUMENTS):  # a stack of decorators applies from the bottom up
        function = declare(function)
    declared: Function = magic_arguments()(function)
    return declared


def parse_line(magic: Callable[..., Any], line: str) -> Any:
    """What the line of ``magic`` (declared with :func:`memfit_arguments`) says, as an argparse namespace; a
    one-line UsageError that ends with :data:`USAGE` when it cannot be read.

    Example:
        >>> def memfit(line):
        ...     "Measure plans."
        >>> declared = memfit_arguments(memfit)
        >>> parse_line(declared, '')  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        IPython.core.error.UsageError: MODEL is missing; write the names of your model and batch, e.g. %%memfit m...
        >>> parse_line(declared, 'model batch --steps many')
        Traceback (most recent call last):
        ...
        IPython.core.error.UsageError: --steps 'many' is not a whole number; write for example --steps 3
        >>> parse_line(declared, 'model batch --budget')
        Traceback (most recent call last):
        ...
        IPython.core.error.UsageError: --budget needs a value after it; write for example --budget 20MiB
    """
    try:
        return parse_argstring(magic, line)
    except UsageError as error:
        raise usage_error(_line_sentence(magic, str(error))) from None
    except ValueError as error:  # shlex: an unclosed quote
        raise usage_error(f"the options cannot be read ({error}); {USAGE}") from None


def _line_sentence(magic: Any, message: str) -> str:
    """argparse's complaint about a ``%%memfit`` line as one sentence that says what to write."""
    wrong_type = _WRONG_TYPE.search(message)
    if wrong_type is not None:
        return _wrong_type_sentence(*wrong_type.groups())
    if re.search(r"required: MODEL", message):
        return "MODEL is missing; write the names of your model and batch, e.g. %%memfit model batch"
    parser = getattr(magic, "parser", None)
    unknown = re.match(r"unrecognized arguments: (.*)", message)
    if parser is not None and unknown:
        return unknown_arguments(parser, unknown.group(1).split(), prog="%%memfit",
                                 options_hint="%%memfit? lists the options")
    if parser is not None and re.match(r"argument [^:]+: (expected|invalid choice)", message):
        return sentence(parser, message)
    return f"{message.rstrip('.')}; {USAGE}"


_WRONG_TYPE = re.compile(r"argument (--[a-z-]+): invalid (int|float) value: '(.*)'")
"""argparse's error for a value of the wrong type: the option, the type, the value."""

_EXAMPLES = {"--batch-size": 8, "--max-trials": MAX_TRIALS, "--steps": DEFAULTS.steps, "--warmup": DEFAULTS.warmup,
             "--noise": DEFAULTS.noise, "--time-limit": DEFAULTS.time_limit, "--lr": DEFAULTS.lr}


def _wrong_type_sentence(option: str, kind: str, value: str) -> str:
    """``--steps many`` -> ``--steps 'many' is not a whole number; write for example --steps 3``."""
    what = "a whole number" if kind == "int" else "a number"
    example = _EXAMPLES.get(option, 1)
    return f"{option} {value!r} is not {what}; write for example {option} {example:g}"


def read_line(line: str) -> Any:
    """What a ``%%memfit`` line says (:func:`parse_line` against the magic's declarations, without a shell).

    Example:
        >>> read_line("model batch --budget 8GiB --quiet").budget
        '8GiB'
    """

    @memfit_arguments
    def memfit(line: str) -> None:
        """The magic's options."""

    return parse_line(memfit, line)


def unquote(text: str | None) -> str | None:
    """``text`` without the quotes around it (``--budget "8GiB"``).

    Example:
        >>> unquote('"8GiB"'), unquote("8GiB"), unquote(None)
        ('8GiB', '8GiB', None)
    """
    if text is not None and len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    return text


def run_options(args: Any, **more: Any) -> RunOptions:
    """The run options that both modes read from the line (``more`` adds the mode's own); a one-line UsageError
    for a wrong value.

    Example:
        >>> from types import SimpleNamespace
        >>> line = SimpleNamespace(steps=2, warmup=0, budget="'1KiB'", noise=0.0, time_limit=5.0, verbose=False)
        >>> run_options(line).budget
        1024
    """
    keywords = {
        "steps": args.steps, "warmup": args.warmup, "budget": unquote(args.budget), "noise": args.noise,
        "time_limit": args.time_limit, "verbose": args.verbose, "progress": False, **more,
    }
    try:
        return RunOptions.from_keywords(keywords)
    except MemlabError as error:
        raise usage_error(str(error)) from None


@dataclass(frozen=True)
class Job:
    """What a mode's request prepared from the notebook: the run options, the figure's memory categories, the work
    (``work(options)``, options with the live figure as callback) and what to do with its report afterwards.

    Example:
        >>> job = Job(DEFAULTS, ("params",), lambda options: Report([], budget=options.budget))
        >>> len(job.work(job.options)), job.after is None
        (0, True)
    """

    options: RunOptions
    categories: tuple[str, ...]
    work: Callable[[RunOptions], Report]
    after: Callable[[Report], None] | None = None
