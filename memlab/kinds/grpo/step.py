"""A GRPO trial's step: the trainer's generation batch made first, then the training step over it (issue 59).

The training workload with one change: each step (warm-up, tracked, timed) first generates with the trainer's own
``_generate_and_score_completions`` (:meth:`memlab.kinds.grpo.source.GRPOSource.generate`: the worst prompts,
full-length completions, the reward functions, the reference and old-policy log-probs), then runs the plan's
:class:`~memlab.runner.step.TrainingStep` over one optimizer step's generations, cut into the plan's
micro-batches, with the trainer's ``compute_loss``. The timeline names ``"generation"`` (and ``"reference"``,
``"old-policy"``) before ``"forward"``, ``"backward"`` and ``"optimizer"``.

Example:
    >>> GRPORunner.workload_type is GRPOWorkload
    True
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from memlab.errors import MemlabError
from memlab.kinds.grpo.source import (
    VLLM_NOT_RUN,
    GRPOPrompts,
    GRPOSource,
    check_generations,
    prepared_forward,
    split_on,
)
from memlab.measure.tracker import MemoryTracker
from memlab.plan import Plan
from memlab.report import Trial
from memlab.runner.core import Runner
from memlab.runner.step import NO_PHASES, TrainingStep
from memlab.runner.training import TrainingAttempt, TrainingRecord, TrainingWorkload, finite_loss
from memlab.runner.workload import RunContext, StepKind
from memlab.trainer.entry import LiveTarget
from memlab.trainer.source import TrainerSource

__all__ = ["GRPOAttempt", "GRPORunner", "GRPOWorkload", "grpo_target"]


class GRPOAttempt(TrainingAttempt):
    """A plan on a GRPO trainer's policy: each step generates the batch, then trains on it."""

    def __init__(self, step: TrainingStep, source: GRPOSource, rows: int, session: contextlib.ExitStack) -> None:
        super().__init__(step, None)
        self.source = source
        self.rows = rows
        self._session = session

    def step(self, tracker: MemoryTracker | None, kind: StepKind) -> float:
        sections: Any = NO_PHASES if tracker is None else tracker
        step = self.training_step
        # The policy's and a reference model's forwards as train() runs them: accelerate prepares both (the
        # reference for evaluation), each call in the plan's autocast.
        models = [self.source.trainer.model, getattr(self.source.trainer, "ref_model", None)]
        with torch.no_grad(), contextlib.ExitStack() as prepared:
            for model in models:
                if model is not None:
                    prepared.enter_context(prepared_forward(model, step.plan, step.device))
            generated = self.source.generate(sections)
        # One optimizer step's generations (a generation batch may hold more: TRL trains on them in later steps).
        batch = {key: value[: self.rows] for key, value in generated.items()}
        del generated
        if tracker is None:
            return finite_loss(self.training_step(batch))
        return finite_loss(self.training_step(batch, tracker))

    def take_off(self) -> None:
        try:
            super().take_off()
        finally:
            self._session.close()


class GRPOWorkload(TrainingWorkload):
    """Training plans on a GRPO trainer's policy, generation in every step (the batch is
    :class:`~memlab.kinds.grpo.source.GRPOPrompts`, which carries the trainer)."""

    def __init__(self, context: RunContext) -> None:
        super().__init__(context)
        if not isinstance(context.batch, GRPOPrompts):
            raise TypeError("a GRPO workload runs on GRPOPrompts (memlab.kinds.grpo.step.grpo_target makes them)")
        self.source: GRPOSource = context.batch.source
        if getattr(self.source.trainer, "use_vllm", False):  # a dry run takes it; a live trial would run vLLM
            raise MemlabError(VLLM_NOT_RUN)

    def check(self, plan: Plan) -> None:
        super().check(plan)
        check_generations(plan, self.source)

    def put_on(self, plan: Plan, record: TrainingRecord) -> GRPOAttempt:
        context = self.context
        session = contextlib.ExitStack()
        session.enter_context(split_on(self.source.trainer, plan))  # TRL chunks its log-probs by the split
        session.enter_context(self.source.generating())
        try:
            step = TrainingStep(
                context.model, plan, loss_fn=self.loss_fn, lr=context.options.lr,
                optimizer_device_type=context.probe.optimizer_device_type,
            )
        except BaseException:
            session.close()
            raise
        record.notes.extend(step.notes)
        record.model_weights = None
        return GRPOAttempt(step, self.source, plan.rows_per_step(context.rows), session)


class GRPORunner(Runner[Plan, Trial]):
    """The runner of a GRPO trainer's plans: a reward function that raised is said as one
    :class:`~memlab.errors.MemlabError` naming it, once the trainer and model are put back."""

    workload_type = GRPOWorkload

    def run(self, plan: Plan, index: int = 0, total: int = 1, *, capped: bool = True) -> Trial:
        trial = super().run(plan, index, total, capped=capped)
        failure = getattr(self.workload, "source", None) and self.workload.source.failure  # type: ignore[attr-defined]
        if failure is not None and trial.status == "error":
            raise failure
        return trial


def grpo_target(trainer: Any, loss_fn: Any = None) -> LiveTarget:
    """What ``memlab.measure`` / ``compare`` run on a GRPOTrainer: its policy, the step's generations (made in each
    step, from the dataset's longest prompts), its ``compute_loss``, the trainer as set up, and the runner whose
    step generates first.

    Example:
        >>> grpo_target(object())
        Traceback (most recent call last):
        ...
        AttributeError: 'object' object has no attribute 'args'
    """
    source = GRPOSource.from_trainer(trainer, vllm=True)  # its runner refuses vLLM; fit's dry run takes it
    chosen = loss_fn if loss_fn is not None else source.loss_fn()
    trainer_source = TrainerSource(trainer=trainer, model=source.model, collator=trainer.data_collator,
                                   loss_fn=chosen, effective_batch=source.generations, plan=source.plan)
    return LiveTarget(source.model, source.prompts_batch(), chosen, trainer_source, source.note, source.plan,
                      source.generations, runner=GRPORunner)
