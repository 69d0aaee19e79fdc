"""The training workload: a :class:`~memlab.plan.Plan` put on the model as a
:class:`~memlab.runner.step.TrainingStep`, one optimizer step per step, and its trial in samples and tokens per
second. Everything else a trial does is the runner's (:class:`~memlab.runner.core.Runner`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import nn

from memlab.errors import MemlabError
from memlab.live.batch import count_tokens, is_atomic, resolve_loss_fn
from memlab.live.inputs import check_target
from memlab.live.structure import trainable_parameters, unique_parameters
from memlab.measure.tracker import MemoryTracker
from memlab.plan import Plan
from memlab.report import Trial
from memlab.runner.step import TrainingStep
from memlab.runner.workload import Attempt, RunContext, StepKind, TrialRecord, Workload
from memlab.techniques.accumulation import check_split, micro_batches
from memlab.techniques.core.registry import step_refusal, step_techniques
from memlab.techniques.optimizer import state_tensors
from memlab.techniques.weights import model_weights

__all__ = ["TrainingAttempt", "TrainingRecord", "TrainingWorkload", "check_plans", "finite_loss"]


class TrainingRecord(TrialRecord):
    """A training trial's record: what every trial records, and the form of the weights that trained."""

    def __init__(self, plan: Plan, held_before_bytes: int) -> None:
        super().__init__(plan, held_before_bytes)
        self.model_weights: str | None = None


class TrainingAttempt(Attempt):
    """A plan on the model as a :class:`~memlab.runner.step.TrainingStep`: one step is one optimizer step on the
    batch.

    Example:
        >>> model = nn.Linear(4, 1)
        >>> attempt = TrainingAttempt(TrainingStep(model, Plan(), loss_fn=lambda m, b: m(b).mean()), torch.randn(2, 4))
        >>> isinstance(attempt.step(None, "timed"), float), attempt.steady()
        (True, True)
        >>> attempt.take_off()
    """

    def __init__(self, step: TrainingStep, batch: Any) -> None:
        self.training_step = step
        self.batch = batch

    def step(self, tracker: MemoryTracker | None, kind: StepKind) -> float:
        if tracker is None:
            return finite_loss(self.training_step(self.batch))
        return finite_loss(self.training_step(self.batch, tracker))

    def baseline(self) -> dict[str, list[torch.Tensor | None]]:
        model = self.training_step.model
        return {
            "params": [*unique_parameters(model), *model.buffers()],
            "optimizer": list(state_tensors(self.training_step.optimizer)),
        }

    @property
    def compiles(self) -> bool:
        return self.training_step.parts.compiled

    def steady(self) -> bool:
        # Until the optimizer state exists (fp16's GradScaler may skip the first steps), a step is not steady.
        return bool(state_tensors(self.training_step.optimizer))

    def host_bytes(self) -> int:
        return self.training_step.parts.host.peak

    def take_off(self) -> None:
        self.training_step.close()
        self.training_step.optimizer.zero_grad(set_to_none=True)


