"""TRL's DPOTrainer as a trainer kind: chosen and rejected rows batched together (two rows an example), and the
reference log-probs computed before training as a lever ``fit`` searches in its dry runs
(:mod:`memlab.techniques.precompute_ref`: a built trainer cannot change it, so ``memlab.apply`` refuses it).

Example:
    >>> DPO.rows_per_example, dict(DPO.levers)
    (2, {'precompute_ref': [None, True]})
"""

from __future__ import annotations

from memlab.kinds.dpo.cli import DPO_CLI
from memlab.live.trainer_kinds import WORST_BATCH, TrainerKind
from memlab.techniques import precompute_ref

__all__ = ["DPO"]

DPO = TrainerKind(
    "DPOTrainer", "trl.", "DPOConfig",
    batch=f"{WORST_BATCH} (chosen and rejected together, as the trainer batches them)",
    # the same reference log-probs, computed before training (memlab.techniques.precompute_ref)
    levers=precompute_ref.SEARCHED, rows_per_example=2, cli=DPO_CLI,
)
"""TRL's DPOTrainer: the Trainer's step on its collated pairs; what its reference model adds is counted beside the
policy (:func:`memlab.trainer.reference.with_reference`)."""
