"""The ``memlab`` command: ``memlab demo`` (a fit on a built-in small model) and ``memlab estimate``.

``memlab --help`` lists the commands and ``memlab COMMAND --help`` their options. A wrong argument prints one
line on stderr that says what to write, and the exit status is 2; no path ends in a traceback: where memlab itself
fails, one line says what failed and the exit status is 3 (:func:`run_handler`).

Example (in a terminal)::

    $ memlab demo                      # budget: 60% of what the plain plan needs
    $ memlab demo --budget 20MiB --batch-size 8 --html report.html
    $ memlab demo --noise 0.1 --time-limit 5 --verbose

Measuring commands are quiet by default: third-party warnings (transformers, bitsandbytes) show with ``--verbose``.
"""

from __future__ import annotations

import argparse
import atexit
import html
import logging
import os
import re
import shutil
import sys
import textwrap
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn, TextIO

from typing_extensions import Unpack

from memlab.frontends.cli.errors import (
    EXIT_FAILED,
    SentenceParser,
    fraction,
    seconds,
    unknown_arguments,
    whole_number,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from memlab.options import RunOptions, TrialKeywords

__all__ = [
    "DEMO_BUDGET_FRACTION",
    "EXIT_FAILED",
    "EXIT_STATUS",
    "build_parser",
    "demo_space",
    "main",
    "plan_code",
    "run_demo",
    "run_handler",
    "write_html_report",
]

DEMO_BUDGET_FRACTION = 0.6
"""Without ``--budget``, ``memlab demo`` allows this fraction of the plain plan's peak, which forces a choice."""

_DEMO_DEFAULTS: dict[str, Any] = {"steps": 2, "warmup": 1, "progress": True}


EXIT_STATUS = (
    f"Exit status: 0 done; 2 on wrong input (one line says what to write); {EXIT_FAILED} when memlab itself failed "
    "(one line says what failed; MEMLAB_TRACEBACK=1 shows the traceback); 130 when interrupted."
)


def build_parser() -> argparse.ArgumentParser:
    """The ``memlab`` argument parser with its sub-commands (``demo``, ``estimate``).

    Example:
        >>> args = build_parser().parse_args(["demo", "--budget", "20MiB", "--steps", "1"])
        >>> args.command, args.budget, args.steps, args.html
        ('demo', '20MiB', 1, 'memlab-report.html')
        >>> args.verbose, args.noise, args.time_limit
        (False, 0.05, 10.0)
    """
    from memlab import __version__

    parser = SentenceParser(
        prog="memlab",
        description="Fit training into GPU memory: measure, compare and choose memory plans for a model.",
        epilog="In Jupyter: %load_ext memlab, then %%memfit model batch --budget 8GiB (see %%memfit?). "
        + EXIT_STATUS.replace("0 done;", "0 done; 1 when nothing fits the budget (memlab estimate), or the demo's "
                              "plain plan failed (memlab demo);"),
    )
    parser.add_argument("--version", action="version", version=f"memlab {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=SentenceParser)
    demo = commands.add_parser(
        "demo",
        help="find the fastest plan that fits a budget, on a built-in small model (runs on a CPU)",
        description=(
            "Build a small Llama from its config (nothing is downloaded), measure what its plain training step "
            "needs, and find the fastest plan that fits the budget at the batch size; print the table and "
            "write an HTML report with the figure."
        ),
        epilog=EXIT_STATUS.replace("0 done;", "0 done; 1 when the plain plan failed, so no budget could be set;"),
    )
    demo.add_argument(
        "--budget",
        metavar="SIZE",
        help=(
            f"memory budget such as 20MiB or 8GiB "
            f"(default: {DEMO_BUDGET_FRACTION * 100:.0f}%% of the plain plan's peak)"
        ),
    )
    demo.add_argument(
        "--batch-size",
        dest="batch_size",
        metavar="N",
        type=whole_number("--batch-size", "rows", 8),
        default=None,
        help="effective batch size (rows per optimizer step) to keep (default: 8, the rows of the demo batch)",
    )
    demo.add_argument(
        "--steps",
        metavar="N",
        type=whole_number("--steps", "steps", 3),
        default=_DEMO_DEFAULTS["steps"],
        help=f"the fewest timed optimizer steps per plan (default {_DEMO_DEFAULTS['steps']})",
    )
    demo.add_argument(
        "--html",
        metavar="PATH",
        default="memlab-report.html",
        help="where to write the HTML report (default: memlab-report.html)",
    )
    add_measuring_arguments(demo)
    demo.set_defaults(handler=_demo_command, command_parser=demo)
    _add_estimate_command(commands)
    return parser


def add_measuring_arguments(parser: argparse.ArgumentParser) -> None:
    """The options every measuring command shares: ``--noise``, ``--time-limit`` and ``--verbose``.

    Their defaults are :class:`~memlab.options.RunOptions`' own, so the command line and Python agree.

    Example:
        >>> parser = argparse.ArgumentParser()
        >>> add_measuring_arguments(parser)
        >>> args = parser.parse_args(["--noise", "0.1", "--time-limit", "5", "--verbose"])
        >>> args.noise, args.time_limit, args.verbose
        (0.1, 5.0, True)
    """
    from memlab.options import RunOptions

    defaults = RunOptions()
    parser.add_argument(
        "--noise",
        metavar="FRACTION",
        type=fraction("--noise", "0.05"),
        default=defaults.noise,
        help=(
            "time each plan until the 95%% interval of its median step time is within this fraction of it "
            f"(default {defaults.noise:g}, that is +-{defaults.noise * 100:g}%%; 0 times exactly --steps steps)"
        ),
    )
    parser.add_argument(
        "--time-limit",
        dest="time_limit",
        metavar="SECONDS",
        type=seconds("--time-limit", "10"),
        default=defaults.time_limit,
        help=f"at most this many seconds of timed steps per plan (default {defaults.time_limit:g})",
    )
    parser.add_argument(
        "--verbose",
        action="store_true",
        default=defaults.verbose,
        help="show third-party warnings (transformers, bitsandbytes) while plans run; quiet by default",
    )


def join_dashed_values(argv: list[str]) -> list[str]:
    """``--batch -1x512`` -> ``--batch=-1x512``: a value that starts with a dash goes to its option, so that the
    value's own check says what is wrong with it (argparse would take it for an option: "expected one argument").

    Example:
        >>> join_dashed_values(["estimate", "llama-7b", "--batch", "-1x512", "--json"])
        ['estimate', 'llama-7b', '--batch=-1x512', '--json']
    """
    joined: list[str] = []
    for token in argv:
        if joined and re.match(r"^-[0-9.]", token) and re.match(r"^--[a-z][a-z-]*$", joined[-1]):
            joined[-1] = f"{joined[-1]}={token}"
        else:
            joined.append(token)
    return joined


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``memlab`` command line; returns the exit status (0 when all went well).

    Example:
        >>> main(["--version"])
        memlab 0.1.0
        0
    """
    try:
        return _main(argv)
    finally:
        skip_dynamos_exit_report()


def console_main() -> NoReturn:
    """The ``memlab`` command and ``python -m memlab``: :func:`main` on the process's arguments, then its exit.

    The exit skips Python's teardown: what a dry run leaves (the modules of torch, transformers and peft, the model's
    fake tensors) took 1.2 s of an 8 s answer on a 2-core laptop to collect, for objects the exit frees anyway. The
    output is flushed and the atexit hooks run (temporary folders removed, logging flushed) first. Python calling
    :func:`main` (the tests, a notebook) exits as usual.

    Example:
        >>> import sys; sys.argv = ["memlab", "--version"]
        >>> console_main()  # doctest: +SKIP
        memlab 0.1.0
    """
    if sys.argv[1:2] == ["estimate"]:  # dry runs only: what they never run is not imported (issue 70)
        from memlab.frontends.cli.unused_imports import SkipUnusedImports

        sys.meta_path.insert(0, SkipUnusedImports())
    exit_without_teardown(main())


def exit_without_teardown(status: int) -> NoReturn:
    """End the process with ``status`` without Python's teardown, which would collect every object the dry runs
    left, module by module: 1.2 s of an 8 s answer on a 2-core laptop, for memory the exit frees anyway. The exit's
    own work runs first: the output is flushed and the atexit hooks run (temporary folders removed, logging flushed).
    (``gc.freeze`` before a normal exit saved the same time, but kept Triton's nanobind objects alive through the
    teardown, and nanobind printed a hundred lines of "leaked" objects at every exit where Triton was imported: every
    GPU machine.)"""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream: nothing more can be said on it
            pass
    getattr(atexit, "_run_exitfuncs", lambda: None)()
    os._exit(status)


def skip_dynamos_exit_report() -> None:
    """Take torch._dynamo's exit hook off when its logger would drop what the hook writes.

    The hook formats dynamo's compile times for ``log.info`` at every exit of a process that imported dynamo
    (bitsandbytes' import does, through peft, in every adapter estimate), importing tabulate and wcwidth to do it:
    0.3 s of each command's 8 on a 2-core laptop, for a line no logger shows. With dynamo's INFO logging on
    (``TORCH_LOGS=dynamo``) the hook stays.

    Example:
        >>> skip_dynamos_exit_report()  # nothing to do where dynamo was never imported, or its logs are on
    """
    utils = sys.modules.get("torch._dynamo.utils")
    hook = getattr(utils, "dump_compile_times", None)
    if utils is not None and hook is not None and not utils.log.isEnabledFor(logging.INFO):
        atexit.unregister(hook)


def _main(argv: Sequence[str] | None) -> int:
    words = join_dashed_values(list(argv) if argv is not None else sys.argv[1:])
    asked = words[1:] if words[:1] == ["estimate"] else None
    if asked is not None:  # a question asked before: its kept answer, read before torch is imported
        from memlab.frontends.cli.estimate.kept import asked_again

        status = asked_again(asked, sys.stdout, sys.stderr)
        if status is not None:
            return status
    parser = build_parser()
    try:
        args, extra = parser.parse_known_args(words)
        if extra:  # said by the command they were written to, with its options
            command: argparse.ArgumentParser = getattr(args, "command_parser", parser)
            command.exit(2, f"{command.prog}: error: {unknown_arguments(command, extra)}\n")
    except SystemExit as stop:  # --help, --version and argument errors
        return stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 2)
    handler: Callable[[argparse.Namespace], int] | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help(sys.stderr)
        print("memlab: error: choose a command, such as: memlab demo", file=sys.stderr)
        return 2
    if asked is None:
        return run_handler(handler, args)
    from memlab.frontends.cli.estimate.kept import asking
    from memlab.runner.collection import without_full_collections

    with asking(asked), without_full_collections():  # the words its answer is kept under; dry runs only
        return run_handler(handler, args)


def run_handler(handler: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    """Run a command's ``handler``; no path ends in a traceback. A :class:`~memlab.errors.MemlabError` is one line
    and status 2; any other exception one line that says what failed and what to do, and status
    :data:`EXIT_FAILED` (with ``MEMLAB_TRACEBACK=1`` in the environment it is raised, traceback and all).

    Example:
        >>> def broken(args):
        ...     raise RuntimeError("_apply(): Couldn't swap Embedding.weight")
        >>> run_handler(broken, argparse.Namespace(command="estimate"))  # doctest: +SKIP
        memlab estimate: failed: RuntimeError: _apply(): Couldn't swap Embedding.weight. This is memlab's fault...
        3
    """
    from memlab.errors import MemlabError

    prog = f"memlab {getattr(args, 'command', None) or ''}".strip()
    try:
        return handler(args)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except MemlabError as error:
        print(f"{prog}: error: {error}", file=sys.stderr)
        return 2
    except Exception as error:  # noqa: BLE001 - the command line says what failed in one line, never a traceback
        if os.environ.get("MEMLAB_TRACEBACK"):
            raise
        what = " ".join(str(error).split()) or "(no message)"
        print(f"{prog}: failed: {type(error).__name__}: {what}. This is memlab's fault, not your input: run it "
              "again with MEMLAB_TRACEBACK=1 to see where, and report it with the command; other settings may avoid "
              "it.", file=sys.stderr)
        return EXIT_FAILED


# --- memlab demo --------------------------------------------------------------------------------------------------


def _demo_command(args: argparse.Namespace) -> int:
    from memlab.errors import MemlabError
    from memlab.plan import parse_budget

    try:
        budget = parse_budget(args.budget)
    except MemlabError as error:
        print(f"memlab demo: error: {error}", file=sys.stderr)
        return 2
    return run_demo(
        batch_size=args.batch_size,
        html_path=args.html,
        budget=budget,
        steps=args.steps,
        noise=args.noise,
        time_limit=args.time_limit,
        verbose=args.verbose,
    )


def demo_space(batch_size: int) -> dict[str, list[Any]]:
    """What ``memlab demo`` searches on a CPU: the batch split (micro-batches down to a quarter of the batch)
    and checkpointing, in fp32 with AdamW: 8-bit AdamW is for GPUs, and bf16 is slow on a CPU that emulates it
    (:func:`memlab.frontends.demo.cpu_search_note` says which this one does), so leaving them out keeps the demo under
    a minute; on CUDA it searches ``fit``'s whole default space.

    Example:
        >>> demo_space(8)["micro_batch"], demo_space(6)["micro_batch"]
        ([8, 4, 2], [6, 3, 2])
    """
    sizes = [size for size in range(batch_size, 0, -1) if batch_size % size == 0 and 4 * size >= batch_size]
    return {"micro_batch": sizes, "checkpointing": [False, True], "precision": ["fp32"], "optimizer": ["adamw"]}


def plan_code(plan: Any) -> str:
    """The shortest ``memlab.Plan(...)`` expression for ``plan``: only the fields that differ from the defaults.

    Example:
        >>> from memlab.plan import Plan
        >>> plan_code(Plan(micro_batch=4, accumulation=2, checkpointing=True))
        'memlab.Plan(micro_batch=4, accumulation=2, checkpointing=True)'
        >>> plan_code(Plan())
        'memlab.Plan()'
    """
    from memlab.plan import PLAN_FIELDS, Plan

    default = Plan()
    changed = [
        f"{name}={getattr(plan, name)!r}" for name in PLAN_FIELDS if getattr(plan, name) != getattr(default, name)
    ]
    return f"memlab.Plan({', '.join(changed)})"


def run_demo(
    *,
    batch_size: int | None = None,
    html_path: str | os.PathLike[str] | None = "memlab-report.html",
    out: TextIO | None = None,
    **options: Unpack[TrialKeywords],
) -> int:
    """``memlab demo``: fit the built-in small Llama into a budget, print the table and the winner, write HTML.

    ``options`` are the run options (:class:`~memlab.options.TrialKeywords`; the demo's defaults are ``steps=2``,
    ``warmup=1``, ``progress=True``). Without a ``budget``, the plain plan is measured first and the budget is
    :data:`DEMO_BUDGET_FRACTION` of its peak, so the plain plan does not fit and memlab has to choose. Returns the
    exit status (0).

    Example:
        >>> import io
        >>> out = io.StringIO()
        >>> run_demo(steps=1, html_path=None, out=out)  # doctest: +SKIP
        0
        >>> "Best:" in out.getvalue() and "Winner:" not in out.getvalue()  # doctest: +SKIP
        True
    """
    import torch

    from memlab.options import RunOptions

    run_options = RunOptions.from_keywords({**_DEMO_DEFAULTS, **options})
    budget = run_options.budget
    stream = out if out is not None else sys.stdout

    def say(text: str = "") -> None:
        print(text, file=stream, flush=True)

    started = time.perf_counter()
    threads = torch.get_num_threads()
    if not torch.cuda.is_available():
        # The demo's model is tiny (0.9M parameters): one thread runs it as fast as several, and where another
        # process keeps a core busy, torch's threads wait on each other. On a 2-core machine with a process spinning
        # beside it the demo took 529 s with torch's 2 threads and 27 s with one (2026-11-24).
        torch.set_num_threads(1)
    try:
        return _run_demo(say, run_options, budget, batch_size, html_path, started,
                         terminal_width(stream) or DEMO_WIDTH)
    finally:
        torch.set_num_threads(threads)


def _run_demo(say: Callable[..., None], run_options: RunOptions, budget: int | None, batch_size: int | None,
              html_path: str | os.PathLike[str] | None, started: float, width: int | None) -> int:
    import torch

    from memlab.frontends.demo import cpu_search_note, default_batch, default_model
    from memlab.plan import Plan, format_bytes
    from memlab.report.views.tables import text_table
    from memlab.runner.trial import measure
    from memlab.search import fit

    model = default_model()
    batch = default_batch()
    rows = int(batch["input_ids"].shape[0])
    batch_size = batch_size or rows
    parameters = sum(p.numel() for p in model.parameters())
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        model.to(device)
        batch = {key: value.to(device) for key, value in batch.items()}
    say(
        f"memlab demo: a small Llama ({parameters / 1e6:.2f}M parameters, 4 layers) built from its config,\n"
        f"a batch of {rows} x {batch['input_ids'].shape[1]} random tokens, on {device}"
        + (" (one torch thread)." if device == "cpu" else ".")
    )
    if budget is None:
        # Only the plain plan's peak matters here, so it is timed for one step whatever the noise.
        say("Measuring the plain plan's peak, to set the budget...")
        plain = measure(model, batch, Plan(), **run_options.keywords(steps=1, noise=0.0))
        if plain.status != "ok":
            say(f"The plain plan failed ({plain.error}); pass --budget SIZE to choose a budget yourself.")
            return 1
        budget = int(plain.peak_bytes * DEMO_BUDGET_FRACTION)
        say(
            f"The plain plan peaks at {format_bytes(plain.peak_bytes)}; the budget is "
            f"{DEMO_BUDGET_FRACTION:.0%} of that: {format_bytes(budget)} (--budget SIZE sets another)."
        )
    say(f"Looking for the fastest plan that fits {format_bytes(budget)} at {batch_size} rows per optimizer step...")
    space = None
    if device == "cpu":
        space = demo_space(batch_size)
        say(textwrap.fill(cpu_search_note(), width or DEMO_WIDTH, break_long_words=False, break_on_hyphens=False))
    report = fit(model, batch, batch_size=batch_size, space=space, **run_options.keywords(budget=budget))
    say()
    say(text_table(report, width=width))
    say()

    def said(line: str) -> None:  # the demo's own sentences kept within the terminal too, code never cut
        say("\n".join(textwrap.wrap(line, width, subsequent_indent="  ", break_long_words=False,
                                     break_on_hyphens=False)) if width else line)

    best = report.best  # the table's "Best:" line names it (and its ties): said once
    if best is not None:
        said(f"Put {best.label} on a model in a notebook with memlab.apply(model, {plan_code(best.plan)}).")
    else:
        said(f"No plan fits {format_bytes(budget)}: try a bigger --budget.")
    if html_path is not None:
        write_html_report(report, html_path, title="memlab demo")
        # The path as the user wrote it (the default is relative): no folder of the machine in what is printed.
        say(f"HTML report with the figure: {os.fspath(html_path)}")
    say(f"Done in {time.perf_counter() - started:.1f} s.")
    return 0


DEMO_WIDTH = 120
"""The columns the demo keeps within where its output is no terminal (a log, a pipe) and ``COLUMNS`` is unset."""


def terminal_width(stream: TextIO) -> int | None:
    """The columns the demo's table must keep within: ``COLUMNS`` where it is set, the terminal's where the output
    is one, else None (a log has no width: the table keeps every column on one line).

    Example:
        >>> import os, sys
        >>> os.environ["COLUMNS"] = "120"
        >>> terminal_width(sys.stdout)
        120
        >>> del os.environ["COLUMNS"]
    """
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    return shutil.get_terminal_size().columns if hasattr(stream, "isatty") and stream.isatty() else None


HTML_TEXT_WIDTH = 120
"""The columns of the HTML report's text (the table as a 120-column terminal prints it, notes under it)."""


def write_html_report(report: Any, path: str | os.PathLike[str], *, title: str = "memlab report") -> str:
    """Write a self-contained HTML page (works offline) with the Report's figure and table.

    The figure is the static SVG a notebook keeps (:func:`memlab.report.views.static.report_svg`: the same verdict
    marks,
    legend and key, a tooltip on every bar), inlined: a page of a few tens of kB, where plotly's figure with plotly.js
    inlined weighed 4.8 MB. Returns the absolute path written.

    Example:
        >>> import tempfile, pathlib
        >>> from memlab.report import Report, Trial
        >>> from memlab.plan import Plan
        >>> report = Report([Trial(Plan(), "ok", 2**20, {"params": 2**20}, 0.5, 8.0, None, "cpu")])
        >>> target = pathlib.Path(tempfile.mkdtemp()) / "r.html"
        >>> written = write_html_report(report, target)
        >>> page = target.read_text()
        >>> "<svg" in page and "<table" in page and len(page) < 100_000
        True
    """
    from memlab.report.views.static import report_svg
    from memlab.report.views.tables import text_table

    figure = f"<div class='memlab-figure'>{report_svg(report)}</div>"
    page = "\n".join(
        [
            "<!DOCTYPE html>",
            "<html><head><meta charset='utf-8'>",
            f"<title>{html.escape(title)}</title>",
            # The text as a terminal prints it within 120 columns: its lines never broken (a table row wrapped in
            # the middle of its cells reads as two rows); a narrower window scrolls the grey box, not the page.
            "<style>body{font-family:sans-serif;margin:1.5em;max-width:70em} pre{background:#f6f6f6;padding:8px;"
            "white-space:pre;overflow-x:auto;max-width:100%;box-sizing:border-box}</style>",
            "</head><body>",
            f"<h1>{html.escape(title)}</h1>",
            figure,
            "<h2>Every plan tried</h2>",
            report._repr_html_(),
            "<h2>As text</h2>",
            f"<pre>{html.escape(text_table(report, width=HTML_TEXT_WIDTH))}</pre>",
            "</body></html>",
        ]
    )
    target = os.path.abspath(os.fspath(path))
    directory = os.path.dirname(target)
    if directory:
        os.makedirs(directory, exist_ok=True)
    with open(target, "w", encoding="utf-8") as handle:
        handle.write(page)
    return target


# --- memlab estimate ------------------------------------------------------------------------------------------------


def _add_estimate_command(commands: Any) -> None:
    """The ``memlab estimate`` sub-command: its arguments and its handler come from
    :mod:`memlab.frontends.cli.estimate.command`.
    """
    from memlab.frontends.cli.allocator import add_allocator_argument, with_allocator
    from memlab.frontends.cli.estimate import command as estimate_cli
    from memlab.frontends.cli.host import add_host_argument

    parser = commands.add_parser(
        "estimate", help="predict, without the hardware, whether a model fits (a dry run on fake tensors)"
    )
    estimate_cli.add_arguments(parser)
    add_allocator_argument(parser)
    add_host_argument(parser)
    parser.set_defaults(handler=with_allocator(estimate_cli.run), command_parser=parser)
