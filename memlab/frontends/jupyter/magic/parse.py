"""What a ``%%memfit`` line and cell say: the magic's argument declarations (``%%memfit?`` shows them), the line
parsed and its run options read, MODEL and BATCH looked up by name, the cell body compiled into the loss, and the
one-line UsageError every wrong input raises (:func:`usage_error`).

Nothing is ``eval``-ed: names are identifiers joined by dots, resolved with dictionary lookups and ``getattr``; the
body is the user's own code, compiled once and run as their loss function. Which mode the line asks for (training or
``--inference``) is chosen once from what :func:`parse_line` read
(:func:`~memlab.frontends.jupyter.magic.run.request_for`).
"""

from __future__ import annotations

import ast
import keyword
import re
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from IPython.core.error import UsageError
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring
from IPython.utils.process import arg_split
from torch import nn

from memlab.errors import MemlabError
from memlab.frontends.jupyter.magic.usage import USAGE, as_options, at_least_one, grid_slip, line_sentence, usage_error
from memlab.frontends.levers import lever_help, lever_specs
from memlab.live.batch import Batch, LossFn
from memlab.options import RunOptions
from memlab.plan import InferencePlan, Plan
from memlab.search import MAX_TRIALS

__all__ = [
    "ARGUMENTS", "DEFAULTS", "USAGE", "body_loss_fn", "empty_body_transformer", "lookup_name", "memfit_arguments",
    "parse_line", "read_line", "run_options", "unquote", "usage_error",
]

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_RESULT = "_memfit_loss_"
_CELL_MAGIC_LINE = re.compile(r"^%%memfit(\s|$)")


# --- the line ---------------------------------------------------------------------------------------------------


DEFAULTS = RunOptions()
"""The run options a magic's line leaves as they are."""

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
        "--host-budget",
        dest="host_budget",
        metavar="SIZE",
        help="host (CPU) memory the plans may keep, such as 64GiB (offloaded optimizer state and activations, a paged "
        "optimizer's spill): a plan over it 'does not fit (host)'; default: what the machine has available",
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
        "--gpu",
        metavar="KIND",
        help=(
            "with --dry-run: the GPU the estimate is for, from any machine (RTX4090-24GB, A100-40GB, ...: "
            "memlab.estimation.cuda.gpus.GPUS), its memory the budget unless --budget says another; default the GPU "
            "the model is on, or an H100-80GB's figures"
        ),
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
        metavar="fsdp1|fsdp2|zero2|zero3",
        help=(
            "with --dry-run --gpus: how training is sharded, FSDP1 / FSDP2 (accelerate) or DeepSpeed ZeRO-2 / "
            "ZeRO-3 (default: fsdp2, zero2 and zero3); r = _ then "
            "r.best.plan.to_accelerate_config(gpus=N, strategy=...) exports it"
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
        tokens = arg_split(line)
    except ValueError:  # shlex: an unclosed quote
        raise usage_error(
            "a quote on the line is not closed; close it, e.g. --budget \"8GiB\", or write the value without quotes"
        ) from None
    try:
        args = parse_argstring(magic, line)
    except UsageError as error:
        raise usage_error(line_sentence(magic, str(error), tokens)) from None
    at_least_one(args)
    slip = grid_slip(args.grid)
    if slip is not None:
        raise usage_error(slip)
    return args


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
        "steps": args.steps, "warmup": args.warmup, "budget": unquote(args.budget),
        "host_budget": unquote(getattr(args, "host_budget", None)), "noise": args.noise,
        "time_limit": args.time_limit, "verbose": args.verbose, "progress": False, **more,
    }
    try:
        return RunOptions.from_keywords(keywords)
    except MemlabError as error:
        said = as_options(str(error), keywords).replace("host_budget '", "--host-budget '")  # the option's name
        raise usage_error(said) from None


# --- names ------------------------------------------------------------------------------------------------------


def lookup_name(namespace: Mapping[str, Any], name: str, what: str) -> Any:
    """The object a name stands for in ``namespace``: ``model``, or an attribute chain such as ``trainer.model``.

    Only identifiers joined by dots are accepted, and they are resolved with dictionary lookups and
    ``getattr``; nothing is ever ``eval``-ed. A bad or unknown name raises a one-line ``UsageError``.

    Example:
        >>> class Trainer:
        ...     model = "the model"
        >>> lookup_name({"trainer": Trainer()}, "trainer.model", "MODEL")
        'the model'
        >>> lookup_name({}, "net", "MODEL")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        IPython.core.error.UsageError: MODEL 'net' is not defined in the notebook; define it in a cell first, ...
    """
    name = name.strip()
    parts = name.split(".")
    if not _NAME.match(name) or any(keyword.iskeyword(part) for part in parts):
        raise usage_error(
            f"{what} {name!r} is not a variable name; write the name of a notebook variable, such as "
            f"{'model' if what == 'MODEL' else 'batch'} or trainer.{'model' if what == 'MODEL' else 'batch'} "
            "(expressions are not evaluated)"
        )
    if parts[0] not in namespace:
        raise usage_error(
            f"{what} {parts[0]!r} is not defined in the notebook; define it in a cell first, or check the spelling"
        )
    value = namespace[parts[0]]
    for depth, part in enumerate(parts[1:], start=1):
        try:
            value = getattr(value, part)
        except AttributeError:
            owner = ".".join(parts[:depth])
            raise usage_error(
                f"{what} {name!r}: {owner} has no attribute {part!r}; write a name that exists, such as {owner}"
            ) from None
    return value


