"""TRL's SFTTrainer as a trainer kind: the Trainer's step, its plans exported to an ``SFTConfig``.

Example:
    >>> SFT.name, SFT.config, SFT.config_module
    ('SFTTrainer', 'SFTConfig', 'trl')
"""

from __future__ import annotations

from memlab.kinds.sft.cli import SFT_CLI
from memlab.live.trainer_kinds import TrainerKind

__all__ = ["SFT"]

SFT = TrainerKind("SFTTrainer", "trl.", "SFTConfig", cli=SFT_CLI)
"""TRL's SFTTrainer: the Trainer's step on its collated batch; TRL's config keywords in its exports."""
