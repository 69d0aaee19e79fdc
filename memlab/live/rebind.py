"""A fake copy's own forwards made to call the copy, where they close over the live model's; a fake copy made
outside the step's tracking, of a model the step holds apart (a DPOTrainer's reference).

``copy.deepcopy`` copies a module's ``forward`` set as an instance attribute (``model.forward = MethodType(f, model)``)
as the same function bound to the copy, but it never looks inside the function's closure. A wrapper that kept the
model's previous forward there still calls the live model: TRL's fused LM head (``add_fused_lm_head``, which every
GRPOTrainer puts on its policy) calls its ``original_forward`` for a generation, and accelerate's mixed-precision
wrappers call the forward they wrapped. A dry run's generation then ran the live model's weights (a meta model's
could not run at all: "Can't call metadata mutating ops on non-Fake Tensor inputs"), not the fake copy's.
:func:`rebind_forwards` gives each such function a closure that names the copy's modules instead.

Example:
    >>> import copy, types
    >>> from torch import nn
    >>> live = nn.Linear(2, 2)
    >>> def wrapped(kept):  # a forward that keeps the one before it, as TRL's fused LM head does
    ...     return lambda self, x: kept(x)
    >>> live.forward = types.MethodType(wrapped(live.forward), live)
    >>> memo = {}
    >>> copied = copy.deepcopy(live, memo)
    >>> rebind_forwards(copied, memo)
    >>> copied.forward.__func__.__closure__[0].cell_contents.__self__ is copied
    True

A trainer's reference model is counted apart (:mod:`memlab.trainer.reference`), so its fake copy
(:func:`untracked_copy`) is made without an operator: nothing of it is charged to the step it runs in.
"""

from __future__ import annotations

import copy
import types
import weakref
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from memlab.live.sharding import whole_shape

__all__ = ["first_layers", "rebind_forwards", "untracked_copy"]

_COPIES: weakref.WeakKeyDictionary[Any, dict[int, nn.Module]] = weakref.WeakKeyDictionary()
"""Each fake mode's untracked copies, by the id of the model copied: one copy a dry run, whatever its calls."""

_DEPTH = 4
"""How many wrappers deep a closure is followed (a fused head inside accelerate's autocast inside fp32 outputs: 3)."""


def rebind_forwards(copied: nn.Module, memo: Mapping[int, Any]) -> None:
    """Every function or bound method set on a module of ``copied`` (a ``copy.deepcopy`` made with ``memo``) whose
    closure names a module that ``memo`` copied, replaced by the same code closing over the copy instead."""
    for module in copied.modules():
        for name, value in list(vars(module).items()):
            if isinstance(value, (types.MethodType, types.FunctionType)):
                rebound = _rebound(value, memo, _DEPTH)
                if rebound is not value:
                    vars(module)[name] = rebound


def first_layers(model: nn.Module, container: str, layers: int) -> nn.Module:
    """A copy of ``model`` (on the meta device: no data is copied) with the first ``layers`` modules of its
    ``container`` list only, its own forwards closing over the copy (:func:`rebind_forwards`); ``model`` itself
    unchanged. What a dry run of a few of a live model's repeated layers runs (:mod:`memlab.estimation.depth.carry`).

    Example:
        >>> model = nn.Sequential(nn.Linear(2, 2), nn.ModuleList(nn.Linear(2, 2) for _ in range(5)))
        >>> len(first_layers(model.to("meta"), "1", 3)[1]), len(model[1])
        (3, 5)
    """
    left_out = nn.Identity()
    listed = model.get_submodule(container)
    memo: dict[int, Any] = {id(layer): left_out for layer in list(listed.children())[layers:]}
    copied = copy.deepcopy(model, memo)
    kept = copied.get_submodule(container)
    kept._modules = {name: layer for name, layer in kept._modules.items() if layer is not left_out}
    rebind_forwards(copied, memo)
    return copied


def untracked_copy(model: nn.Module, like: torch.Tensor) -> nn.Module:
    """A fake copy of ``model`` (live weights, or on the meta device) in the fake mode of ``like`` (a fake tensor, or
    a tensor subclass wrapping one: an FSDP2 dry run's DTensor) and on its device, made without dispatching an
    operator, so that a tracker of the step does not see its weights (they are counted apart); made once per fake
    mode. The model itself is not touched.

    Example:
        >>> from torch._subclasses.fake_tensor import FakeTensorMode
        >>> like = FakeTensorMode().from_tensor(torch.zeros(1))
        >>> twin = untracked_copy(nn.Linear(2, 2, device="meta"), like)
        >>> isinstance(twin.weight.data, FakeTensor), twin.weight.device.type
        (True, 'cpu')
    """
    while not isinstance(like, FakeTensor) and is_traceable_wrapper_subclass(like):
        like = getattr(like, like.__tensor_flatten__()[0][0])  # the local tensor a DTensor wraps
    if not isinstance(like, FakeTensor):
        raise TypeError(f"untracked_copy needs a fake tensor to copy like, not a {type(like).__name__}")
    mode = like.fake_mode
    copies = _COPIES.setdefault(mode, {})
    if id(model) in copies:
        return copies[id(model)]
    memo: dict[int, Any] = {}
    for module in model.modules():
        for tensor in [*module._parameters.values(), *module._buffers.values(), *vars(module).values()]:
            if isinstance(tensor, torch.Tensor) and id(tensor) not in memo:
                shape = whole_shape(tensor)  # a ZeRO-3 partition (empty outside a gather) at its whole shape
                shell = torch.empty_strided(tensor.size(), tensor.stride(), dtype=tensor.dtype, device="meta") \
                    if shape == tuple(tensor.shape) else torch.empty(shape, dtype=tensor.dtype, device="meta")
                fake = FakeTensor(mode, shell, like.device)
                memo[id(tensor)] = nn.Parameter(fake, requires_grad=tensor.requires_grad) \
                    if isinstance(tensor, nn.Parameter) else fake
    with torch.no_grad():
        _plain_fsdp2_copies(model, memo)
        copied = copy.deepcopy(model, memo)
    rebind_forwards(copied, memo)
    _drop_engine_hooks(copied)
    copies[id(model)] = copied
    return copied


