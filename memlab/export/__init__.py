"""Exports: a Plan carried to the engine that runs it (Trainer, DeepSpeed, peft, accelerate, plain PyTorch).

Example:
    >>> from memlab.export import training_arguments
    >>> import memlab
    >>> training_arguments(memlab.Plan(micro_batch=2, accumulation=4))["gradient_accumulation_steps"]
    4
"""

from memlab.export.engines import deepspeed_config, peft_config, pytorch_code, training_arguments

__all__ = ["deepspeed_config", "peft_config", "pytorch_code", "training_arguments"]