class TrainingWorkload(Workload[Plan, TrainingRecord, Trial]):
    """Training plans: the model's trainable weights train with the plan's optimizer and ``loss_fn``.

    Example:
        >>> from memlab.measure.probes import probe_for
        >>> from memlab.options import RunOptions
        >>> model = nn.Linear(4, 1)
        >>> context = RunContext(model, torch.randn(2, 4), RunOptions(loss_fn=lambda m, b: m(b).mean()),
        ...                      probe_for(model), rows=2)
        >>> TrainingWorkload(context).copies_parameters(Plan()), TrainingWorkload.check_plans(Plan()) == [Plan()]
        (True, True)
    """

    def __init__(self, context: RunContext) -> None:
        super().__init__(context)
        self.loss_fn = resolve_loss_fn(context.batch, context.options.loss_fn)
        if context.options.loss_fn is None:  # the model's own loss: an encoder-decoder's needs the target
            check_target(context.model, context.batch)
        # Cutting the batch once here turns a batch that cannot be sliced into one clear error, before any trial
        # (an atomic batch is never cut: its plans are checked one by one).
        if not is_atomic(context.batch):
            micro_batches(context.batch, Plan(micro_batch=1))

    @classmethod
    def check_model(cls, model: nn.Module) -> None:
        if not trainable_parameters(model):
            raise MemlabError("the model has no trainable parameters; set requires_grad=True on what should train")

    @classmethod
    def check_plans(cls, plans: Any) -> list[Plan]:
        return check_plans(plans)

    def check(self, plan: Plan) -> None:
        refusal = step_refusal(plan, self.loss_fn)  # each lever's own (offload="params", a vLLM engine, ...)
        if refusal:
            raise MemlabError(refusal)
        check_split(self.context.batch, plan)

    def copies_parameters(self, plan: Plan) -> bool:
        return all(technique.trains_model_weights(self.context.model, plan) for technique in step_techniques())

    def new_record(self, plan: Plan, held_before_bytes: int) -> TrainingRecord:
        return TrainingRecord(plan, held_before_bytes)

    def put_on(self, plan: Plan, record: TrainingRecord) -> TrainingAttempt:
        context = self.context
        step = TrainingStep(
            context.model, plan, loss_fn=self.loss_fn, lr=context.options.lr,
            optimizer_device_type=context.probe.optimizer_device_type,
        )
        record.notes.extend(step.notes)
        step.parts.late_notes = record.notes
        record.model_weights = model_weights(plan, step.parameters)
        return TrainingAttempt(step, context.batch)

    def to_trial(self, record: TrainingRecord, *, budget: int | None, rss_bytes: int | None) -> Trial:
        plan: Plan = record.plan
        rows = plan.rows_per_step(self.context.rows)
        tokens = self._tokens_per_step(plan)
        step_time = record.step_time
        return Trial(
            **record.trial_fields(device=self.context.device, budget=budget, rss_bytes=rss_bytes),
            samples_per_s=rows / step_time if step_time else None,
            tokens_per_s=tokens / step_time if step_time and tokens else None,
            rows_per_step=rows,
            model_weights=record.model_weights,
        )

    def _tokens_per_step(self, plan: Plan) -> int | None:
        counts = [count_tokens(part) for part in micro_batches(self.context.batch, plan)]
        if any(count is None for count in counts):
            return None
        return sum(c for c in counts if c is not None)


def check_plans(plans: Sequence[Plan] | Plan) -> list[Plan]:
    """The plans as a non-empty list of Plan; a clear error for anything else.

    Example:
        >>> check_plans(Plan()) == [Plan()]
        True
    """
    if isinstance(plans, Plan):
        return [plans]
    if isinstance(plans, str):
        raise MemlabError(
            f"plans={plans!r} is text; pass a list of memlab.Plan, or memlab.plan.parse_grid({plans!r}) for a grid"
        )
    if plans is None or not isinstance(plans, Iterable):
        raise MemlabError(
            f"plans={plans!r} is not a list of plans; pass e.g. [memlab.Plan(), memlab.Plan(checkpointing=True)]"
        )
    plans = list(plans)
    if not plans:
        raise MemlabError("no plans to compare; pass a list such as [memlab.Plan(), memlab.Plan(checkpointing=True)]")
    for plan in plans:
        if not isinstance(plan, Plan):
            raise MemlabError(f"{plan!r} is not a memlab.Plan; write memlab.Plan(...) for each setting")
    return plans


def finite_loss(loss: float) -> float:
    """The loss itself; an error when it is NaN or infinite (such a step trains nothing, so it is no result).

    Example:
        >>> finite_loss(0.5)
        0.5
    """
    if not math.isfinite(loss):
        raise MemlabError(f"the loss is {loss}: the step trains nothing; check the data, the lr, or fp16 overflow")
    return loss

