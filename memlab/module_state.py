"""What a trial or an applied technique can change on a model, captured and put back exactly.

Two kinds of state: the structure (training flags, hooks, checkpointing attributes, ``requires_grad``), cheap to
capture, and the values (parameters, buffers, ``.grad`` fields, random-number state), which cost a copy and so are
taken once per ``compare``/``fit`` rather than once per plan.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

_MISSING = object()
# Instance attributes that checkpointing (Hugging Face's or memlab's own) sets on modules.
_PATCHED_ATTRIBUTES = (
    "forward",
    "gradient_checkpointing",
    "_gradient_checkpointing_func",
    "_require_grads_hook",
    "_require_grads_hooks",
)
_HOOK_DICTS = (
    "_forward_hooks",
    "_forward_hooks_with_kwargs",
    "_forward_hooks_always_called",
    "_forward_pre_hooks",
    "_forward_pre_hooks_with_kwargs",
    "_backward_hooks",
    "_backward_pre_hooks",
    "_state_dict_hooks",
    "_state_dict_pre_hooks",
    "_load_state_dict_pre_hooks",
    "_load_state_dict_post_hooks",
)
_TENSOR_HOOK_DICTS = ("_backward_hooks", "_post_accumulate_grad_hooks")


@dataclass
class ModuleStructure:
    """Training flags, hooks, patched attributes and ``requires_grad`` of every module and parameter."""

    training: dict[int, bool] = field(default_factory=dict)
    hooks: dict[tuple[int, str], OrderedDict[Any, Any]] = field(default_factory=dict)
    attributes: dict[tuple[int, str], Any] = field(default_factory=dict)
    requires_grad: dict[int, bool] = field(default_factory=dict)
    tensor_hooks: dict[tuple[int, str], Any] = field(default_factory=dict)
    modules: dict[int, nn.Module] = field(default_factory=dict)
    parameters: dict[int, nn.Parameter] = field(default_factory=dict)

    @classmethod
    def capture(cls, model: nn.Module) -> ModuleStructure:
        state = cls()
        for module in model.modules():
            key = id(module)
            state.modules[key] = module
            state.training[key] = module.training
            for name in _HOOK_DICTS:
                hooks = getattr(module, name, None)
                if hooks is not None:
                    state.hooks[key, name] = OrderedDict(hooks)
            for name in _PATCHED_ATTRIBUTES:
                state.attributes[key, name] = module.__dict__.get(name, _MISSING)
        for parameter in unique_parameters(model):
            key = id(parameter)
            state.parameters[key] = parameter
            state.requires_grad[key] = parameter.requires_grad
            for name in _TENSOR_HOOK_DICTS:
                hooks = getattr(parameter, name, None)
                state.tensor_hooks[key, name] = None if hooks is None else OrderedDict(hooks)
        return state

    def restore(self) -> None:
        for key, module in self.modules.items():
            module.training = self.training[key]
            for name in _HOOK_DICTS:
                hooks = getattr(module, name, None)
                if hooks is not None and (key, name) in self.hooks:
                    # In place, so the user's RemovableHandles (which hold the dict) keep working.
                    hooks.clear()
                    hooks.update(self.hooks[key, name])
            for name in _PATCHED_ATTRIBUTES:
                saved = self.attributes[key, name]
                if saved is _MISSING:
                    module.__dict__.pop(name, None)
                else:
                    module.__dict__[name] = saved
        for key, parameter in self.parameters.items():
            parameter.requires_grad_(self.requires_grad[key])
            for name in _TENSOR_HOOK_DICTS:
                saved = self.tensor_hooks[key, name]
                current = getattr(parameter, name, None)
                if saved is None:
                    if current:
                        setattr(parameter, name, None)
                elif current is not None:
                    current.clear()
                    current.update(saved)
                else:
                    setattr(parameter, name, OrderedDict(saved))


def unique_parameters(model: nn.Module) -> list[nn.Parameter]:
    """Every parameter once (tied weights appear once)."""
    return list({id(p): p for p in model.parameters()}.values())


def trainable_parameters(model: nn.Module) -> list[nn.Parameter]:
    return [p for p in unique_parameters(model) if p.requires_grad]


@dataclass
class ModelValues:
    """Parameter and buffer values, ``.grad`` fields and random-number state, to put back bit-exact.

    Copies live in CPU memory so that a snapshot never takes device memory from the trial it protects.
    """

    tensors: list[tuple[torch.Tensor, torch.Tensor]]
    slots: list[tuple[dict[str, Any], dict[str, Any]]]
    grads: list[tuple[nn.Parameter, torch.Tensor | None]]
    cpu_rng: torch.Tensor
    cuda_rng: list[torch.Tensor] | None

    @classmethod
    def capture(cls, model: nn.Module) -> ModelValues:
        seen: set[int] = set()
        tensors: list[tuple[torch.Tensor, torch.Tensor]] = []
        for tensor in [*model.parameters(), *model.buffers()]:
            if id(tensor) in seen:
                continue
            seen.add(id(tensor))
            tensors.append((tensor, _copy_to_cpu(tensor.detach())))
        # Which tensor object each module's parameter and buffer names point at: a forward that reassigns a
        # buffer (self.buf = self.buf + 1, or a fresh register_buffer) must find the original put back.
        slots = [
            (registry, dict(registry))
            for module in model.modules()
            for registry in (module._parameters, module._buffers)
        ]
        grads = [(p, p.grad) for p in unique_parameters(model)]
        cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
        return cls(tensors, slots, grads, torch.random.get_rng_state(), cuda_rng)

    def detach_grads(self) -> None:
        """Set every ``.grad`` to None for the trial; the user's gradient tensors are kept aside untouched."""
        for parameter, _ in self.grads:
            parameter.grad = None

    def restore(self) -> None:
        for registry, saved_entries in self.slots:
            if registry.keys() != saved_entries.keys() or any(registry[k] is not v for k, v in saved_entries.items()):
                registry.clear()
                registry.update(saved_entries)
        with torch.no_grad():
            for live, saved in self.tensors:
                live.copy_(saved)
        for parameter, grad in self.grads:
            parameter.grad = grad
        torch.random.set_rng_state(self.cpu_rng)
        if self.cuda_rng is not None:
            torch.cuda.set_rng_state_all(self.cuda_rng)


def _copy_to_cpu(tensor: torch.Tensor) -> torch.Tensor:
    if tensor.device.type == "cpu":
        return tensor.clone()
    return tensor.to("cpu", copy=True)
