"""transformers' Trainer as a trainer kind: the Trainer's own step on its train dataset's worst batch, every other
kind's base.

Example:
    >>> TRAINER.name, TRAINER.config, TRAINER.phases
    ('Trainer', 'TrainingArguments', ())
"""

from __future__ import annotations

from memlab.live.trainer_kinds import TrainerKind

__all__ = ["TRAINER"]

TRAINER = TrainerKind("Trainer", "transformers.", "TrainingArguments", "transformers")
"""transformers' Trainer: its step as memlab measures any model's, on the batch its collator makes."""
