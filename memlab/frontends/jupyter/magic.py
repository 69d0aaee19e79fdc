"""The ``%%memfit`` magic: measure, compare and fit memory plans on the model already in the kernel.

Load it with ``%load_ext memlab``. This module is the only one that imports IPython for the magic; ``import
memlab`` never imports it (``memlab.load_ipython_extension`` imports it when IPython asks).

What the magic does, in order:

1. It reads its options (declared with ``magic_arguments``; ``%%memfit?`` shows them) and looks MODEL and BATCH
   up in the user namespace: plain names, or attribute chains such as ``trainer.model``. Nothing is ``eval``-ed.
2. It compiles the cell body once into the loss function (see :func:`body_loss_fn`).
3. It checks everything it can before the model is touched. Any wrong input raises IPython's ``UsageError``
   with one line that says what is wrong and what to write; then nothing has run and the model is as it was.
4. It runs: ``memlab.compare`` over the ``--try`` grid (against ``--budget`` if given), or ``memlab.fit`` when
   ``--budget`` or ``--batch-size`` comes without ``--try`` (or with ``--search``), or ``memlab.estimate`` (every
   plan) with ``--dry-run``; ``--dry-run --gpus N|auto [--strategy S]`` estimates every plan sharded over GPUs
   (:func:`memlab.estimation.sharded.sharded_trials`, what ``memlab estimate --gpus`` runs too), prints a line per plan
   and
   strategy (:func:`memlab.estimation.sharded.sharded_lines`) and returns a Report of one trial per plan and strategy.
   Unless
   ``--quiet``, the live figure (``memlab.frontends.jupyter.live.LiveOutput``) is displayed at the first trial and
   updated
   while trials run; when the run ends (normally, on Ctrl-C, or with an error) that output is replaced by a static
   record of the figure (an SVG, see ``memlab.report.static``) and the widget is closed, so the saved notebook shows
   the figure without a kernel. Third-party warnings are kept quiet unless ``--verbose``. Errors raised by the loss
   while a trial runs are that trial's ``"error"`` status, not a UsageError.
   With ``--inference`` the plans are :class:`memlab.InferencePlan` settings (``--try weights=fp32,bf16
   quantize=none,nf4 batch_size=1,8 new_tokens=0,32 kv_cache=on,off``): ``memlab.compare`` measures them under
   ``torch.inference_mode()``; ``--budget`` with one setting (``--try`` values without a choice, and no
   ``batch_size``) finds the largest batch of it that fits (:func:`memlab.fit_inference`), ``--search --budget`` the
   fastest ``--try`` setting that fits, and ``--dry-run`` estimates them. The cell body stays empty (the forward,
   or the generation, is the model's own); the live figure stacks the inference categories (params, activations,
   kv_cache, other).
5. With ``--apply`` it puts the best plan on the live model with ``memlab.apply`` and stores what it returns
   as ``memfit_applied`` in the user namespace (``memfit_applied.undo()`` takes it off again).
6. The Report is the cell's value: IPython shows its table, and ``r = _`` keeps it.
"""

from __future__ import annotations

import ast
import keyword
import re
from collections.abc import Callable, Mapping
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring
from torch import nn

from memlab.errors import MemlabError
from memlab.estimation.estimate import estimate_plans
from memlab.estimation.sharded import parse_gpus, sharded_lines, sharded_trials
from memlab.frontends.jupyter.live import LiveOutput
from memlab.inference.fit import fit_inference
from memlab.inference.plan import INFERENCE_LEVERS, parse_inference_axes, parse_inference_grid
from memlab.options import RunOptions
from memlab.plan import LEVERS, parse_axes, parse_grid
from memlab.report import INFERENCE_CATEGORIES, Report
from memlab.runner.batch import Batch, LossFn, count_rows
from memlab.runner.trial import compare
from memlab.search import MAX_TRIALS, fit

__all__ = [
    "APPLIED_NAME",
    "MemfitMagics",
    "body_loss_fn",
    "empty_body_transformer",
    "load_ipython_extension",
    "lookup_name",
    "unload_ipython_extension",
]

