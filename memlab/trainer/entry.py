"""The entry points' one question: is the live object a model and a batch, or a trainer?

``memlab.measure``, ``compare``, ``fit``, ``estimate`` and ``apply`` ask it once, here, before anything runs: a
``transformers.Trainer`` (TRL's included) gives its model, its loss (``compute_loss``), its settings as a plan, its
effective batch and, when no batch is given, the costliest batch of its train dataset (:func:`worst_batch`).

Example:
    >>> import torch
    >>> target = live_target(torch.nn.Linear(2, 1), torch.randn(4, 2))
    >>> target.source is None, target.note
    (True, None)
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any, cast

from memlab.errors import MemlabError
from memlab.export.trainer_arguments import check_single_process
from memlab.live.batch import trainer_of
from memlab.live.trainer_kinds import OwnBatch, kind_of
from memlab.plan import Plan
from memlab.trainer.apply import accelerate_state_of
from memlab.trainer.source import TrainerSource, is_trainer, keeps_trainer_batch
from memlab.trainer.worst_batch import trainer_batches, worst_batch

__all__ = ["LiveTarget", "live_target", "noted", "split_plans", "trainer_state"]


@dataclasses.dataclass(frozen=True)
class LiveTarget:
    """What a run measures: the model, the batch, the loss; for a trainer, its :class:`TrainerSource`, its current
    settings as a ``plan``, its effective batch (``batch_size``) and a ``note`` saying which examples the batch
    holds (each None for a plain model)."""

    model: Any
    batch: Any
    loss_fn: Any
    source: TrainerSource | None = None
    note: str | None = None
    plan: Plan | None = None
    batch_size: int | None = None
    runner: Any = None
    """The runner a trainer kind's step needs (a GRPO trainer's generates first); None: the plans' own."""
    estimate: Any = None
    """``estimate(plans, budget=..., device=..., lr=..., gpu=None) -> trials``: the dry run a trainer kind's step
    needs (a GRPO trainer's generates first), for ``fit``'s pruning; None: the model's own dry run on the batch."""
    suggest: Any = None
    """``suggest(plan, budget=..., device=..., lr=..., gpu=None) -> (trials, sentence)``: where nothing in ``fit``'s
    space fits (measured, or in a dry run for the GPU kind ``gpu``),
    a trainer kind's own suggestions (a GRPOTrainer's config changes: :mod:`memlab.kinds.grpo.suggest`)."""

    def plan_for(self, plan: Any) -> Any:
        """The plan a run on this target measures: ``None`` on a trainer is the trainer as set up; a ``Plan``
        that leaves the batch open keeps the trainer's effective batch (``Plan()``: all of it in one micro-batch,
        as on every object: :func:`~memlab.trainer.source.keeps_trainer_batch`); anything else as it is.

        Example:
            >>> import torch
            >>> live_target(torch.nn.Linear(2, 1), torch.randn(4, 2)).plan_for(Plan()) == Plan()
            True
        """
        if self.source is None:
            return plan
        if plan is None:
            return self.plan
        return keeps_trainer_batch(plan, self.source.trainer.args) if isinstance(plan, Plan) else plan


