"""A model's structure, captured and put back exactly, and its parameters counted once.

:class:`ModuleStructure` is the instance state of every module and parameter, captured generally (every attribute,
whatever its name, and the contents of every dict, set and list it holds: hooks, the parameter/buffer/submodule
registries, flags a library sets lazily), plus the instance state of the plain objects modules hold (a transformers
config, say). Cheap: shallow copies, no tensor data. The values a trial changes are
:class:`memlab.live.module_state.ModelValues`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

__all__ = ["ModuleStructure", "trainable_parameters", "unique_parameters"]

_MISSING = object()
# Tensor hooks that live on the C side of a tensor (not in its __dict__), so they are captured by name.
_TENSOR_HOOK_ATTRIBUTES = ("_backward_hooks", "_post_accumulate_grad_hooks")
_PLAIN = (bool, int, float, complex, str, bytes, type(None))


def _is_plain_object(value: Any) -> bool:
    """An object whose own attributes a trial might change (a config), as opposed to modules, tensors, containers,
    functions, classes and simple values, which are captured by identity or by their contents."""
    return (
        hasattr(value, "__dict__")
        and not isinstance(value, (nn.Module, torch.Tensor, type, *_PLAIN))
        and not callable(value)
    )


@dataclass
class _InstanceState:
    """One object's ``__dict__`` (entries by identity) and the contents of the containers it holds."""

    owner: Any
    attributes: dict[str, Any]
    contents: dict[str, Any]

    @classmethod
    def capture(cls, owner: Any) -> _InstanceState:
        attributes = dict(vars(owner))
        contents: dict[str, Any] = {}
        for name, value in attributes.items():
            if isinstance(value, dict):
                contents[name] = dict(value)
            elif isinstance(value, (set, list)):
                contents[name] = type(value)(value)
        return cls(owner, attributes, contents)

    def restore(self) -> None:
        current = vars(self.owner)
        for name in [name for name in current if name not in self.attributes]:
            del current[name]
        for name, value in self.attributes.items():
            if current.get(name, _MISSING) is not value:
                current[name] = value
        for name, saved in self.contents.items():
            container = self.attributes[name]
            # In place, so that whoever holds the container (a RemovableHandle holds its hook dict) still sees it.
            if isinstance(container, dict):
                if container.keys() != saved.keys() or any(container[k] is not v for k, v in saved.items()):
                    container.clear()
                    container.update(saved)
            elif isinstance(container, set):
                if len(container) != len(saved) or any(item not in container for item in saved):
                    container.clear()
                    container.update(saved)
            elif len(container) != len(saved) or any(a is not b for a, b in zip(container, saved, strict=True)):
                container[:] = saved  # compared by identity: == on tensors would not give a bool


@dataclass
class ModuleStructure:
    """The instance state of every module, parameter and plain object the modules hold, and ``requires_grad``.

    Restoring removes what was added, puts back what was changed or removed (the same objects), and refills
    containers in place; so hooks, flags and attributes that any library sets during a trial, whatever their
    names, are gone afterwards.

    Example:
        >>> model = nn.Sequential(nn.Linear(2, 2))
        >>> before = ModuleStructure.capture(model)
        >>> model[0].lazily_set_flag = True
        >>> handle = model.register_forward_hook(lambda module, args, output: None)
        >>> before.restore()
        >>> hasattr(model[0], "lazily_set_flag"), len(model._forward_hooks)
        (False, 0)
    """

    states: list[_InstanceState] = field(default_factory=list)
    requires_grad: list[tuple[nn.Parameter, bool]] = field(default_factory=list)
    tensor_hooks: list[tuple[nn.Parameter, str, Any]] = field(default_factory=list)

    @classmethod
    def capture(cls, model: nn.Module) -> ModuleStructure:
        state = cls()
        seen: set[int] = set()
        for module in model.modules():
            state.states.append(_InstanceState.capture(module))
            for value in vars(module).values():
                if _is_plain_object(value) and id(value) not in seen:
                    seen.add(id(value))
                    state.states.append(_InstanceState.capture(value))
        for parameter in unique_parameters(model):
            state.states.append(_InstanceState.capture(parameter))
            state.requires_grad.append((parameter, parameter.requires_grad))
            for name in _TENSOR_HOOK_ATTRIBUTES:
                hooks = getattr(parameter, name, None)
                state.tensor_hooks.append((parameter, name, None if hooks is None else dict(hooks)))
        return state

    def restore(self) -> None:
        for instance in self.states:
            instance.restore()
        for parameter, requires_grad in self.requires_grad:
            parameter.requires_grad_(requires_grad)
        for parameter, name, saved in self.tensor_hooks:
            current = getattr(parameter, name, None)
            if saved is None:
                if current:
                    setattr(parameter, name, None)
            elif current is not None:
                current.clear()
                current.update(saved)


def unique_parameters(model: nn.Module) -> list[nn.Parameter]:
    """Every parameter once (tied weights appear once).

    Example:
        >>> layer = nn.Linear(2, 2)
        >>> len(unique_parameters(nn.Sequential(layer, layer)))
        2
    """
    return list({id(p): p for p in model.parameters()}.values())


def trainable_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The unique parameters with ``requires_grad``.

    Example:
        >>> model = nn.Linear(2, 2)
        >>> model.bias.requires_grad_(False)
        Parameter containing:
        tensor([...])
        >>> len(trainable_parameters(model))
        1
    """
    return [p for p in unique_parameters(model) if p.requires_grad]