APPLIED_NAME = "memfit_applied"
"""The user-namespace name under which ``--apply`` stores the :class:`memlab.Applied`."""

_USAGE = (
    "write %%memfit MODEL BATCH [--try KEY=V1,V2 ...] [--budget SIZE] [--batch-size N] [--steps N] "
    "[--warmup N] [--noise F] [--time-limit S] [--lr LR] [--search] [--apply] [--dry-run [--gpus N|auto] "
    "[--strategy fsdp2|zero2|zero3]] [--inference] [--quiet] [--verbose]; "
    "%%memfit? shows the help"
)
_DEFAULTS = RunOptions()
_LEVER_HELP = "; ".join(
    f"{name}={'|'.join(spec.choices) if spec.choices else 'on|off' if spec.type == 'bool' else 'N'} ({spec.help})"
    for name, spec in LEVERS.items()
)
_INFERENCE_LEVER_HELP = "; ".join(
    f"{name}={'|'.join(spec['choices']) if spec['choices'] else 'on|off' if name == 'kv_cache' else 'N'} "
    f"({spec['help']})"
    for name, spec in INFERENCE_LEVERS.items()
)
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_RESULT = "_memfit_loss_"


def _usage_error(message: str) -> UsageError:
    """A UsageError whose message is exactly one line."""
    return UsageError(" ".join(str(message).split()))


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
        raise _usage_error(
            f"{what} {name!r} is not a variable name; write the name of a notebook variable, such as "
            f"{'model' if what == 'MODEL' else 'batch'} or trainer.{'model' if what == 'MODEL' else 'batch'} "
            "(expressions are not evaluated)"
        )
    if parts[0] not in namespace:
        raise _usage_error(
            f"{what} {parts[0]!r} is not defined in the notebook; define it in a cell first, or check the spelling"
        )
    value = namespace[parts[0]]
    for depth, part in enumerate(parts[1:], start=1):
        try:
            value = getattr(value, part)
        except AttributeError:
            owner = ".".join(parts[:depth])
            raise _usage_error(
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
        raise _usage_error(
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
    return _usage_error(
        f"the cell body has a syntax error{where}: {error.msg}; "
        "write Python that sets loss = ..., or leave the body empty for model(**batch).loss"
    )


# --- options ----------------------------------------------------------------------------------------------------


def _unquote(text: str | None) -> str | None:
    if text is not None and len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    return text


def _sharding(args: Any) -> tuple[int | str, list[str] | None] | None:
    """``(gpus, strategies)`` of a sharded dry run (``--gpus``/``--strategy``), None without them; a one-line
    UsageError for a live run, a wrong value or an option that does not go with them."""
    if args.gpus is None and args.strategy is None:
        return None
    given = " ".join(f"--{name} {value}" for name, value in (("gpus", args.gpus), ("strategy", args.strategy)) if value)
    if not args.dry_run:
        raise _usage_error(
            f"{given} estimates training sharded over several GPUs, and memlab never shards a live run; add "
            "--dry-run, e.g. %%memfit model batch --dry-run --gpus 8 --strategy fsdp2 --budget 80GiB"
        )
    if args.gpus is None:
        raise _usage_error(
            f"--strategy {args.strategy} needs a number of GPUs; add --gpus N, e.g. --gpus 8, or --gpus auto "
            "with --budget"
        )
    try:
        gpus = parse_gpus(_unquote(args.gpus))
    except MemlabError:
        raise _usage_error(
            f"--gpus {args.gpus!r} is not a number of GPUs; write an int >= 1 such as --gpus 8, or --gpus auto "
            "with --budget"
        ) from None
    if gpus == "auto" and args.budget is None:
        raise _usage_error("--gpus auto finds the smallest number of GPUs that fits a budget; add --budget, "
                           "e.g. --gpus auto --budget 80GiB")
    strategies = None
    if args.strategy is not None:
        name = str(_unquote(args.strategy)).strip().lower()
        if name not in ("fsdp2", "zero2", "zero3"):
            raise _usage_error(
                f"--strategy {args.strategy!r} is unknown; write --strategy fsdp2, zero2 or zero3 (or leave it out "
                "for all three)"
            )
        strategies = [name]
    if args.search or args.batch_size is not None:
        raise _usage_error(
            f"{'--search' if args.search else '--batch-size'} does not go with {given}: a sharded dry run estimates "
            "exactly the --try plans; drop it"
        )
    return gpus, strategies


def _shows_widgets(shell: Any) -> bool:
    """Whether the front end can draw a widget: a Jupyter kernel can; a terminal IPython only prints its repr."""
    return getattr(shell, "kernel", None) is not None


# --- the magic --------------------------------------------------------------------------------------------------


@magics_class
class MemfitMagics(Magics):
    """The magics that ``%load_ext memlab`` registers: ``%%memfit`` (cell) and ``%memfit`` (line).

    Example (a test shell stands in for the notebook's; in a notebook, write the cell itself)::

        >>> import torch
        >>> from IPython.testing import globalipapp
        >>> shell = globalipapp.get_ipython()
        >>> load_ipython_extension(shell)
        >>> net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
        >>> shell.user_ns.update(net=net, xs=torch.randn(8, 4))
        >>> report = shell.run_cell_magic("memfit", "net xs --try checkpointing=off,on --steps 1 --quiet",
        ...                               "loss = net(xs).pow(2).mean()")
        >>> [(trial.label, trial.status) for trial in report]
        [('plain', 'ok'), ('ckpt', 'ok')]
    """

    @magic_arguments()
    @argument("model", metavar="MODEL", help="name of the torch nn.Module in the notebook, e.g. model")
    @argument("batch", metavar="BATCH", help="name of the batch in the notebook (dict of tensors, tensor, tuple)")
    @argument(
        "--try",
        dest="grid",
        nargs="+",
        action="extend",
        metavar="KEY=V1,V2",
        default=[],
        help=(
            "plans to compare: every combination of the values (repeated --try options make one grid), e.g. "
            "precision=fp32,bf16 checkpointing=off,on micro_batch=8,2. The levers: " + _LEVER_HELP
            + ". With --inference: " + _INFERENCE_LEVER_HELP
        ),
    )
    @argument(
        "--budget",
        metavar="SIZE",
        help="memory budget such as 8GiB, 500MB, 1.5G: search for the fastest plan that fits it",
    )
    @argument(
        "--batch-size",
        dest="batch_size",
        type=int,
        metavar="N",
        help="effective batch size (rows per optimizer step) to keep while searching; default: the rows of BATCH",
    )
    @argument(
        "--steps", type=int, metavar="N", default=_DEFAULTS.steps, help="the fewest timed optimizer steps per plan"
    )
    @argument("--warmup", type=int, metavar="N", default=_DEFAULTS.warmup, help="untimed warm-up steps per plan")
    @argument(
        "--noise",
        type=float,
        metavar="F",
        default=_DEFAULTS.noise,
        help=(
            "time more steps until the 95%% interval of the median step time is within +-F of it "
            f"(default {_DEFAULTS.noise:g}, i.e. {_DEFAULTS.noise * 100:g}%%; 0: exactly --steps steps)"
        ),
    )
    @argument(
        "--time-limit",
        dest="time_limit",
        type=float,
        metavar="S",
        default=_DEFAULTS.time_limit,
        help=f"stop timing a plan after S seconds of timed steps, noise or not (default {_DEFAULTS.time_limit:g})",
    )
    @argument("--lr", type=float, metavar="LR", default=_DEFAULTS.lr, help="learning rate of the optimizer")
    @argument(
        "--apply",
        action="store_true",
        help="put the best plan on the live model afterwards, as memfit_applied (memfit_applied.undo() undoes it)",
    )
    @argument(
        "--dry-run",
        dest="dry_run",
        action="store_true",
        help="estimate the plans on fake tensors instead of running them (nothing is trained)",
    )
    @argument(
        "--gpus",
        metavar="N|auto",
        help=(
            "with --dry-run: estimate training sharded over N GPUs (the peak per GPU, BATCH being what each GPU "
            "sees); auto, with --budget, finds the smallest N that fits, for each strategy"
        ),
    )
    @argument(
        "--strategy",
        metavar="fsdp2|zero2|zero3",
        help=(
            "with --dry-run --gpus: how training is sharded, FSDP2 (accelerate) or DeepSpeed ZeRO-2 / ZeRO-3 "
            "(default: all three); r = _ then r.best.plan.to_accelerate_config(gpus=N, strategy=...) exports it"
        ),
    )
    @argument(
        "--search",
        action="store_true",
        help="with --try: search for the fastest plan that fits --budget within the --try values",
    )
    @argument(
        "--max-trials",
        type=int,
        metavar="N",
        default=None,
        help=f"a search measures at most N plans, those expected fastest first (default {MAX_TRIALS})",
    )
    @argument(
        "--inference",
        action="store_true",
        help=(
            "measure inference instead of training: a forward (or, with new_tokens=N, a generation) under "
            "torch.inference_mode(), with the --try settings of memlab.InferencePlan; --budget alone finds the "
            "largest batch_size that fits; leave the cell body empty"
        ),
    )
    @argument("--quiet", action="store_true", help="no figure; only the table at the end")
    @argument(
        "--verbose",
        action="store_true",
        help="let third-party warnings (transformers, bitsandbytes...) through while plans run; quiet by default",
    )
    @line_cell_magic
    def memfit(self, line: str, cell: str | None = None) -> Report:
        """Measure peak memory and speed of training plans on the live model; find the fastest that fits.

        The cell body is the loss over MODEL and BATCH, run for every micro-batch (BATCH is bound to the
        micro-batch); it sets loss = ... or is an expression. An empty body, and the line form %memfit,
        mean model(**batch).loss. The model is left exactly as it was, unless --apply is given.

        --try measures exactly its grid (repeated --try options make one grid; no --try: the plain plan);
        with --budget, each plan is marked against it. --budget (or --batch-size) without --try searches for
        the fastest plan that fits the budget at that effective batch size; --search with --try searches
        within the --try values (accumulation then follows from --batch-size / micro_batch, and on a CPU a
        --budget is needed). The result is a memlab.Report: the cell shows its table, and r = _ keeps it
        (r.best, r.plot(), r.to_dataframe()).

        In Jupyter the live figure is drawn while the plans run (not with --quiet, nor in a terminal IPython);
        when the run ends, even by Ctrl-C or an error, it is replaced by a static copy (SVG) that the saved
        notebook keeps and that shows without a kernel (after a reload, in nbconvert's HTML, on GitHub).
        Timing goes on past --steps until the speed is known within --noise, or for --time-limit seconds.
        Warnings of other libraries are hidden while plans run, unless --verbose.
        MODEL and BATCH are looked up by name (trainer.model works too); nothing is evaluated. Wrong input
        stops with a one-line UsageError before the model is touched.

        --inference measures inference instead of training, on the same model and with the same figure: --try
        takes the settings of memlab.InferencePlan (weights=fp32,bf16,fp16 quantize=none,int8,nf4 batch_size=N
        new_tokens=N kv_cache=on,off), each run as a forward (or a generation of new_tokens) under
        torch.inference_mode(); --budget with one setting finds the largest batch that fits, --search --budget the
        fastest --try setting that fits, --dry-run estimates them. The cell body stays empty; --apply, --lr,
        --batch-size, --gpus and --strategy are for training.

        --dry-run --gpus N (or auto, with --budget) estimates training sharded over N GPUs with --strategy
        fsdp2, zero2 or zero3 (default: all three): a line per plan and strategy with the peak per GPU and where
        it goes, and a Report with one trial per plan and strategy. memlab never shards a live run, so --gpus
        and --strategy need --dry-run. MODEL may live on the meta device (shapes only, no memory).

        Examples::

          %load_ext memlab

          %%memfit model batch --try precision=fp32,bf16 checkpointing=off,on
          loss = model(**batch).loss

          %%memfit model batch --budget 8GiB --batch-size 32 --apply

          %memfit model batch --try micro_batch=8,2 --quiet

          %%memfit model batch --try precision=fp32,bf16 --noise 0.02 --time-limit 30 --verbose

          %%memfit model batch --dry-run --gpus 8 --strategy fsdp2 --budget 80GiB --try precision=bf16

          %memfit model batch --inference --try weights=fp32,bf16 quantize=none,nf4 new_tokens=32

          %memfit model batch --inference --budget 2GiB --try new_tokens=128
        """
        args = self._parse(line)
        namespace = self._namespace()
        model = lookup_name(namespace, args.model, "MODEL")
        if not isinstance(model, nn.Module):
            raise _usage_error(
                f"MODEL {args.model!r} is a {type(model).__name__}, not a torch nn.Module; "
                "write the name of your model, e.g. %%memfit model batch"
            )
        if args.inference:
            return self._inference(args, model, cell)
        if not any(parameter.requires_grad for parameter in model.parameters()):
            raise _usage_error(
                f"MODEL {args.model!r} has no trainable parameters; set requires_grad=True on what should train"
            )
        batch = lookup_name(namespace, args.batch, "BATCH")
        try:
            rows = count_rows(batch)
        except MemlabError as error:
            raise _usage_error(f"BATCH {args.batch!r}: {error}") from None
        loss_fn = body_loss_fn(cell, namespace, args.model, args.batch)
        if loss_fn is None and not isinstance(batch, Mapping):
            raise _usage_error(
                f"BATCH {args.batch!r} is a {type(batch).__name__}, so memlab cannot call model(**batch); "
                "write the loss in the cell body, e.g. loss = loss_fn(model(batch[0]), batch[1])"
            )

        search = args.search or (not args.grid and (args.budget is not None or args.batch_size is not None))
        if args.search and not args.grid:
            raise _usage_error("--search searches within the --try values; add --try KEY=V1,V2, or drop --search")
        if args.grid and args.batch_size is not None and not search:
            raise _usage_error(
                "--batch-size sets the effective batch of a search; add --search to search within the --try values"
            )
        if args.max_trials is not None and not search:
            raise _usage_error(
                "--max-trials limits a search; add --budget SIZE (or --search with --try), or drop --max-trials"
            )
        if args.apply and args.dry_run:
            raise _usage_error("--apply needs measured plans, and --dry-run only estimates them; drop one of the two")
        sharding = _sharding(args)
        try:
            options = RunOptions.from_keywords(
                {
                    "loss_fn": loss_fn, "steps": args.steps, "warmup": args.warmup, "budget": _unquote(args.budget),
                    "lr": args.lr, "noise": args.noise, "time_limit": args.time_limit, "verbose": args.verbose,
                    "progress": False,
                }
            )
            plans = parse_grid(args.grid)
        except MemlabError as error:
            raise _usage_error(str(error)) from None
        # The core checks the grid (and fit its space) before anything runs; the live figure is shown at the first
        # trial, so that a refused invocation displays nothing.
        output: LiveOutput | None = None
        if not args.quiet and _shows_widgets(self.shell):
            output = LiveOutput(options.budget)
            options = options.replace(callback=output)

        def run() -> Report:
            if sharding is not None:
                gpus, strategies = sharding
                found = sharded_trials(model, batch, plans, gpus=gpus, strategies=strategies, budget=options.budget,
                                       loss_fn=loss_fn, lr=options.lr)
                print(f"Per GPU, {args.batch} ({rows} row{'s' if rows != 1 else ''}) being each GPU's micro-batch:")
                for text in sharded_lines(found, options.budget):
                    print(text)
                return Report([trial for _, _, trial in found if trial is not None], budget=options.budget)
            if search:
                space = parse_axes(args.grid) or None
                size = rows if args.batch_size is None else args.batch_size
                limit = MAX_TRIALS if args.max_trials is None else args.max_trials
                return fit(model, batch, batch_size=size, space=space, dry_run=args.dry_run, max_trials=limit,
                           **options.keywords())
            if args.dry_run:
                return estimate_plans(model, batch, plans, loss_fn=loss_fn, budget=options.budget, lr=options.lr)
            return compare(model, batch, plans, **options.keywords())

        report, interrupted = _run_shown(run, output)
        if interrupted:
            return report
        if args.apply:
            self._apply(model, report, loss_fn, options.lr, args.model)
        return report

    def _inference(self, args: Any, model: nn.Module, cell: str | None) -> Report:
        """``--inference``: compare, search or estimate InferencePlans (see the module's docstring)."""
        batch = lookup_name(self._namespace(), args.batch, "BATCH")
        try:
            count_rows(batch)
        except MemlabError as error:
            raise _usage_error(f"BATCH {args.batch!r}: {error}") from None
        if (cell or "").strip():
            raise _usage_error(
                "the cell body is a training loss, and --inference runs the model's forward (or generation) itself; "
                "leave the body empty"
            )
        refused = [
            ("--apply", args.apply, "inference changes nothing to apply"),
            ("--batch-size", args.batch_size is not None, "write --try batch_size=N (or --budget alone for the "
             "largest batch that fits)"),
            ("--gpus", args.gpus is not None, "inference is measured on one device"),
            ("--strategy", args.strategy is not None, "inference is measured on one device"),
            ("--lr", args.lr != _DEFAULTS.lr, "inference runs no optimizer"),
            ("--max-trials", args.max_trials is not None, "an inference search measures every --try setting"),
            ("--search", args.search and args.dry_run, "a dry run estimates memory, not speed (--dry-run --budget "
             "marks each --try setting against the budget)"),
        ]
        for flag, given, why in refused:
            if given:
                raise _usage_error(f"{flag} does not go with --inference: {why}; drop {flag}")
        if args.search and (not args.grid or args.budget is None):
            raise _usage_error(
                "--search --inference finds the fastest --try setting within --budget; add --try KEY=V1,V2 and "
                "--budget SIZE, or drop --search"
            )
        try:
            options = RunOptions.from_keywords(
                {
                    "steps": args.steps, "warmup": args.warmup, "budget": _unquote(args.budget), "noise": args.noise,
                    "time_limit": args.time_limit, "verbose": args.verbose, "progress": False,
                }
            )
            plans = parse_inference_grid(args.grid)
            axes = parse_inference_axes(args.grid)
        except MemlabError as error:
            raise _usage_error(str(error)) from None
        output: LiveOutput | None = None
        if not args.quiet and _shows_widgets(self.shell):
            output = LiveOutput(options.budget, categories=INFERENCE_CATEGORIES)
            options = options.replace(callback=output)

        def run() -> Report:
            if args.dry_run:
                return estimate_plans(model, batch, plans, budget=options.budget)
            if args.search:
                return fit_inference(model, batch, goal="speed", space=axes, **options.keywords())
            if args.budget is not None and "batch_size" not in axes and all(len(v) == 1 for v in axes.values()):
                # --budget with one setting (or none): the largest batch of that setting that fits.
                return fit_inference(model, batch, plans[0], goal="batch", **options.keywords())
            return compare(model, batch, plans, **options.keywords())

        return _run_shown(run, output)[0]

    # --- helpers ---

    def _parse(self, line: str) -> Any:
        try:
            return parse_argstring(self.memfit, line)
        except UsageError as error:
            raise _usage_error(f"{str(error).rstrip('.')}; {_USAGE}") from None
        except ValueError as error:  # shlex: an unclosed quote
            raise _usage_error(f"the options cannot be read ({error}); {_USAGE}") from None

    def _namespace(self) -> dict[str, Any]:
        if self.shell is None:
            raise _usage_error("%%memfit runs only inside IPython; load it there with %load_ext memlab")
        namespace: dict[str, Any] = self.shell.user_ns
        return namespace

    def _apply(self, model: nn.Module, report: Report, loss_fn: LossFn | None, lr: float, model_name: str) -> None:
        from memlab.runner.apply import Applied, apply

        best = report.best
        if best is None:
            print(f"No plan fits, so nothing was applied; {model_name} is as it was.")
            return
        namespace = self._namespace()
        previous = namespace.get(APPLIED_NAME)
        if isinstance(previous, Applied) and previous.active and previous.model is model:
            previous.undo()
            print(f"Undid the previous {APPLIED_NAME} ({previous.plan.label()}) first.")
        applied = apply(model, best.plan, loss_fn=loss_fn, lr=lr)
        namespace[APPLIED_NAME] = applied
        print(
            f"Applied {best.label} to {model_name} as {APPLIED_NAME}: train with {APPLIED_NAME}.step(batch); "
            f"undo with {APPLIED_NAME}.undo()"
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


def _run_shown(run: Callable[[], Report], output: LiveOutput | None) -> tuple[Report, bool]:
    """Run a cell's work and leave what its live figure drew as a static record, however it ends: the report, and
    whether Ctrl-C stopped it. An interrupt is returned, not raised: IPython would keep the traceback, and with it
    the cell body's tensors. A MemlabError becomes the one-line UsageError."""
    try:
        report = run()
    except KeyboardInterrupt as interrupt:
        report = getattr(interrupt, "report", None) or (output.report if output is not None else Report([]))
        print(f"Interrupted: {len(report)} plan(s) were measured; the model is as it was.")
        if output is not None:
            output.finish(report)
        return report, True
    except BaseException as error:
        if output is not None:  # what the figure had drawn stays, as a static record
            output.finish(output.report)
        if isinstance(error, MemlabError):
            raise _usage_error(str(error)) from None
        raise
    if output is not None:
        output.finish(report, show=True)
    return report, False


_CELL_MAGIC_LINE = re.compile(r"^%%memfit(\s|$)")


def load_ipython_extension(ipython: Any) -> None:
    """Register ``%%memfit`` and ``%memfit`` in ``ipython`` (what ``%load_ext memlab`` calls).

    Example:
        >>> from IPython.testing import globalipapp
        >>> shell = globalipapp.get_ipython()  # a test shell; in a notebook: %load_ext memlab
        >>> load_ipython_extension(shell)
        >>> "memfit" in shell.magics_manager.magics["cell"]
        True
    """
    ipython.register_magics(MemfitMagics)
    cleanup = getattr(ipython, "input_transformers_cleanup", None)
    if cleanup is not None and empty_body_transformer not in cleanup:
        cleanup.append(empty_body_transformer)


def unload_ipython_extension(ipython: Any) -> None:
    """Remove ``%%memfit`` and ``%memfit`` again (what ``%unload_ext`` and ``%reload_ext memlab`` call).

    Example:
        >>> from IPython.testing import globalipapp
        >>> shell = globalipapp.get_ipython()  # a test shell; in a notebook: %unload_ext memlab
        >>> load_ipython_extension(shell); unload_ipython_extension(shell)
        >>> "memfit" in shell.magics_manager.magics["cell"], empty_body_transformer in shell.input_transformers_cleanup
        (False, False)
        >>> load_ipython_extension(shell)  # as it was
    """
    magics = ipython.magics_manager.magics
    for kind in ("line", "cell"):
        function = magics[kind].get("memfit")
        owner = getattr(function, "__self__", None)
        if isinstance(owner, MemfitMagics):
            del magics[kind]["memfit"]
    ipython.magics_manager.registry.pop(MemfitMagics.__name__, None)
    cleanup = getattr(ipython, "input_transformers_cleanup", None)
    while cleanup is not None and empty_body_transformer in cleanup:
        cleanup.remove(empty_body_transformer)