# --- the cell body as the loss ----------------------------------------------------------------------------------


def body_loss_fn(
    body: str | None,
    namespace: Mapping[str, Any],
    model_name: str = "model",
    batch_name: str = "batch",
) -> LossFn | None:
    """The loss function a cell body stands for, compiled once; None for an empty body (``model(**batch).loss``).

    The body runs for every micro-batch in a fresh copy of ``namespace`` in which ``model_name`` and
    ``batch_name`` are bound to the model and the micro-batch (for dotted names such as ``trainer.model``,
    the names ``model`` and ``batch`` are bound instead). The loss is the variable ``loss`` if the body assigns
    it, else the value of the body's last line if that is an expression (``model(**batch).loss``). A syntax
    error, or a body that does neither, raises a one-line ``UsageError``.

    Example:
        >>> import torch
        >>> loss_fn = body_loss_fn("out = model(batch)\\nloss = out.pow(2).mean()", {}, "model", "batch")
        >>> float(loss_fn(lambda x: x, torch.ones(3)))
        1.0
        >>> float(body_loss_fn("net(x).sum()", {}, "net", "x")(lambda x: 2 * x, torch.ones(3)))
        6.0
        >>> body_loss_fn("# nothing here", {}) is None
        True
    """
    source = (body or "").strip("\n")
    try:
        tree = ast.parse(source, filename="<memfit>", mode="exec")
    except SyntaxError as error:
        raise _syntax_error(error) from None
    if not tree.body:
        return None
    try:  # some errors ('return' outside a function, for one) show only when compiling
        compile(tree, "<memfit>", "exec")
    except SyntaxError as error:
        raise _syntax_error(error) from None
    assigns_loss = any(
        isinstance(node, ast.Name) and node.id == "loss" and isinstance(node.ctx, ast.Store) for node in ast.walk(tree)
    )
    if assigns_loss:
        result = "loss"
    elif isinstance(tree.body[-1], ast.Expr):
        last = tree.body[-1]
        assign = ast.Assign(targets=[ast.Name(id=_RESULT, ctx=ast.Store())], value=last.value)
        tree.body[-1] = ast.copy_location(assign, last)
        ast.fix_missing_locations(tree)
        result = _RESULT
    else:
        raise usage_error(
            "the cell body must set loss = ... (or be an expression), for example loss = model(**batch).loss; "
            "leave the body empty for model(**batch).loss"
        )
    try:
        code = compile(tree, "<memfit>", "exec")
    except SyntaxError as error:
        raise _syntax_error(error) from None
    model_key = model_name if "." not in model_name else "model"
    batch_key = batch_name if "." not in batch_name else "batch"

    def loss_fn(model: nn.Module, batch: Batch) -> Any:
        scope = dict(namespace)
        scope.pop("loss", None)
        scope.pop(_RESULT, None)
        scope[model_key] = model
        scope[batch_key] = batch
        exec(code, scope)  # the user's own cell body, run as their loss function
        if result not in scope:
            raise MemlabError("the cell body did not set loss; write loss = ... on every path through it")
        return scope[result]

    loss_fn.__name__ = loss_fn.__qualname__ = "memfit_cell_loss"
    return loss_fn


def _syntax_error(error: SyntaxError) -> UsageError:
    where = f" on line {error.lineno}" if error.lineno else ""
    return usage_error(
        f"the cell body has a syntax error{where}: {error.msg}; "
        "write Python that sets loss = ..., or leave the body empty for model(**batch).loss"
    )



def empty_body_transformer(lines: list[str]) -> list[str]:
    """Let a ``%%memfit`` cell have no body: IPython refuses an empty cell magic body, so give it a blank line.

    An input transformer (IPython's ``input_transformers_cleanup``) that ``%load_ext memlab`` installs; a cell
    that is only ``%%memfit model batch --budget 8GiB`` then means ``model(**batch).loss``, like ``%memfit``.

    Example:
        >>> empty_body_transformer(["%%memfit model batch --budget 8GiB\\n"])
        ['%%memfit model batch --budget 8GiB\\n', '\\n']
        >>> empty_body_transformer(["%%memfit model batch\\n", "loss = model(**batch).loss\\n"])[1]
        'loss = model(**batch).loss\\n'
    """
    if lines and _CELL_MAGIC_LINE.match(lines[0]) and not "".join(lines[1:]).strip():
        first = lines[0] if lines[0].endswith("\n") else lines[0] + "\n"
        return [first, "\n"]
    return lines
