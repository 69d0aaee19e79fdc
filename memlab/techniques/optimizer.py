"""The optimizer of a plan: torch AdamW or bitsandbytes' 8-bit AdamW, over the trainable parameters only."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from memlab.errors import MemlabError
from memlab.plan import Plan


def build_optimizer(parameters: Sequence[nn.Parameter], plan: Plan, lr: float) -> torch.optim.Optimizer:
    """A fresh optimizer of the plan's kind for ``parameters``.

    Example:
        >>> layer = nn.Linear(4, 4)
        >>> type(build_optimizer(list(layer.parameters()), Plan(), lr=1e-3)).__name__
        'AdamW'
    """
    if not parameters:
        raise MemlabError("the model has no trainable parameters; set requires_grad=True on what should train")
    if plan.optimizer == "adamw8bit":
        # Imported here: bitsandbytes is heavy and prints at import; `import memlab` must not pull it in.
        import bitsandbytes

        return bitsandbytes.optim.AdamW8bit(parameters, lr=lr)
    return torch.optim.AdamW(parameters, lr=lr)


def state_tensors(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """Every tensor the optimizer keeps as state (moments, quantization maps, step counters)."""
    target = getattr(optimizer, "inner", optimizer)
    return [value for state in target.state.values() for value in state.values() if isinstance(value, torch.Tensor)]
