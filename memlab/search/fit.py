"""``fit``: the fastest plan whose measured peak fits a memory budget at a fixed effective batch."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from torch import nn
from typing_extensions import Unpack

from memlab.errors import MemlabError, refuse_class
from memlab.estimation.cuda.allocator import assumed_allocator
from memlab.estimation.cuda.gpus import GpuKind, gpu_kind
from memlab.live.batch import Batch, trainer_of
from memlab.live.device import expandable_segments_configured
from memlab.live.trainer_kinds import kind_of
from memlab.options import RunKeywords, RunOptions
from memlab.plan import trainer_levers_refusal
from memlab.report import Report, Trial
from memlab.search.fitting.dry_runs import dry_run_search
from memlab.search.fitting.measured import measured_search
from memlab.search.fitting.request import FitRequest
from memlab.search.fitting.space import fit_space
from memlab.techniques.adapters import carried_space
from memlab.techniques.core.registry import built_settings
from memlab.techniques.offload import NO_OFFLOAD
from memlab.trainer.entry import LiveTarget, live_target, noted, trainer_state
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
    card = gpu_kind(gpu) if gpu is not None else None  # the one place fit resolves the GPU's name
    if is_trainer(model) or batch is None:
        # A trainer: its model, its compute_loss, its effective batch and (without a batch) its dataset's worst one.
        target = live_target(model, batch, options.get("loss_fn"), rows=batch_size, generation=True)
        options["loss_fn"] = target.loss_fn
        searched = _trainer_space(model, target, space, dry_run)
        kind, held = _trainer_dry_runs(model, target)
        report = _fit_module(FitRequest(target.model, target.batch, batch_size or target.batch_size, searched, dry_run,
                                        estimates, max_trials, False, RunOptions.from_keywords(options), kind, held,
                                        card, target.plan))
        return dataclasses.replace(report, trials=noted(report.trials, target.note))
    if space is not None and isinstance(space, Mapping) and trainer_of(options.get("loss_fn")) is None:
        # A built trainer's own setting (precompute_ref, the vLLM engine's) on a model: refused before any trial.
        refusal = trainer_levers_refusal(space, f"fit was given a {type(model).__name__}",
                                         "pass the trainer as the model, memlab.fit(trainer, space={{'{name}': ...}})")
        if refusal:
            raise MemlabError(refusal)
    return _fit_module(FitRequest(model, batch, batch_size, space, dry_run, estimates, max_trials, True,
                                  RunOptions.from_keywords(options), gpu=card))


def _trainer_space(trainer: Any, target: LiveTarget, space: Mapping[str, Sequence[Any]] | None,
                   dry_run: bool) -> dict[str, Sequence[Any]]:
    """What fit searches on a trainer: no optimizer offload unless asked, its kind's own levers, then a peft
    model's adapters kept, then the user's ``space``; refused where it checkpoints some blocks.

    A live trainer cannot switch to DeepSpeed, which optimizer offload needs (memlab.apply refuses it): it is
    searched only where the space asks for it (to export with plan.to_deepspeed()). What a built trainer cannot
    change (a DPOTrainer's precompute_ref: the lever's refuses_change, apply refuses it) is searched in dry runs only,
    and where the trainer sets it itself, kept as it is. The Trainer's checkpointing switch covers every block or
    none: some blocks (checkpointing=k) would be a plan neither memlab.apply(trainer, ...) nor
    to_training_arguments() could carry, so none is searched."""
    declared = kind_of(trainer)
    carried = carried_space(target.model, target.plan) if target.plan is not None else {}
    built = built_settings()
    levers = {name: values for name, values in declared.levers.items() if dry_run or name not in built}
    own = {name: [getattr(target.plan, name)] for name in levers
           if name in built and target.plan is not None and getattr(target.plan, name, None) is not None}
    searched: dict[str, Sequence[Any]] = {"offload": [NO_OFFLOAD], **levers, **own, **carried, **(space or {})}
    refuse_selective_for_trainer(searched)
    return searched


def _trainer_dry_runs(trainer: Any, target: LiveTarget) -> tuple[LiveTarget | None, Callable[[Trial], Trial] | None]:
    """A trainer's ``kind`` and ``held`` (:class:`~memlab.search.fitting.request.FitRequest`): a trainer kind with
    its own step (GRPO's generates first) brings its runner and its dry run; else the model's own dry runs count a
    reference model the trainer holds apart (a DPOTrainer's), as estimate does."""
    kind = target if target.runner is not None else None
    fit_dry_runs = kind_of(trainer).fit_dry_runs
    if kind is not None and fit_dry_runs is not None:
        kind = fit_dry_runs(kind, trainer, target.loss_fn)
    held = None if kind is not None else lambda trial: with_reference(trial, trainer)
    return kind, held


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


def _fit_module(request: FitRequest) -> Report:
    """The request's search, its steps in turn (:mod:`memlab.search.fitting`): the request checked, its space, then
    the dry runs alone (``request.dry_run``) or the measured search. The allocator this process runs
    (``PYTORCH_CUDA_ALLOC_CONF``) is assumed by every dry run it makes: on CUDA, their card figures are those of this
    process's allocator; a trainer's step (behind the loss, or its own batch) reads its own accelerate state
    (:func:`memlab.trainer.entry.trainer_state`)."""
    loss_fn = request.options.loss_fn
    with assumed_allocator(expandable_segments_configured()), trainer_state(request.model, request.batch, loss_fn):
        request = request.checked()
        space = fit_space(request)
        return dry_run_search(request, space) if request.dry_run else measured_search(request, space)