_HOOKS = ("_forward_pre_hooks", "_forward_hooks", "_backward_pre_hooks", "_backward_hooks")
_ENGINES = ("deepspeed", "torch.distributed.fsdp")
"""The modules whose hooks gather a sharded model's weights: a copy at whole shapes runs as the gathered model."""


def _plain_fsdp2_copies(model: nn.Module, memo: dict[int, Any]) -> None:
    """Copies of ``model``'s FSDP2 modules (TRL's ``prepare_fsdp`` puts ``fully_shard`` on a reference) put in
    ``memo`` as their own classes, without FSDP's state and hooks, so that ``copy.deepcopy`` takes them: FSDP2 makes
    each module it shards an instance of a subclass whose ``__deepcopy__`` raises, and its state holds the process
    group. Descendants first, so that a module's copy finds its sharded children copied."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # a torch built without distributed
        return
    for module in reversed(list(model.modules())):
        if not isinstance(module, FSDPModule):
            continue
        plain: type[nn.Module] = next(base for base in type(module).__bases__ if base is not FSDPModule)
        twin = object.__new__(plain)
        memo[id(module)] = twin
        state = {}
        for name, value in vars(module).items():
            if name.startswith("__composable_api"):  # fully_shard's state and registry (torch's contract keys)
                continue
            if name in _HOOKS:
                value = type(value)((key, hook) for key, hook in value.items() if not _engine_hook(hook))
            state[name] = value
        twin.__dict__.update(copy.deepcopy(state, memo))


def _drop_engine_hooks(model: nn.Module) -> None:
    """Take DeepSpeed's hooks off a copy: ZeRO-3 hooks every module of a model it prepared (TRL's reference under
    ``prepare_deepspeed``) to gather its partitions, which the copy's whole-shaped fake weights have not; the copy runs
    as the gathered module does. FSDP2's are left out as its modules are copied (:func:`_plain_fsdp2_copies`)."""
    for module in model.modules():
        for name in _HOOKS:
            hooks = getattr(module, name, None)
            if not hooks:
                continue
            for key, hook in list(hooks.items()):
                if _engine_hook(hook):
                    del hooks[key]


def _engine_hook(hook: Any) -> bool:
    """Whether ``hook`` is DeepSpeed's or FSDP's (:data:`_ENGINES`)."""
    function = getattr(hook, "__func__", getattr(hook, "func", hook))
    return str(getattr(function, "__module__", "") or "").startswith(_ENGINES)


def _copied(value: Any, memo: Mapping[int, Any]) -> Any:
    """The copy ``memo`` made of a module (the value itself for anything else)."""
    if isinstance(value, nn.Module):
        twin = memo.get(id(value))
        if isinstance(twin, nn.Module):
            return twin
    return value


def _rebound(value: Any, memo: Mapping[int, Any], depth: int) -> Any:
    """``value`` (a function, or a method) calling the copies of the modules it closes over; itself where it names
    none."""
    if isinstance(value, nn.Module):
        return _copied(value, memo)
    if depth == 0:
        return value
    if isinstance(value, types.MethodType):
        function = _rebound(value.__func__, memo, depth - 1)
        owner = _copied(value.__self__, memo)
        if function is value.__func__ and owner is value.__self__:
            return value
        return types.MethodType(function, owner)
    if not isinstance(value, types.FunctionType) or not value.__closure__:
        return value
    contents = []
    for cell in value.__closure__:
        try:
            contents.append(cell.cell_contents)
        except ValueError:  # an empty cell (a name assigned after the function was made)
            return value
    changed = [_rebound(item, memo, depth - 1) for item in contents]
    if all(new is old for new, old in zip(changed, contents, strict=True)):
        return value
    function = types.FunctionType(value.__code__, value.__globals__, value.__name__, value.__defaults__,
                                  tuple(types.CellType(item) for item in changed))
    function.__kwdefaults__ = value.__kwdefaults__
    function.__dict__.update(value.__dict__)  # functools.wraps' __wrapped__, __doc__ stays below
    function.__qualname__, function.__doc__, function.__module__ = value.__qualname__, value.__doc__, value.__module__
    function.__annotations__ = value.__annotations__
    return function
