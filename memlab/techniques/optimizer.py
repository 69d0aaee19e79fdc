"""The optimizer of a plan: torch AdamW or bitsandbytes' 8-bit AdamW, over the trainable parameters only."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from memlab.errors import MemlabError
from memlab.plan import Plan


def build_optimizer(
    parameters: Sequence[nn.Parameter], plan: Plan, lr: float, *, device_type: str | None = None
) -> torch.optim.Optimizer:
    """A fresh optimizer of the plan's kind for ``parameters``, with the defaults torch takes on ``device_type``
    (default: the parameters' device): on CUDA, AdamW's foreach update, whose temporaries are part of the peak.

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

        optimizer = bitsandbytes.optim.AdamW8bit(parameters, lr=lr)
        optimizer.mng = _own_override_manager(optimizer, parameters)
        return optimizer
    device_type = device_type or parameters[0].device.type
    # torch picks foreach by itself on real CUDA tensors; a dry run for CUDA on CPU kernels must ask for it.
    return torch.optim.AdamW(parameters, lr=lr, foreach=True if device_type == "cuda" else None)


def _own_override_manager(optimizer: torch.optim.Optimizer, parameters: Sequence[nn.Parameter]) -> Any:
    """A bitsandbytes override manager holding only the overrides that name these parameters.

    bitsandbytes keeps overrides on a process-wide singleton, keyed partly by (group, position) and never cleared:
    after the Trainer has registered 32-bit embeddings for one model, every later 8-bit optimizer would keep
    32-bit state at those positions. A private copy keeps what the user set for these parameters and nothing else.
    """
    from bitsandbytes.optim import GlobalOptimManager

    shared = GlobalOptimManager.get_instance()
    own = GlobalOptimManager.__new__(GlobalOptimManager)
    own.initialize()
    ours = {id(p) for p in parameters}
    own.module_weight_config_triple = [
        (module, name, config)
        for module, name, config in shared.module_weight_config_triple
        if id(getattr(module, name, None)) in ours
    ]
    own.pid2config = {key: config for key, config in shared.pid2config.items() if key in ours}
    own.uses_config_override = bool(own.pid2config or own.module_weight_config_triple)
    for group_index, group in enumerate(optimizer.param_groups):
        for position, parameter in enumerate(group["params"]):
            if id(parameter) in own.pid2config:
                own.index2config[(group_index, position)] = own.pid2config[id(parameter)]
    return own


def state_tensors(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """Every tensor the optimizer keeps as state (moments, quantization maps, step counters)."""
    target = getattr(optimizer, "inner", optimizer)
    return [value for state in target.state.values() for value in state.values() if isinstance(value, torch.Tensor)]
