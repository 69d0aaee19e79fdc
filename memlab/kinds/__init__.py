"""The trainer kinds memlab takes, one folder a kind, listed here in one place (issue 72): transformers' Trainer
(:mod:`memlab.kinds.trainer`), TRL's SFTTrainer (:mod:`memlab.kinds.sft`), DPOTrainer (:mod:`memlab.kinds.dpo`) and
GRPOTrainer (:mod:`memlab.kinds.grpo`, with its step, dry run, suggestions and vLLM engine).

Each folder's ``__init__`` holds its kind's :class:`~memlab.live.trainer_kinds.TrainerKind`: its batch, phases,
levers, exports and the hooks that do what differs. This wing stands above the runner, the estimation and the search,
whose work its hooks call; nothing below it imports it: they ask the trainer's kind
(:func:`memlab.live.trainer_kinds.kind_of`), and the package (``memlab/__init__.py``) provides :data:`KINDS` as the
seam ``"trainer kinds"``. Nothing registers itself on import: a kind is in :data:`KINDS` or it is not one.

Example:
    >>> [kind.name for kind in KINDS]
    ['Trainer', 'SFTTrainer', 'DPOTrainer', 'GRPOTrainer']
"""

from __future__ import annotations

from memlab.kinds.dpo import DPO
from memlab.kinds.grpo import GRPO
from memlab.kinds.sft import SFT
from memlab.kinds.trainer import TRAINER
from memlab.live.trainer_kinds import TrainerKind

__all__ = ["DPO", "GRPO", "KINDS", "SFT", "TRAINER"]

KINDS: tuple[TrainerKind, ...] = (TRAINER, SFT, DPO, GRPO)
"""Every kind memlab takes, in order (the Trainer first; the most derived class a trainer is decides its kind)."""
