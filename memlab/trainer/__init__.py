"""A ``transformers.Trainer`` (TRL's trainers included) as the live object memlab measures, watches and changes.

- :mod:`memlab.trainer.source`: :func:`is_trainer`, :class:`TrainerSource` (its model, collator, loss and plan);
- :mod:`memlab.export.trainer_arguments`: :func:`plan_from_training_arguments` (``TrainingArguments`` -> ``Plan``);
- :mod:`memlab.trainer.worst_batch`: :func:`worst_batch`, the dataset's costliest micro-batch;
- :mod:`memlab.trainer.watch`: :func:`watch`, the memory of every step of ``trainer.train()``;
- :mod:`memlab.trainer.apply`: :func:`apply_to_trainer`, a plan on the trainer until ``undo()``;
- :mod:`memlab.trainer.entry`: :func:`~memlab.trainer.entry.live_target`, what an entry point runs on a trainer;
- :mod:`memlab.trainer.reference`: a reference model held beside the policy (DPO's, GRPO's), counted in an estimate;
- :mod:`memlab.trainer.meta`: :func:`~memlab.trainer.meta.trainer_on_meta`, a trainer around a model on the meta
  device (for ``memlab.estimate``), and the refusal of the entry points that would run it.

Only what every kind uses is here; each kind (its declaration, and a step of its own where it has one: GRPO's) is in
:mod:`memlab.kinds`, above this package, and this package asks a trainer's kind
(:func:`memlab.live.trainer_kinds.kind_of`) rather than importing it. transformers' Trainer, TRL and datasets are
imported only inside the functions that need them.

Example:
    >>> from memlab.trainer import is_trainer
    >>> is_trainer(object())
    False
"""

from __future__ import annotations

from memlab.export.trainer_arguments import plan_from_training_arguments
from memlab.trainer.apply import TrainerApplied, apply_to_trainer
from memlab.trainer.source import TrainerSource, is_trainer
from memlab.trainer.watch import StepRecord, Watch, watch
from memlab.trainer.worst_batch import WorstBatch, worst_batch

__all__ = [
    "StepRecord",
    "TrainerApplied",
    "TrainerSource",
    "Watch",
    "WorstBatch",
    "apply_to_trainer",
    "is_trainer",
    "plan_from_training_arguments",
    "watch",
    "worst_batch",
]
