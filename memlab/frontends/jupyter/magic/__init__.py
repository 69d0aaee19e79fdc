"""The ``%%memfit`` magic: measure, compare and fit memory plans on the model already in the kernel.

Load it with ``%load_ext memlab`` (:func:`load_ipython_extension`, which registers :class:`MemfitMagics`). The
Jupyter layer is the only one that imports IPython for the magic; ``import memlab`` never imports it
(``memlab.load_ipython_extension`` imports it when IPython asks).

What the magic does, in order, each job in its module:

1. **Parse** (:mod:`~memlab.frontends.jupyter.magic.parse`): it reads its options (``%%memfit?`` shows them). Any
   wrong input, here or in the next step, raises IPython's ``UsageError`` with one line that says what is wrong and
   what to write; then nothing has run and the model is as it was.
2. **Run** (:mod:`~memlab.frontends.jupyter.magic.run`): it chooses the mode once, a training request or with
   ``--inference`` an inference request, each of which checks the options that go together; it looks MODEL and
   BATCH up in the user namespace (plain names, or attribute chains such as ``trainer.model``; nothing is
   ``eval``-ed), compiles the cell body once into the loss function, and checks everything it can before the model
   is touched. The job it prepares runs, in training, ``memlab.compare`` over the ``--try`` grid, ``memlab.fit``
   (a search), ``memlab.estimate`` (``--dry-run``) or a sharded estimate (``--dry-run --gpus N|auto``); with
   ``--inference`` the same over :class:`memlab.InferencePlan` settings, or the largest batch that fits. Errors
   raised by the loss while a trial runs are that trial's ``"error"`` status, not a UsageError.
3. **Render** (:mod:`~memlab.frontends.jupyter.magic.render`): unless ``--quiet``, the live figure is displayed at
   the first trial and updated while trials run; when the run ends (normally, on Ctrl-C, or with an error) it is
   replaced by a static record (an SVG) that the saved notebook shows without a kernel. Third-party warnings and
   log lines are kept out unless ``--verbose``, and each is said once after the cell's output, as one line without
   the machine's paths (:func:`memlab.live.quiet.collecting`).
4. With ``--apply`` it puts the best plan on the live model with ``memlab.apply`` and stores what it returns as
   ``memfit_applied`` in the user namespace (``memfit_applied.undo()`` takes it off again).
5. The Report is the cell's value: IPython shows its table, and ``r = _`` keeps it. Ctrl-C stops the cell with a
   one-line KeyboardInterrupt whose ``report`` holds the trials already finished.
"""

from __future__ import annotations

from typing import Any, cast

from IPython.core.magic import Magics, line_cell_magic, magics_class

from memlab.frontends.jupyter.magic.parse import empty_body_transformer, memfit_arguments, parse_line, usage_error
from memlab.frontends.jupyter.magic.render import close_timelines, show_run, stopped
from memlab.frontends.jupyter.magic.run import InferenceRequest, TrainingRequest, prepare, request_for
from memlab.live.quiet import collecting
from memlab.report import Report

__all__ = ["MemfitMagics", "load_ipython_extension", "unload_ipython_extension"]


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

        MODEL may be a transformers Trainer (TRL's DPOTrainer and GRPOTrainer too), BATCH then optional: its own
        step is measured, searched, estimated and applied (a GRPOTrainer's generates first, from its longest
        prompts; it takes no BATCH). --host-budget SIZE judges the host memory a plan keeps (offloaded optimizer
        state and activations, a paged optimizer's spill) as --budget judges the GPU's: over it, a plan
        "does not fit (host)".

        --inference measures inference instead of training, on the same model and with the same figure: --try
        takes the settings of memlab.InferencePlan (weights=fp32,bf16,fp16 quantize=none,int8,nf4 batch_size=N
        new_tokens=N kv_cache=on,off), each run as a forward (or a generation of new_tokens) under
        torch.inference_mode(); --budget with one setting finds the largest batch that fits, --search --budget the
        fastest --try setting that fits, --dry-run estimates them. The cell body stays empty; --apply, --lr,
        --batch-size, --gpus and --strategy are for training.

        --dry-run --gpus N (or auto, with --budget) estimates training sharded over N GPUs with --strategy
        fsdp1, fsdp2, zero2 or zero3 (default: fsdp2, zero2 and zero3): a line per plan and strategy with the peak
        per GPU and where it goes, and a Report with one trial per plan and strategy.
        memlab never shards a live run, so --gpus and --strategy need --dry-run. MODEL may live on the meta
        device (shapes only, no memory).

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
        # cast: IPython 9 types @line_cell_magic's result so that mypy refuses it bound (IPython 8 leaves it untyped)
        request = request_for(parse_line(cast(Any, self).memfit, line))  # parse; the mode is chosen here, once
        # What libraries say while the cell runs is shown once, short and without the machine's paths, after it.
        with collecting(request.args.verbose) as remarks:
            try:
                report, interrupted = self._run(request, cell)
            finally:
                remarks.show()
        if interrupted:  # raised here, where no frame below holds the run's tensors: "Run All" stops at this cell
            raise stopped(report)
        return report

    def _run(self, request: TrainingRequest | InferenceRequest, cell: str | None) -> tuple[Report, bool]:
        """The cell's work, prepared (nothing runs before everything is checked) and shown: its report, and whether
        Ctrl-C stopped it."""
        job = prepare(request, self._namespace(), cell)
        report, interrupted = show_run(job, self.shell, quiet=request.args.quiet)
        if not interrupted and job.after is not None:
            job.after(report)
        return report, interrupted

    def _namespace(self) -> dict[str, Any]:
        if self.shell is None:
            raise usage_error("%%memfit runs only inside IPython; load it there with %load_ext memlab")
        namespace: dict[str, Any] = self.shell.user_ns
        return namespace


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
    events = getattr(ipython, "events", None)
    if events is not None and close_timelines not in events.callbacks.get("pre_run_cell", []):
        events.register("pre_run_cell", close_timelines)  # a run's timeline list is closed when the next cell runs


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
    events = getattr(ipython, "events", None)
    if events is not None and close_timelines in events.callbacks.get("pre_run_cell", []):
        events.unregister("pre_run_cell", close_timelines)
