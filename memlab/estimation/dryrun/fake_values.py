"""An image batch's values kept on the CPU, whatever device its fake tensors are on.

A dry run of a vision-language batch keeps the values of its tensors (:func:`memlab.estimation.dryrun.fake.fake_batch`):
image token positions, grids and padding images decide shapes. PyTorch's fake tensors keep such values as
``constant``, a real tensor on the fake tensor's own device, and compute with them for real: on a machine with a GPU,
a dry run for it would copy the batch to the GPU and run real kernels there, which a dry run never does (DESIGN.md
2.4). Here a fake tensor on any device keeps its values on the CPU (:func:`placed`), and an operator on such values
is computed on the CPU, its results placed on the device the operator's fake rule gives (:func:`constant_step`).
Where the fake tensors are on the CPU, nothing here runs: PyTorch's own constant propagation does the same there.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.utils._mode_utils import no_dispatch
from torch.utils._pytree import tree_flatten, tree_leaves, tree_map_only, tree_unflatten

_CPU = torch.device("cpu")


def placed(mode: FakeTensorMode, values: torch.Tensor, device: torch.device) -> FakeTensor:
    """A fake tensor of ``mode`` on ``device`` whose constant is ``values``, a real CPU tensor (the same fake
    tensor for the same ``values``: an in-place operator's result is its input).

    Example:
        >>> mode = FakeTensorMode()
        >>> fake = placed(mode, torch.arange(3), torch.device("cuda", 0))
        >>> fake.device, fake.constant.device, fake.constant.tolist()
        (device(type='cuda', index=0), device(type='cpu'), [0, 1, 2])
    """
    converter = mode.fake_tensor_converter
    if device == values.device:
        return converter.from_real_tensor(mode, values, make_constant=True)
    known = converter._get_memo(values)
    if known is not None:
        return known
    with no_dispatch():
        meta = torch.empty_strided(values.size(), values.stride(), dtype=values.dtype, device="meta")
    fake = FakeTensor(mode, meta, device, constant=values)
    converter.set_tensor_memo(values, fake)
    converter.add_constant_storage_mapping(fake)
    return fake


def on_cpu(func: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
    """``func`` run for real on the CPU, whatever device its ``device`` argument names."""
    if kwargs.get("device") is not None:
        kwargs = {**kwargs, "device": _CPU}
    with no_dispatch():
        return func(*args, **kwargs)


def constant_step(
    mode: FakeTensorMode, func: Any, args: Sequence[Any], kwargs: Mapping[str, Any], fake_rule: Callable[[], Any]
) -> Any:
    """``func`` on fake tensors whose values are all known, at least one of them kept on the CPU for another
    device (or moved to a device other than the CPU): computed on the CPU, its results fake tensors on the device
    the operator gives, with these values; NotImplemented where this does not apply (PyTorch's own rules then run).
    ``fake_rule`` runs the operator's fake rule: views and in-place results come from it (they share their input's
    storage, as on the device), their values attached.
    """
    first = args[0] if args else None
    if isinstance(first, FakeTensor) and first.constant is None:
        return NotImplemented  # most operators of a step: on activations, whose values no one knows
    flat, spec = tree_flatten((args, kwargs))
    fakes = [arg for arg in flat if isinstance(arg, FakeTensor)]
    if not fakes or not all(fake.fake_mode is mode and fake.constant is not None for fake in fakes):
        return NotImplemented
    device = kwargs.get("device")
    moved = isinstance(device, torch.device) and device.type != "cpu"
    if not moved and all(fake.constant is not None and fake.constant.device == fake.device for fake in fakes):
        return NotImplemented
    if (not isinstance(func, torch._ops.OpOverload) or torch.Tag.nondeterministic_seeded in func.tags
            or (torch.Tag.inplace_view in func.tags and func is not torch.ops.aten.detach_.default)):
        return NotImplemented
    if device is None:
        device = FakeTensor._find_common_device(func, flat)[0]
    values_args, values_kwargs = tree_unflatten([a.constant if isinstance(a, FakeTensor) else a for a in flat], spec)
    out = on_cpu(func, values_args, values_kwargs)
    results = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
    if not results:
        return out  # a Python value (item(), equal...)
    kept = all(mode.may_turn_const(t) for t in results)
    if kept and not any(result.alias_info is not None for result in func._schema.returns):
        return tree_map_only(torch.Tensor, lambda values: placed(mode, values, device), out)
    constants = [(fake, fake.constant) for fake in fakes]
    for fake in fakes:
        fake.constant = None
    try:
        made = fake_rule()
    finally:
        for fake, constant in constants:
            fake.constant = constant
    if not kept:  # as PyTorch's rule: inputs whose values the results share (written in place) lose them
        for values in results:
            mode.fake_tensor_converter.invalidate_constant_aliases(values)
    for fake, values in zip(tree_leaves(made), tree_leaves(out), strict=False):
        if isinstance(fake, FakeTensor) and isinstance(values, torch.Tensor):
            fake.constant = values if kept and fake.shape == values.shape else None
    return made