def live_target(
    model_or_trainer: Any, batch: Any, loss_fn: Any = None, *, rows: int | None = None, generation: bool = False,
    sharded: bool = False,
) -> LiveTarget:
    """The model, batch and loss a run measures. For a trainer without a batch: its train dataset's examples as
    :class:`~memlab.live.batch.StepBatches` (each plan's micro-batches collated by the trainer, the worst first),
    said in ``note``; its ``compute_loss`` unless ``loss_fn`` is given (``rows`` is kept for callers: every plan
    gets the examples it needs). Nothing on the trainer changes. A trainer set up for DeepSpeed or FSDP is refused
    (its step would run here in one process) unless ``sharded``: the caller estimates it per GPU. The trainer's kind
    (:func:`memlab.live.trainer_kinds.kind_of`) decides what differs: its own batch (``make_batch``), and with
    ``generation=True`` (``measure``, ``compare``, ``fit``) its own step (``target``: TRL's GRPOTrainer generates first,
    :func:`memlab.live.trainer_kinds.TrainerKind.target`); the entry points that do not run that step leave it out,
    and the trainer is refused with what works.

    Example:
        >>> live_target(object(), None)
        Traceback (most recent call last):
        ...
        memlab.errors.MemlabError: no batch was given; pass one (a dict of tensors, a tensor or a tuple), or pass \
a transformers Trainer, whose train dataset memlab reads
    """
    if not is_trainer(model_or_trainer):
        if generation and isinstance(batch, OwnBatch):  # a kind's own batch carries its trainer (GRPO's prompts)
            trainer = batch.trainer
            own_step = kind_of(trainer).target
            assert own_step is not None  # a kind that makes its own batch declares its step
            return cast(LiveTarget, own_step(trainer, loss_fn))
        if batch is None:
            raise MemlabError(
                "no batch was given; pass one (a dict of tensors, a tensor or a tuple), or pass a transformers "
                "Trainer, whose train dataset memlab reads"
            )
        return LiveTarget(model_or_trainer, batch, loss_fn)
    kind = kind_of(model_or_trainer)  # a trainer of no kind memlab takes is refused here, before it is read
    if generation and kind.target is not None:  # a step of its own (GRPO's generates first), its batch its own
        if batch is not None:
            raise MemlabError(
                f"a {kind.name}'s batch is what its step makes ({kind.batch}); leave the batch out: "
                "memlab.measure(trainer) or memlab.measure(trainer, memlab.Plan(...))"
            )
        return cast(LiveTarget, kind.target(model_or_trainer, loss_fn))
    if not sharded:  # a run of its step in this one process; an estimate per GPU takes DeepSpeed and FSDP
        check_single_process(model_or_trainer.args)
    source = TrainerSource.from_trainer(model_or_trainer)
    note = None
    if batch is None and kind.make_batch is not None:
        batch = kind.make_batch(model_or_trainer)
        note = f"the step runs on a {kind.name}'s batch: {kind.batch}"
    elif batch is None:
        # The trainer's batch is atomic: each plan's micro-batches are collated by its collator from the
        # costliest examples (a packed or padding-free row stays whole), the worst micro-batch first.
        worst = worst_batch(model_or_trainer)
        batch = trainer_batches(model_or_trainer)
        note = (f"the step runs on the train dataset's worst batch: {worst.describe()}; each micro-batch collated "
                "by the trainer from the costliest examples")
    notes = [note] if note else []
    if source.loss_note:
        notes.append(source.loss_note)
    note = "; ".join(notes) or None
    chosen_loss = loss_fn if loss_fn is not None else source.loss_fn
    return LiveTarget(source.model, batch, chosen_loss, source, note, source.plan, source.effective_batch)


@contextlib.contextmanager
def trainer_state(model_or_trainer: Any, batch: Any = None, loss_fn: Any = None) -> Iterator[None]:
    """Within it, the trainer a run is on (given in the model's place, or behind its loss or its own batch, as
    :func:`live_target` hands them to the panel and the magic) reads its own accelerate state: where a
    ``TrainingArguments`` made since the trainer was built emptied it, the state is the trainer's for the run and
    put back after (:func:`memlab.trainer.apply.accelerate_state_of`). Nothing happens for a model.

    Example:
        >>> import torch
        >>> with trainer_state(torch.nn.Linear(2, 1), torch.randn(4, 2)):
        ...     pass
    """
    trainer = model_or_trainer if is_trainer(model_or_trainer) else trainer_of(loss_fn)
    if trainer is None and isinstance(batch, OwnBatch):
        trainer = batch.trainer
    if trainer is None:
        yield
        return
    with accelerate_state_of(trainer):
        yield


def split_plans(batch: Any, plans: Any) -> tuple[Any, Any]:
    """``(batch, plans)`` for a call that left the batch out: ``memlab.compare(trainer, [plans])`` reads as
    ``compare(trainer, None, [plans])``, ``measure(trainer, plan)`` as ``measure(trainer, None, plan)``.

    Example:
        >>> batch, plans = split_plans([Plan()], None)
        >>> batch is None, len(plans)
        (True, 1)
    """
    looks_like_plans = _is_plan(batch) or (
        isinstance(batch, Sequence) and bool(batch) and all(_is_plan(plan) for plan in batch)
    )
    if plans is None and looks_like_plans:
        return None, batch
    return batch, plans


def _is_plan(value: Any) -> bool:
    # By name: memlab.inference imports the core, and the core must not import it back.
    return type(value).__name__ in ("Plan", "InferencePlan")


def noted(trials: Sequence[Any], note: str | None) -> list[Any]:
    """The trials with ``note`` added to each one's notes (unchanged when there is no note).

    Example:
        >>> from memlab.report import Trial
        >>> trial = Trial(Plan(), "ok", 1, {}, None, None, None, "cpu")
        >>> noted([trial], "worst batch")[0].notes
        ('worst batch',)
    """
    if not note:
        return list(trials)
    return [dataclasses.replace(trial, notes=(*trial.notes, note)) for trial in trials]
