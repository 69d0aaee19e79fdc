"""``memlab estimate``: predict, without the hardware, which plans fit a memory budget (a dry run on fake tensors).

Example (nothing is downloaded with a built-in shape or a local config)::

    memlab estimate meta-llama/Llama-2-7b-hf --config llama-7b --batch 1x512 --budget 24GiB \\
        --try precision=bf16 checkpointing=off,on optimizer=adamw,adamw8bit

prints one line per plan (the predicted allocated peak, what the card will show: the allocator's reserve and the
CUDA context of the GPU ``--gpu`` names, where it goes, fits or does not fit, judged on the card figure where it is
known) and exits with 0 when a plan fits (or no budget was given), 1 when none fits, 2 on wrong input (3 when
memlab itself failed: :func:`memlab.frontends.cli.run_handler`). A dry run
of a large model takes minutes, so each step (the config, each plan, each number of GPUs and strategy tried) is
said on stderr as it starts, with the time so far (:func:`progress_lines`); stdout holds only the table (or the
JSON).

``memlab.frontends.cli.main`` builds the sub-command with :func:`add_arguments` and runs it with :func:`run`; this
module imports neither torch nor transformers until :func:`run` is called.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any, TextIO

from memlab.frontends.cli.errors import DEFAULT_BATCH, cli_words, estimate_status
from memlab.frontends.cli.estimate.progress import EstimateProgress, estimate_each
from memlab.frontends.cli.estimate.text import budget_words, count_text, for_gpu, json_with_verdicts
from memlab.frontends.cli.gpu import add_gpu_arguments, check_gpu_flags, cli_gpu, gpu_budget
from memlab.frontends.cli.load import add_load_arguments, load_from_args

__all__ = ["add_arguments", "cli_words", "run", "run_sharded"]

_DESCRIPTION = (
    "Predict the peak memory of one training step for each plan, on fake tensors: nothing is downloaded but the "
    "config, nothing is computed, no memory is taken. MODEL is a Hub name, a path to a config.json (or its folder), "
    "or a built-in shape: {shapes}."
)
_EPILOG = (
    "Exit status: 0 when a plan fits the budget (or no budget was given), 1 when none fits, 2 on wrong input, 3 "
    "when memlab itself failed (one line says what; MEMLAB_TRACEBACK=1 shows the traceback) or a plan could not be "
    "estimated (its row says error, a note why), 130 when interrupted; "
    "--gpu (or --gpu-memory) without --budget makes that GPU's memory the budget. The table, --json's verdict and "
    "the exit status judge each plan once, the same way. When nothing fits, the commands that try the plans "
    "estimated to fit follow the table. "
    "On CUDA a plan fits when what the card will show (the allocator's reserve and the CUDA context of --gpu, both "
    "modelled) is within the budget; where that card figure is unknown, its allocated peak, which leaves out "
    "allocator rounding and fragmentation and the CUDA context: keep a margin. Workspaces kernels take inside "
    "themselves (other than cuBLAS's) are never included."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare ``memlab estimate``'s arguments on ``parser`` (a sub-command parser of ``memlab``).

    Example:
        >>> parser = argparse.ArgumentParser(prog="memlab estimate")
        >>> add_arguments(parser)
        >>> args = parser.parse_args(["llama-7b", "--batch", "1x512", "--try", "checkpointing=off,on"])
        >>> args.model, args.batch, args.try_
        ('llama-7b', '1x512', ['checkpointing=off,on'])
    """
    from memlab.estimation.estimate import KNOWN_SHAPES
    from memlab.frontends.cli.estimate.text import shape_names
    from memlab.frontends.cli.trainer import add_trainer_arguments, levers_asked
    from memlab.frontends.levers import lever_help, model_lever_specs, trainer_levers_note

    parser.description = _DESCRIPTION.format(shapes=shape_names(KNOWN_SHAPES))
    parser.epilog = _EPILOG
    parser.add_argument("model", metavar="MODEL", help="a Hub model name, a path to a config.json, or a built-in shape")
    parser.add_argument("--config", metavar="PATH_OR_NAME", default=None, help="where the config comes from, when "
                        "not from MODEL (a config.json, its folder, a shape or a Hub name)")
    parser.add_argument("--batch", metavar="ROWSxTOKENS", default=DEFAULT_BATCH,
                        help="rows and tokens per batch (default: 1x512)")
    parser.add_argument("--budget", metavar="SIZE", default=None,
                        help="memory budget such as 24GiB or 16GB (default with --gpu: that GPU's memory)")
    parser.add_argument(
        "--try",
        dest="try_",
        metavar="KEY=V1,V2",
        nargs="+",
        action="extend",
        default=None,
        help="plan settings to combine, e.g. precision=fp32,bf16 checkpointing=off,on micro_batch=1,2 "
        "accumulation=4 optimizer=adamw,adamw8bit (default: the plain plan). The settings (docs/levers.md says what "
        "each does): "
        + lever_help(model_lever_specs(), said=False).replace("%", "%%") + ". "
        + trainer_levers_note(levers_asked()),
    )
    parser.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default=None,
        help="the device to predict for (default: cuda, even on a machine without a GPU)",
    )
    add_gpu_arguments(parser)
    parser.add_argument(
        "--gpus",
        metavar="N|auto",
        default=None,
        help="GPUs the training is sharded over: the peak is then per GPU, for --batch per GPU; 'auto' (with "
        "--budget) finds the smallest power of two that fits, for each strategy (default: 1)",
    )
    parser.add_argument(
        "--strategy",
        choices=("none", "fsdp2", "fsdp1", "zero2", "zero3"),
        default=None,
        help="how training is sharded: FSDP2 or FSDP1 (accelerate's fsdp_version 2 or 1), DeepSpeed ZeRO-2 or ZeRO-3 "
        "(default with --gpus: fsdp2, zero2 and zero3); --try offload=params offloads each GPU's shard of the weights",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON instead of a table")
    parser.add_argument("--no-cache", action="store_true", help="make every dry run again: use no answer kept "
                        "from an earlier ask and keep none (they are kept in $MEMLAB_CACHE_DIR, default "
                        "~/.cache/memlab: docs/estimates.md)")
    parser.add_argument("--max-tokens", action="store_true",
                        help="the longest sequences each plan fits in --budget, --batch's rows kept (memlab.limits)")
    parser.add_argument("--max-rows", action="store_true",
                        help="the most rows each plan fits in --budget, --batch's tokens kept (memlab.limits)")
    add_load_arguments(parser)  # how the model is loaded (memlab.frontends.cli.load)
    add_trainer_arguments(parser)  # --trainer grpo|dpo with TRL's settings (memlab.frontends.cli.trainer)


def run(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Run ``memlab estimate`` with parsed ``args``; returns the exit status (0 fits, 1 none fits, 2 wrong input).

    Example:
        >>> parser = argparse.ArgumentParser(prog="memlab estimate")
        >>> add_arguments(parser)
        >>> run(parser.parse_args(["llama-7b", "--batch", "1 by 512"]), err=sys.stdout)
        memlab estimate: batch '1 by 512' is not ROWSxTOKENS; write for example --batch 1x512
        2
    """
    out = sys.stdout if out is None else out
    err = sys.stderr if err is None else err
    from memlab.errors import MemlabError
    from memlab.estimation.answers import answers_kept, cache_folder
    from memlab.frontends.cli.estimate.kept import run_kept
    from memlab.frontends.cli.trainer import keeps_whole_answer

    try:  # the dry runs' answers kept: within this ask always, between asks unless --no-cache
        with answers_kept(None if getattr(args, "no_cache", False) else cache_folder()):
            keep = run_kept if keeps_whole_answer(args) else lambda _, printed, ask: ask(printed)
            return keep(args, out, lambda printed: _run(args, printed, err))  # the whole answer kept too
    except MemlabError as error:
        import textwrap

        from memlab.frontends.cli.estimate.text import WIDTH

        # Wrapped to the answer's width, never inside a word: a command to copy stays whole on its line.
        said = textwrap.wrap(f"memlab estimate: {cli_words(str(error))}", WIDTH, subsequent_indent="  ",
                             break_long_words=False, break_on_hyphens=False)
        print("\n".join(said), file=err)
        return 2


def _run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    import dataclasses

    from memlab.errors import MemlabError
    from memlab.estimation.answers import kept_model_facts
    from memlab.estimation.cuda.context import card_contexts
    from memlab.estimation.estimate import load_config, meta_model, parse_batch_shape
    from memlab.frontends.cli.host import host_judged
    from memlab.frontends.cli.trainer import asks_trainer, levers_asked, run_trainer
    from memlab.frontends.levers import refuse_trainer_levers
    from memlab.plan import parse_axes, parse_budget, parse_grid
    from memlab.search.space import keep_rows

    if asks_trainer(args):  # a TRL trainer's step (memlab.frontends.cli.trainer)
        return run_trainer(args, out, err)
    batch = parse_batch_shape(args.batch)
    rows, tokens = batch["input_ids"]
    grid = list(args.try_ or [])
    # a trainer's own settings: refused before any run, with the trainer question that asks them
    refuse_trainer_levers(parse_axes(grid), f"memlab estimate {args.model}", levers_asked())
    # --try micro_batch=... keeps the batch's rows per optimizer step, as %%memfit does (the same function).
    left_out: list[str] = []
    plans, kept = keep_rows(parse_grid(grid, left_out=left_out), grid, rows, f"--batch {args.batch}")
    check_gpu_flags(args)  # the GPU's flags checked before anything is built
    budget = parse_budget(args.budget)
    if budget is None:
        budget = gpu_budget(args)
    gpus = getattr(args, "gpus", None)
    strategy = getattr(args, "strategy", None)
    if gpus is None and strategy not in (None, "none"):
        raise MemlabError(f"--strategy {strategy} needs a number of GPUs; add --gpus N, e.g. --gpus 8, or --gpus auto "
                          "with --budget")
    gpus = "1" if gpus is None else gpus
    load = load_from_args(args)
    if gpus == "auto" and budget is None:
        raise MemlabError("--gpus auto needs a budget; write for example --gpus auto --budget 80GiB (or --gpu "
                          "A100-80GB: the GPU's memory is then the budget)")
    from memlab.estimation.sharded.per_gpu import parse_gpus

    try:
        parse_gpus(gpus)
    except MemlabError:
        raise MemlabError(f"--gpus {args.gpus!r} is not a number of GPUs; write for example --gpus 8, or --gpus auto "
                          "with --budget") from None
    source = args.config or args.model
    sharded = gpus != "1" or strategy not in (None, "none")
    with EstimateProgress(err, dry_runs=_dry_runs(len(plans), gpus, strategy) if sharded else len(plans)) as say:
        say(f"reading the config of {source}")
        config = load_config(source)
        say("building the model on the meta device (shapes only, no memory)")
        model = meta_model(config) if sharded and load is None else None  # what the sharded dry runs are given
        called, parameters = kept_model_facts(config, model)
        # The config, not the meta model, for one GPU: its load is the one the plan implies or the flags say (the
        # meta model would be estimated as it is, in fp32, and cast: another reserve, so another card figure).
        if getattr(args, "max_tokens", False) or getattr(args, "max_rows", False):
            from memlab.frontends.cli.limits import run_limits

            return run_limits(args, config, batch, plans, budget, out, say=say, load=load)
        if sharded:
            args.gpus = gpus
            return run_sharded(args, model if model is not None else config, batch, plans, budget, out, say=say,
                               load=load)
        report = estimate_each(config, batch, plans, budget=budget, device=args.device, say=say,
                               gpu=cli_gpu(args), load=load)
        carded = card_contexts(report.trials, cli_gpu(args))
        report = dataclasses.replace(report, trials=host_judged(carded, args))
        if left_out:  # the grid's combinations that cannot go together: said, each with why
            kept = "; ".join([*([kept] if kept else []), f"--try's grid left out {len(left_out)} of its "
                              f"{len(plans) + len(left_out)} combinations: {'; '.join(left_out)}"])
        if kept is not None:
            for trial in report.trials:
                trial.notes = (*trial.notes, kept)
        fits = any(report.fits(trial) for trial in report)
        if budget is not None and not fits and report.trials:
            report.suggestions = _suggestions(args, config, batch, report, grid, say)
            from memlab.frontends.cli.allocator import expandable_suggestion  # the allocator's lever, free
            allocator_lines = expandable_suggestion(args, config, batch, report, load=load, say=say)
    if args.json:
        print(json_with_verdicts(report), file=out)
    else:
        from memlab.frontends.cli.estimate.next import suggestion_lines
        from memlab.frontends.cli.estimate.text import single_text

        header = (f"{args.model}: {called}, {count_text(parameters)} parameters, batch {rows}x{tokens}, "
                  f"{len(plans)} plan{'s' if len(plans) != 1 else ''}{for_gpu(args)}{budget_words(args, budget)}")
        after: list[str] = []
        if budget is not None and not fits and report.trials:
            sharded_too = all(trial.plan.adapter == "none" for trial in report.trials)
            after = [*allocator_lines, *suggestion_lines(args, report.suggestions, sharded=sharded_too,
                                                         best_named=True)]
        print("\n".join(single_text(args, header, report, budget, after)), file=out)
    return estimate_status(fits=fits, judged=budget is not None or getattr(args, "host_budget", None) is not None,
                           errors=sum(trial.status == "error" for trial in report.trials))


def _suggestions(args: argparse.Namespace, model: Any, batch: Any, report: Any, grid: list[str],
                 say: EstimateProgress) -> list[Any]:
    """Plans outside what was tried estimated to fit, the fastest expected first: single levers and their
    combinations (adapters, pure bf16, 8-bit Adam or Adafactor, checkpointing, micro-batches, the chunked loss,
    offload) on the plan tried with the lowest figure, those the search's memory model does not rule out estimated
    one at a time, most promising first (:func:`memlab.search.suggest.combined_suggestions`)."""
    import dataclasses

    from memlab.estimation.cuda.context import card_contexts
    from memlab.estimation.cuda.gpus import kind_or_default
    from memlab.search.speed import speed_prior
    from memlab.search.suggest import combined_suggestions

    ran = [trial for trial in report.trials if trial.status == "ok"]
    if not ran:
        return []
    # From the plan tried with the lowest figure the verdict judged (the card figure where known).
    lowest = min(ran, key=lambda trial: trial.verdict_bytes)
    tries = 4  # dry runs of a large model take seconds each: the few most promising, two that fit at most
    say.expect(tries)

    def estimate(plans: list[Any]) -> list[Any]:
        found = estimate_each(model, batch, plans, budget=report.budget, device=args.device, say=lambda _: None,
                              gpu=cli_gpu(args))
        return card_contexts(found.trials, cli_gpu(args))

    found = combined_suggestions(lowest, estimate, budget=report.budget, rows=batch["input_ids"][0],
                                 prior=speed_prior("cpu" if args.device == "cpu" else "cuda"), want=2, tries=tries,
                                 say=say,
                                 half="fp16" if args.device != "cpu" and not kind_or_default(cli_gpu(args)).bf16
                                 else "bf16")
    return [dataclasses.replace(trial) for trial in found]


def run_sharded(
    args: argparse.Namespace, model: Any, batch: Any, plans: Any, budget: int | None, out: TextIO,
    say: Callable[[str], None] | None = None, load: dict[str, Any] | None = None,
) -> int:
    """``memlab estimate --gpus N|auto [--strategy S]``: one line per plan and strategy, the peak per GPU (``say``
    is told each dry run as it starts: :func:`progress_lines`); ``load``: the load flags (:func:`load_from_args`),
    which reach the sharded estimate as they do one GPU's.

    Example:
        >>> parser = argparse.ArgumentParser(prog="memlab estimate")
        >>> add_arguments(parser)
        >>> run(parser.parse_args(["llama-7b", "--gpus", "auto"]), err=sys.stdout)  # doctest: +NORMALIZE_WHITESPACE
        memlab estimate: --gpus auto needs a budget; write for example --gpus auto --budget 80GiB
        (or --gpu A100-80GB: the GPU's memory is then the budget)
        2
    """
    from memlab.estimation.answers import kept_sharded
    from memlab.frontends.cli.estimate.next import searched_lines
    from memlab.frontends.cli.host import host_judged_rows, node_lines

    strategies = [args.strategy] if args.strategy not in (None, "none") else None
    trials = [row for plan in plans for row in kept_sharded(model, batch, plan, gpus=args.gpus, strategies=strategies,
                                                            budget=budget, device=args.device, gpu=cli_gpu(args),
                                                            say=say, load=load)]
    trials = host_judged_rows(trials, args)  # the node's host budget, shared by its ranks
    if args.json:
        import json

        from memlab.report.views.tables import status_text

        rows = [{"strategy": name, **(trial.to_dict() if trial is not None else {"plan": plan.label()}),
                 **({"gpus": trial.gpus, "model_state_bytes": trial.model_state_bytes, "detail": trial.detail,
                     "verdict": status_text(trial, trial.fits)}
                    if trial is not None else {"gpus": None, "fits": False,
                                               "verdict": "does not fit (on no number of GPUs up to 1024)"})}
                for plan, name, trial in trials]
        print(json.dumps(rows, indent=2, default=str), file=out)
    else:
        from memlab.frontends.cli.estimate.text import sharded_text, whole_weights

        header = (f"{args.model}: {type(model).__name__}, per-GPU batch {batch['input_ids'][0]}x"
                  f"{batch['input_ids'][1]}, --gpus {args.gpus}{for_gpu(args)}{budget_words(args, budget)}")
        searched = (searched_lines(args, plans, strategies or ["fsdp2", "zero2", "zero3"]) if args.gpus == "auto"
                    else [])
        weights = whole_weights(model, plans)
        print("\n".join([*sharded_text(args, header, trials, budget, searched, weights_bytes=weights),
                         *node_lines(trials)]), file=out)
    return estimate_status(fits=any(trial is not None and trial.fits for _, _, trial in trials),
                           judged=budget is not None or getattr(args, "host_budget", None) is not None,
                           errors=sum(trial is not None and trial.status != "ok" for _, _, trial in trials))


# --- progress on stderr -----------------------------------------------------------------------------------------


def _dry_runs(plans: int, gpus: str, strategy: str | None) -> int:
    """At most how many dry runs a sharded estimate makes: per plan, FSDP2's (one, or the search of the 11 numbers
    of GPUs --gpus auto tries: 5, a bisection's 4 and one more where a predicted probe missed; two where none
    did) and ZeRO's one."""
    fsdp2 = 5 if gpus == "auto" else 1
    zero = 1 if strategy in (None, "none", "zero2", "zero3") else 0
    return plans * ((fsdp2 if strategy in (None, "none", "fsdp2", "fsdp1") else 0) + zero)
