"""``fit``: the fastest plan whose measured peak fits a memory budget at a fixed effective batch."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn
from typing_extensions import Unpack

from memlab.errors import MemlabError, refuse_class
from memlab.estimation.cuda.allocator import assumed_allocator
from memlab.estimation.cuda.gpus import GpuKind, gpu_kind
from memlab.events import TrialSettled
from memlab.live.batch import Batch, atomic_refusal, count_rows, is_atomic, trainer_of
from memlab.live.device import cuda_bf16_supported, expandable_segments_configured, model_device
from memlab.live.structure import trainable_parameters
from memlab.live.trainer_kinds import kind_of
from memlab.measure.cuda import cuda_card_capacity
from memlab.options import RunKeywords, RunOptions
from memlab.plan import Plan, trainer_levers_refusal
from memlab.report import Report, Trial
from memlab.runner.progress import retiming_runs, run_progress
from memlab.runner.remeasure import settle_close_race
from memlab.runner.trial import TrialRunner, keep_on_interrupt
from memlab.search.allocator import expandable_suggestions
from memlab.search.blocks import fewest_blocks
from memlab.search.limits import shorter_sequences
from memlab.search.space import TECHNIQUE_DEFAULTS, candidate_plans, default_space, fits, micro_batch_of
from memlab.search.speed import SpeedModel, SpeedPrior, speed_prior
from memlab.search.strategy import Search, cheap_twin
from memlab.search.suggest import combined_suggestions, suggestions
from memlab.techniques.accumulation import check_split
from memlab.techniques.adapters import carried_space
from memlab.techniques.attention import fused_attention_instead
from memlab.techniques.checkpointing import checkpoint_blocks
from memlab.techniques.core.registry import built_settings
from memlab.techniques.loss import chunked_loss_applies
from memlab.techniques.offload import NO_OFFLOAD
from memlab.techniques.precision import BF16, half_precision
from memlab.trainer.entry import live_target, noted, trainer_state
from memlab.trainer.meta import refuse_meta
from memlab.trainer.reference import with_reference
from memlab.trainer.source import is_trainer

__all__ = ["MAX_TRIALS", "fit"]

MAX_TRIALS = 15
"""How many plans ``fit`` measures at most by default: a search over hundreds of plans answers in about a dozen."""


def fit(
    model: nn.Module,
    batch: Batch | None = None,
    *,
    batch_size: int | None = None,
    space: Mapping[str, Sequence[Any]] | None = None,
    dry_run: bool = False,
    estimates: bool = True,
    max_trials: int | None = MAX_TRIALS,
    gpu: str | GpuKind | None = None,
    **options: Unpack[RunKeywords],
) -> Report:
    """The fastest plan whose measured peak fits ``budget`` at the effective batch ``batch_size``.

    Plans are measured on the live model (restored bit-exact afterwards) fastest-expected first, and plans that
    cannot fit or cannot beat the best so far beyond the noise are skipped (see :mod:`memlab.search` for how). When
    the best is tied within noise at the end, the closest contenders are timed again in turn (A B A B, see
    :mod:`memlab.runner.remeasure`), and their speeds come from those rounds. The first plan runs
    without the budget's cap, so that its whole peak is known even when it does not fit (on CUDA it is still
    limited by the device); every other plan runs capped at the budget, as ``measure(..., budget=budget)`` does.
    Every trial is judged against the budget (the first one too), so ``trial.fits`` agrees with
    ``report.fits(trial)``. The returned Report holds every measured trial in order; its ``best`` is the answer
    (None when nothing fits; then ``suggestions`` holds plans outside the space, such as LoRA, estimated to fit), and
    its ``skipped`` lists the plans not measured with the reason. Ctrl-C stops the
    search (or the suggestions' estimates, or a dry run); the KeyboardInterrupt carries the trials finished so far
    as ``.report``.

    Args:
        model: the model to train, on its device; or a ``transformers.Trainer`` (TRL's included), whose model,
            ``compute_loss`` and effective batch are used (:mod:`memlab.trainer.entry`); checkpointing is then
            searched as the Trainer's switch runs it, every block or none (no ``checkpointing=k``). The trainer as
            built (``Plan.from_trainer``) is measured first where the space holds it: the report's first row is then
            what ``memlab.measure(trainer)`` measures.
        batch: one batch (dict of tensors, tensor, or tuple); rows repeat where ``batch_size`` asks for more. With a
            trainer it may be left out: the train dataset's worst batch is measured (said in the trials' notes).
        batch_size: the effective batch (rows per optimizer step); default: the rows of ``batch`` (a trainer's:
            ``per_device_train_batch_size x gradient_accumulation_steps``).
        space: restrict the axes, e.g. ``{"precision": ["fp32"], "micro_batch": [8, 4]}`` (keys are Plan fields;
            ``accumulation`` follows from ``batch_size / micro_batch``). Default: :func:`default_space`.
        dry_run: rank by :func:`memlab.estimation.estimate.estimate` (fake tensors, nothing runs): plans are estimated
            in order of expected speed and the first estimated to fit is the answer; nothing is timed. Where none
            fits, ``suggestions`` holds what is estimated to: lever combinations outside the space
            (:func:`memlab.search.suggest.combined_suggestions`), or a trainer kind's own (a GRPOTrainer's config
            changes, the longest ``max_completion_length`` in ``shorter_sequences``).
        estimates: before measuring a plan whose peak rests on a part nothing has shown yet (a new adapter, a new
            optimizer, a new mix of techniques), estimate it and a few like it on fake tensors, so that plans
            estimated not to fit are skipped unmeasured. False: only measured trials (and least-case guesses).
        max_trials: measure at most this many plans (the close contenders' re-runs in turn are not counted; None:
            no limit). The search measures the plans expected fastest first, so the limit cuts the least promising;
            the plans it leaves are in ``skipped``, each with its expected speed and peak.
        gpu: with ``dry_run=True``, the GPU the dry runs are for, from any machine (a name such as
            ``"RTX4090-24GB"`` or a :func:`~memlab.gpu_kind`): the plans that card can run are searched (bf16 where
            it runs bf16, offload), each judged on that card's figure, the budget defaulting to its memory. Default:
            the device the model is on (a model on the meta device: an H100's figures).
        options: :class:`~memlab.options.RunKeywords`. ``budget``: bytes or a size such as ``"8GiB"``, what the card
            may show for the process on CUDA (the allocator's reserve and the CUDA context: each trial is judged on
            that card figure, and capped at the budget less the context); default on CUDA what this process can hold
            there and its context (:func:`memlab.measure.cuda.cuda_card_capacity`); on CPU it must be given.

    Example:
        >>> import torch
        >>> model = torch.nn.Sequential(torch.nn.Linear(16, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
        >>> report = fit(model, torch.randn(8, 16), budget="1MiB", loss_fn=lambda m, b: m(b).mean(),
        ...              steps=1, progress=False, space={"precision": ["fp32"], "optimizer": ["adamw"]})
        >>> report.best.fits, report.best.rows_per_step
        (True, 8)
    """
    refuse_class(model, "fit")
    if not dry_run:
        refuse_meta(model, "fit")  # a model on the meta device has no values to run: fit(..., dry_run=True) has none
        if gpu is not None:
            raise MemlabError(f"gpu={gpu!r} names the GPU a dry run is for, and fit measures on the device the model "
                              "is on; write memlab.fit(..., dry_run=True, gpu=...) to estimate for that GPU")
    card = gpu_kind(gpu) if gpu is not None else None
    if is_trainer(model) or batch is None:
        # A trainer: its model, its compute_loss, its effective batch and (without a batch) its dataset's worst one.
        target = live_target(model, batch, options.get("loss_fn"), rows=batch_size, generation=True)
        options["loss_fn"] = target.loss_fn
        declared = kind_of(model)  # its kind's own levers, then a peft model's adapters kept, then the user's space
        carried = carried_space(target.model, target.plan) if target.plan is not None else {}
        # A live trainer cannot switch to DeepSpeed, which optimizer offload needs (memlab.apply refuses it): it is
        # searched only where the space asks for it (to export with plan.to_deepspeed()).
        # What a built trainer cannot change (a DPOTrainer's precompute_ref: the lever's refuses_change, apply refuses
        # it) is searched in dry runs only, and where the trainer sets it itself, kept as it is.
        built = built_settings()
        levers = {name: values for name, values in declared.levers.items() if dry_run or name not in built}
        own = {name: [getattr(target.plan, name)] for name in levers
               if name in built and target.plan is not None and getattr(target.plan, name, None) is not None}
        space = {"offload": [NO_OFFLOAD], **levers, **own, **carried, **(space or {})}
        refuse_selective_for_trainer(space)
        # The Trainer's checkpointing switch covers every block or none: some blocks (checkpointing=k) would be a
        # plan neither memlab.apply(trainer, ...) nor to_training_arguments() could carry, so none is searched.
        # A trainer kind with its own step (GRPO's generates first) brings its runner and its dry run.
        kind = target if target.runner is not None else None
        if kind is not None and declared.fit_dry_runs is not None:
            kind = declared.fit_dry_runs(kind, model, options.get("loss_fn"))
        # The model's own dry runs count a reference model the trainer holds apart (a DPOTrainer's), as estimate does.
        held = None if kind is not None else lambda trial: with_reference(trial, model)
        report = _fit_module(target.model, target.batch, batch_size or target.batch_size, space, dry_run, estimates,
                             max_trials, False, options, kind=kind, held=held, gpu=card, first=target.plan)
        return dataclasses.replace(report, trials=noted(report.trials, target.note))
    if space is not None and isinstance(space, Mapping) and trainer_of(options.get("loss_fn")) is None:
        # A built trainer's own setting (precompute_ref, the vLLM engine's) on a model: refused before any trial.
        refusal = trainer_levers_refusal(space, f"fit was given a {type(model).__name__}",
                                         "pass the trainer as the model, memlab.fit(trainer, space={{'{name}': ...}})")
        if refusal:
            raise MemlabError(refusal)
    return _fit_module(model, batch, batch_size, space, dry_run, estimates, max_trials, True, options, gpu=card)


def refuse_selective_for_trainer(space: Mapping[str, Sequence[Any]] | None) -> None:
    """Refuse a search space that checkpoints some blocks (an int) for a trainer, saying what to write instead.

    Example:
        >>> refuse_selective_for_trainer({"checkpointing": [False, True]})
        >>> refuse_selective_for_trainer({"checkpointing": [4]})
        Traceback (most recent call last):
        ...
        memlab.errors.MemlabError: a Trainer checkpoints every block or none ...
    """
    values = (space or {}).get("checkpointing", [])
    values = [values] if isinstance(values, (bool, int)) else list(values)
    some = [value for value in values if type(value) is int and value > 0]
    if some:
        raise MemlabError(
            "a Trainer checkpoints every block or none (its activation_checkpointing switch), so "
            f"checkpointing={some[0]} blocks cannot be searched on one; write "
            "space={'checkpointing': [False, True]}, or search the model itself (memlab.fit(trainer.model, batch, "
            "...)) and checkpoint its blocks before building the Trainer"
        )


def _fit_module(model: nn.Module, batch: Batch, batch_size: int | None, space: Mapping[str, Sequence[Any]] | None,
                dry_run: bool, estimates: bool, max_trials: int | None, selective: bool, options: RunKeywords, *,
                kind: Any = None, held: Any = None, gpu: GpuKind | None = None, first: Plan | None = None) -> Report:
    """:func:`_fit_module_here` with the allocator this process runs (``PYTORCH_CUDA_ALLOC_CONF``) assumed by every
    dry run it makes: on CUDA, their card figures are those of this process's allocator; a trainer's step (behind
    the loss, or its own batch) reads its own accelerate state (:func:`memlab.trainer.entry.trainer_state`)."""
    with assumed_allocator(expandable_segments_configured()), trainer_state(model, batch, options.get("loss_fn")):
        return _fit_module_here(model, batch, batch_size, space, dry_run, estimates, max_trials, selective, options,
                                kind=kind, held=held, gpu=gpu, first=first)


def _fit_module_here(
    model: nn.Module,
    batch: Batch,
    batch_size: int | None,
    space: Mapping[str, Sequence[Any]] | None,
    dry_run: bool,
    estimates: bool,
    max_trials: int | None,
    selective: bool,
    options: RunKeywords,
    *,
    kind: Any = None,
    held: Any = None,
    gpu: GpuKind | None = None,
    first: Plan | None = None,
) -> Report:
    """:func:`fit` on a module; ``selective``: whether the fewest checkpointed blocks that fit are searched for
    (:func:`memlab.search.blocks.fewest_blocks`) when the best plan checkpoints every block; ``kind``: a trainer
    kind's :class:`~memlab.trainer.entry.LiveTarget` whose step has its own runner and dry run (a GRPOTrainer's),
    else None; ``held``: ``held(trial) -> trial`` adds to each of the model's own dry runs what the trainer holds
    beside the model (a DPOTrainer's reference model: :func:`memlab.trainer.reference.with_reference`), else None;
    ``gpu``: the GPU kind a dry run is for (its space, its budget, its card figures), else None; ``first``: the plan a
    measured search runs first where the space holds it (a trainer as built, so that the report's first row is what
    ``memlab.measure(trainer)`` measures), else the search's own first."""
    run_options = RunOptions.from_keywords(options)
    if not isinstance(model, nn.Module):
        raise MemlabError(f"model must be a torch nn.Module, not {type(model).__name__}")
    rows = count_rows(batch)
    if batch_size is None:
        batch_size = rows
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise MemlabError(f"batch_size={batch_size!r} is not allowed; write a whole number >= 1, e.g. batch_size=32")
    if max_trials is not None and (isinstance(max_trials, bool) or not isinstance(max_trials, int) or max_trials < 1):
        raise MemlabError(
            f"max_trials={max_trials!r} is not allowed; write a whole number >= 1, e.g. max_trials=15, or None for "
            "no limit"
        )
    device = model_device(model)
    # a dry run for a GPU kind searches what that card runs, wherever the model is
    searched = torch.device("cuda") if gpu is not None else device
    bf16 = gpu.bf16 if gpu is not None else device.type == "cuda" and cuda_bf16_supported(device)
    budget = run_options.budget
    if budget is None and gpu is not None:
        budget = gpu.memory_bytes  # what the card figure must fit, as memlab.estimate(..., gpu=...) judges it
    if budget is None:
        if device.type != "cuda":
            raise MemlabError(
                f"fit on {device.type} needs a budget; write for example budget='8GiB' or budget='500MB'"
            )
        budget = cuda_card_capacity(device)  # budgets are what the card shows: the allocator's part and the context
    resolved_space: dict[str, Sequence[Any]] = dict(
        default_space(
            batch_size,
            searched.type,
            bf16,
            chunked_loss=chunked_loss_applies(model, run_options.loss_fn),
            fused_attention=fused_attention_instead(model),
        )
    )
    if space is not None:
        if not isinstance(space, Mapping):
            raise MemlabError("space must be a dict of plan fields to values, e.g. {'precision': ['fp32', 'bf16']}")
        resolved_space.update(space)
    if gpu is not None and not gpu.bf16 and BF16 in list(resolved_space.get("precision", [])):
        half = [value for value in resolved_space["precision"] if value != BF16] + [half_precision(False)]
        raise MemlabError(f"the {gpu.name} runs no bf16 (compute capability {gpu.capability[0]}.{gpu.capability[1]}), "
                          f"and the space asks for it; write space={{'precision': {sorted(set(half))!r}}}")
    if is_atomic(batch):  # taken whole: each micro-batch is the batch itself, accumulation makes up batch_size
        if batch_size % rows:
            raise atomic_refusal(rows, f"batch_size={batch_size} (not a multiple of its {rows} rows)")
        resolved_space["micro_batch"] = (space or {}).get("micro_batch", [rows])
    candidates = candidate_plans(batch_size, resolved_space, batch_rows=rows)
    for plan in candidates:
        check_split(batch, plan)
    trainable = sum(p.numel() * p.element_size() for p in trainable_parameters(model))
    prior = speed_prior(searched.type)
    run_options = run_options.replace(budget=budget)
    if dry_run:
        return _dry_run(model, batch, candidates, batch_size, prior, run_options, selective, kind, held, gpu,
                        half=half_precision(bf16))
    measured: list[Trial] = []
    # The bar stays open after the search, while suggestions are estimated: no silent phase after the last plan.
    progress = run_progress(len(candidates), run_options.progress, at_most=True, then=retiming_runs(len(candidates)),
                            keep_open=True)
    with keep_on_interrupt(measured, budget), progress as bar:
        runner = (TrialRunner if kind is None else kind.runner)(model, batch, run_options, listener=bar)
        with runner.session():

            def measure(plan: Plan, index: int, total: int) -> Trial:
                # The first plan runs without the budget's cap: a capped run that does not fit stops at the budget
                # and says only that, while the whole peak and its breakdown teach the memory model the most.
                trial = runner.run(plan, index, total, capped=index > 0)
                if index == 0 and fits_only_uncapped(trial, budget):
                    trial = runner.run(plan, index, total, capped=True)
                measured.append(trial)
                return trial

            def estimate(plans: Sequence[Plan]) -> list[Trial]:
                from memlab.estimation.estimate import estimate_plans  # here: estimate builds on the search's runner

                if kind is not None:
                    return list(kind.estimate(plans, budget=budget, device=device, lr=run_options.lr))
                # Dry runs on fake tensors: the live model is copied onto them, never touched.
                trials = estimate_plans(model, batch, plans, loss_fn=run_options.loss_fn, budget=budget,
                                        lr=run_options.lr, device=device).trials
                return [held(trial) for trial in trials] if held is not None else list(trials)

            search = Search(candidates, budget=budget, batch_size=batch_size, trainable_bytes=trainable, prior=prior,
                            device_type=device.type, estimate=estimate if estimates else None,
                            max_trials=max_trials)
            if first is not None and first in search.pending:
                search.record(measure(first, 0, len(candidates)))
            result = search.run(measure, on_step=bar.advance)
            trials = list(result.trials)
            # Checkpointing every block fits: the fewest blocks that fit are faster (memory is monotone in blocks).
            if selective:
                # Its trials count against max_trials, and the estimates of every block count narrow it.
                trials += fewest_blocks(
                    trials, budget, lambda: len(checkpoint_blocks(model)),
                    lambda plan: measure(plan, len(measured), len(candidates)),
                    estimate=(lambda plans: estimate([cheap_twin(plan) for plan in plans])) if estimates else None,
                    limit=None if max_trials is None else max(0, max_trials - len(measured)),
                )
            # The original index: a live figure redraws that plan's column with the new run.
            rerun = lambda plan, index: runner.run(plan, index, len(trials))  # noqa: E731 - one line, used once
            settled = settle_close_race(
                trials, rerun, budget, bar.say,
                settled=lambda trial, index: runner.announce(TrialSettled(trial, index, len(trials))),
            )
            for before, after in settled:
                measured[measured.index(before)] = after
    report = Report(trials, budget=budget, skipped=result.skipped)
    if report.best is None and kind is not None and measured:  # a trainer kind's own: its config changes
        bar.unbounded("estimating what changes the training")
        lightest = min(measured, key=lambda trial: trial.peak_bytes).plan
        report.suggestions, report.shorter_sequences = kind.suggest(lightest, budget=budget, device=device,
                                                                    lr=run_options.lr)
    elif report.best is None and kind is None:
        bar.unbounded("estimating plans outside the searched space")
        try:
            memory, _ = search.models()
            # Least-case predictions tie where nothing was measured: then the fewest rows and the most levers on.
            lightest = min(candidates, key=lambda plan: (
                memory.predict(plan), micro_batch_of(plan, batch_size), not plan.checkpointing,
                *(getattr(plan, name) == TECHNIQUE_DEFAULTS[name] for name in ("loss", "precision", "optimizer")),
            ))
            report.suggestions = suggestions(model, batch, result.trials, resolved_space, run_options, prior, lightest)
            if device.type == "cuda":  # the allocator's lever first: it changes nothing of the step
                report.suggestions[:0] = expandable_suggestions(model, batch, measured, run_options)
            bar.unbounded("estimating the longest sequences that would fit")
            report.shorter_sequences = shorter_sequences(model, batch, lightest, budget, device=device,
                                                         loss_fn=run_options.loss_fn, lr=run_options.lr)
        except KeyboardInterrupt as interrupt:
            # Ctrl-C while estimating suggestions: the finished search rides on the interrupt, as during it.
            interrupt.report = report  # type: ignore[attr-defined]
            raise
        finally:
            bar.close()
    bar.close()
    return report


def fits_only_uncapped(trial: Trial, budget: int) -> bool:
    """Whether ``trial`` fits ``budget`` by its allocated peak (and the CUDA context) while the CUDA allocator
    reserved more than the budget leaves it.

    A cap holds the caching allocator's reserved memory (at the budget less the context), which fragmentation makes
    larger than the allocated peak; on a GPU of ``budget`` bytes such a plan may run out of memory, or the allocator
    may make do under pressure, so fit runs it again under the cap, where it either fits or reports "oom". (The GPU
    run found a plan 2% under its budget by allocated peak that reserved 32% more and ran out of memory under the
    cap.)

    Example:
        >>> from memlab.plan import Plan
        >>> trial = Trial(Plan(), "ok", 90, {}, None, None, None, "cuda:0", reserved_bytes=130)
        >>> fits_only_uncapped(trial, budget=100), fits_only_uncapped(trial, budget=200)
        (True, False)
        >>> fits_only_uncapped(dataclasses.replace(trial, context_bytes=20), budget=140)
        True
    """
    context = trial.context_bytes or 0
    return (
        trial.status == "ok"
        and trial.peak_bytes + context <= budget
        and trial.reserved_bytes is not None
        and trial.reserved_bytes + context > budget
    )


def _dry_run(
    model: nn.Module,
    batch: Batch,
    candidates: Sequence[Plan],
    batch_size: int,
    prior: SpeedPrior,
    options: RunOptions,
    selective: bool,
    kind: Any = None,
    held: Any = None,
    gpu: GpuKind | None = None,
    half: str = BF16,
) -> Report:
    """Estimate candidates on fake tensors in order of expected speed (the prior: nothing is timed) until one is
    estimated to fit: that one is the answer, and the plans after it are skipped as expected slower. For ``gpu``,
    each is estimated for that GPU kind (its card figure, its CUDA context). Where none fits, the suggestions are
    estimated too (a trainer kind's own, or lever combinations outside the space, autocast in ``half``: the card's
    half precision)."""
    from memlab.estimation.cuda.context import card_context, live_card_context
    from memlab.estimation.estimate import estimate

    budget = options.budget or 0
    speed = SpeedModel([], candidates, batch_size=batch_size, prior=prior)
    order = sorted(candidates, key=speed.expected, reverse=True)
    # a model on the meta device is estimated for CUDA (target_device), as memlab.estimate does
    device: Any = "cuda" if gpu is not None else None if model_device(model).type == "meta" else model_device(model)

    def dry_run(plan: Plan) -> Trial:
        # the plan's dry run (a trainer kind's own where it has one), what the trainer holds beside the model added,
        # with the card's context: the kind asked for, else the GPU the model is on (or the default kind's)
        trial = estimate(model, batch, plan, loss_fn=options.loss_fn, budget=budget, lr=options.lr, device=device,
                         host_budget=options.host_budget, gpu=gpu) \
            if kind is None else kind.estimate([plan], budget=budget, device=device, lr=options.lr, gpu=gpu)[0]
        trial = trial if held is None else held(trial)
        return card_context(trial, gpu) if gpu is not None else live_card_context(trial, model)

    trials: list[Trial] = []
    with keep_on_interrupt(trials, budget):
        for position, plan in enumerate(order):
            trials.append(dry_run(plan))
            if fits(trials[-1], budget):
                reason = f"expected slower: {plan.label()} is expected faster and is estimated to fit"
                if selective:  # the same dry run, fewer blocks
                    trials += fewest_blocks(trials, budget, lambda: len(checkpoint_blocks(model)), dry_run)
                return Report(trials, budget=budget, skipped=[(slower, reason) for slower in order[position + 1 :]])
        report = Report(trials, budget=budget)
        ran = [trial for trial in trials if trial.status == "ok"]
        if not ran:
            return report
        # Nothing fits: what would, estimated as the measured search suggests it (from the lowest figure's plan).
        lowest = min(ran, key=lambda trial: trial.verdict_bytes)
        if kind is not None and kind.suggest is not None:  # a trainer kind's own: its config changes
            report.suggestions, report.shorter_sequences = kind.suggest(lowest.plan, budget=budget, device=device,
                                                                        lr=options.lr, gpu=gpu)
        else:
            report.suggestions = combined_suggestions(lowest, lambda plans: [dry_run(plan) for plan in plans],
                                                      budget=budget, rows=batch_size, prior=prior, want=2,
                                                      tries=4, half=half)
    return report
