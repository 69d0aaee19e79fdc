"""The ``%%memfit`` magic: measure, compare and fit memory plans on the model already in the kernel.

Load it with ``%load_ext memlab``. The Jupyter layer is the only one that imports IPython for the magic; ``import
memlab`` never imports it (``memlab.load_ipython_extension`` imports it when IPython asks).

What the magic does, in order (each step has its module):

1. It reads its options (declared in :mod:`~memlab.frontends.jupyter.magic_args`; ``%%memfit?`` shows them) and
   chooses the mode once: a :class:`~memlab.frontends.jupyter.magic_training.TrainingRequest`, or with
   ``--inference`` an :class:`~memlab.frontends.jupyter.magic_inference.InferenceRequest`. Each checks the options
   that go together.
2. It looks MODEL and BATCH up in the user namespace: plain names, or attribute chains such as ``trainer.model``
   (:func:`~memlab.frontends.jupyter.magic_cell.lookup_name`; nothing is ``eval``-ed), and compiles the cell body
   once into the loss function (:func:`~memlab.frontends.jupyter.magic_cell.body_loss_fn`).
3. It checks everything it can before the model is touched. Any wrong input raises IPython's ``UsageError``
   with one line that says what is wrong and what to write; then nothing has run and the model is as it was.
4. It runs what the mode's request prepared: in training ``memlab.compare`` over the ``--try`` grid, ``memlab.fit``
   (a search), ``memlab.estimate`` (``--dry-run``) or a sharded estimate (``--dry-run --gpus N|auto``); with
   ``--inference`` the same over :class:`memlab.InferencePlan` settings, or the largest batch that fits. Unless
   ``--quiet``, the live figure (``memlab.frontends.jupyter.live.LiveOutput``) is displayed at the first trial and
   updated while trials run; when the run ends (normally, on Ctrl-C, or with an error) that output is replaced by a
   static record of the figure (an SVG, see ``memlab.report.static``) and the widget is closed, so the saved
   notebook shows the figure without a kernel. Third-party warnings and log lines are kept out unless
   ``--verbose``, and each is said once after the cell's output, as one line without the machine's paths
   (:func:`memlab.runner.quiet.collecting`). Errors
   raised by the loss while a trial runs are that trial's ``"error"`` status, not a UsageError.
5. With ``--apply`` it puts the best plan on the live model with ``memlab.apply`` and stores what it returns
   as ``memfit_applied`` in the user namespace (``memfit_applied.undo()`` takes it off again).
6. The Report is the cell's value: IPython shows its table, and ``r = _`` keeps it.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from typing import Any

from IPython.core.magic import Magics, line_cell_magic, magics_class
from IPython.display import display
from torch import nn

from memlab.errors import MemlabError
from memlab.frontends.jupyter.live import LiveOutput
from memlab.frontends.jupyter.magic_args import memfit_arguments, parse_line
from memlab.frontends.jupyter.magic_cell import body_loss_fn, empty_body_transformer, lookup_name, usage_error
from memlab.frontends.jupyter.magic_inference import InferenceRequest
from memlab.frontends.jupyter.magic_training import APPLIED_NAME, TrainingRequest
from memlab.report import Report
from memlab.runner.quiet import collecting
from memlab.trainer.source import is_trainer, trainer_model

__all__ = [
    "APPLIED_NAME",
    "MemfitMagics",
    "body_loss_fn",
    "clear_chain",
    "empty_body_transformer",
    "load_ipython_extension",
    "lookup_name",
    "stopped",
    "unload_ipython_extension",
]


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

    @memfit_arguments
    @line_cell_magic
    def memfit(self, line: str, cell: str | None = None) -> Report:
        """Measure peak memory and speed of training plans on the live model; find the fastest that fits.

        The cell body is the loss over MODEL and BATCH, run for every micro-batch (BATCH is bound to the
        micro-batch); it sets loss = ... or is an expression. An empty body, and the line form %memfit,
        mean model(**batch).loss. The model is left exactly as it was, unless --apply is given.

        --try measures exactly its grid (repeated --try options make one grid; no --try: the plain plan); with
        --budget, each plan is marked against it. A micro_batch in --try without accumulation gets accumulation =
        BATCH's rows // micro_batch, so every plan trains the same rows per optimizer step. --budget (or --batch-size)
        without --try searches for the fastest plan that fits the budget at that effective batch size; --search with
        --try searches within the --try values (accumulation then follows from --batch-size / micro_batch, and on a
        CPU a --budget is needed). The result is a memlab.Report: the cell shows its table, and r = _ keeps it
        (r.best, r.plot(), r.to_dataframe()).

        In Jupyter the live figure is drawn while the plans run (not with --quiet, nor in a terminal IPython);
        when the run ends, even by Ctrl-C or an error, it is replaced by a static copy (SVG) that the saved
        notebook keeps and that shows without a kernel (after a reload, in nbconvert's HTML, on GitHub).
        Timing goes on past --steps until the speed is known within --noise, or for --time-limit seconds.
        Warnings of other libraries are held back while plans run and said once at the end, each as one short
        line without file paths; --verbose lets them through as they come.
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
        request = self._parse(line)
        # What libraries say while the cell runs is shown once, short and without the machine's paths, after it.
        with collecting(request.args.verbose) as remarks:
            try:
                report, interrupted = self._measure(request, cell)
            finally:
                remarks.show()
        if interrupted:  # raised here, where no frame below holds the run's tensors: "Run All" stops at this cell
            raise stopped(report)
        return report

    def _measure(self, request: TrainingRequest | InferenceRequest, cell: str | None) -> tuple[Report, bool]:
        """The cell's work, shown: its report, and whether Ctrl-C stopped it."""
        namespace = self._namespace()
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
        job = request.prepare(namespace, model, cell, trainer=trainer)
        # Everything was checked before anything runs; the live figure is shown at the first trial, so that a refused
        # invocation displays nothing.
        options = job.options
        output: LiveOutput | None = None
        if not args.quiet and _shows_widgets(self.shell):
            output = LiveOutput(options.budget, categories=job.categories)
            options = options.replace(callback=output)
        report, interrupted = _run_shown(lambda: job.work(options), output)
        if not interrupted and job.after is not None:
            job.after(report)
        return report, interrupted

    def _parse(self, line: str) -> TrainingRequest | InferenceRequest:
        """The line, read and checked: the one place where the mode (training or ``--inference``) is chosen."""
        args = parse_line(self.memfit, line)
        return InferenceRequest.from_args(args) if args.inference else TrainingRequest.from_args(args)

    def _namespace(self) -> dict[str, Any]:
        if self.shell is None:
            raise usage_error("%%memfit runs only inside IPython; load it there with %load_ext memlab")
        namespace: dict[str, Any] = self.shell.user_ns
        return namespace


def _run_shown(run: Callable[[], Report], output: LiveOutput | None) -> tuple[Report, bool]:
    """Run a cell's work and leave what its live figure drew as a static record, however it ends: the report, and
    whether Ctrl-C stopped it. The interrupt is returned, its frames cleared, not raised from here: IPython keeps
    the traceback it sees, and this one holds the cell body's tensors (the caller raises :func:`stopped`). A
    MemlabError becomes the one-line UsageError."""
    try:
        report = run()
    except KeyboardInterrupt as interrupt:
        report = getattr(interrupt, "report", None) or (output.report if output is not None else Report([]))
        clear_chain(interrupt)
    except BaseException as error:
        if output is not None:  # what the figure had drawn stays, as a static record
            output.finish(output.report)
        if isinstance(error, MemlabError):
            raise usage_error(str(error)) from None
        raise
    else:
        if output is not None:
            output.finish(report, show=True)
        return report, False
    print(f"Interrupted: {len(report)} plan(s) were measured; the model is as it was.")
    if output is not None:
        output.finish(report)
    if len(report):
        display(report)
    return report, True


def clear_chain(error: BaseException) -> None:
    """Clear the frames of ``error``'s traceback and of those it was raised from or during: what they held is freed.

    Example:
        >>> try:
        ...     raise KeyboardInterrupt
        ... except KeyboardInterrupt as interrupt:
        ...     clear_chain(interrupt)
    """
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        traceback.clear_frames(current.__traceback__)
        current.__traceback__ = None
        current = current.__cause__ or current.__context__


def stopped(report: Report) -> KeyboardInterrupt:
    """A fresh KeyboardInterrupt for a cell that Ctrl-C stopped: no traceback (so no frame of the run), the
    finished trials as ``.report`` (``sys.last_value.report`` in the notebook), shown by IPython as one line.

    Example:
        >>> stopped(Report([]))._render_traceback_()
        ['KeyboardInterrupt: %%memfit stopped after 0 plan(s); the model is as it was']
    """
    interrupt = KeyboardInterrupt()
    interrupt.report = report  # type: ignore[attr-defined]
    line = f"KeyboardInterrupt: %%memfit stopped after {len(report)} plan(s); the model is as it was"
    interrupt._render_traceback_ = lambda: [line]  # type: ignore[attr-defined]  # IPython's one-line hook
    return interrupt.with_traceback(None)


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
