"""Exports: a Plan carried to the engine that runs it (Trainer, TRL, DeepSpeed, peft, accelerate, plain PyTorch), and a
trainer's arguments read back as a Plan. The Plan's ``to_*``/``from_*`` are aliases of these functions (the seam
``"plan exports"``, :mod:`memlab.seams`): the exports build on the Plan, never the reverse.

Example:
    >>> from memlab.export import training_arguments
    >>> import memlab
    >>> training_arguments(memlab.Plan(micro_batch=2, accumulation=4))["gradient_accumulation_steps"]
    4
"""

from memlab.export.accelerate import accelerate_config
from memlab.export.engines import deepspeed_config, peft_config, pytorch_code, training_arguments
from memlab.export.trainer_arguments import (
    plan_from_trainer,
    plan_from_training_arguments,
    plan_training_arguments,
    trl_training_arguments,
)

__all__ = [
    "accelerate_config",
    "deepspeed_config",
    "peft_config",
    "plan_from_trainer",
    "plan_from_training_arguments",
    "plan_training_arguments",
    "pytorch_code",
    "training_arguments",
    "trl_training_arguments",
]
