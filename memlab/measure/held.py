"""Memory the process already holds before a trial: what a trial's peak must include and the report names.

On CPU, one scan of live objects finds the tensors that are neither the model's nor the batch's (the user's old
optimizer state, gradients, other variables): a device would have to hold them too, so they count under
"other". CUDA reads the same from its allocator instead (:class:`memlab.measure.probes.CudaProbe`).
"""

from __future__ import annotations

import gc
import warnings
import weakref
from collections.abc import Sequence

import torch
from torch._subclasses.fake_tensor import is_fake

__all__ = ["cpu_tensors_held", "unique_storage_bytes"]


def cpu_tensors_held(own: Sequence[torch.Tensor], grads: Sequence[torch.Tensor | None] = ()) -> list[torch.Tensor]:
    """Every live CPU tensor other than ``own`` (by identity), plus ``grads``: one scan of the garbage collector's
    objects, so call it once per session, not per trial.

    Example:
        >>> mine = torch.ones(3)
        >>> other = torch.zeros(5)
        >>> held = cpu_tensors_held([mine])
        >>> any(t is other for t in held), any(t is mine for t in held)
        (True, False)
    """
    skip = {id(t) for t in own}
    gc.collect()
    with warnings.catch_warnings():  # isinstance() on some deprecated torch proxies warns
        warnings.simplefilter("ignore")
        objects = gc.get_objects()
        # A weak proxy of a tensor passes isinstance() and may die before it is read: only tensors themselves.
        tensors = [obj for obj in objects if not isinstance(obj, weakref.ProxyTypes) and isinstance(obj, torch.Tensor)]
    del objects
    held = [
        tensor
        for tensor in tensors
        if id(tensor) not in skip and tensor.device.type == "cpu" and not tensor.is_sparse and not is_fake(tensor)
    ]
    seen = {id(t) for t in held}
    held += [grad for grad in grads if grad is not None and id(grad) not in seen]
    return held


def unique_storage_bytes(tensors: Sequence[torch.Tensor], exclude: Sequence[torch.Tensor] = ()) -> int:
    """Bytes of the distinct storages behind ``tensors``, leaving out storages that ``exclude`` uses.

    Example:
        >>> base = torch.zeros(4)
        >>> unique_storage_bytes([base, base[:2], torch.zeros(2)])
        24
    """
    excluded = {t.untyped_storage().data_ptr() for t in exclude}
    sizes: dict[int, int] = {}
    for tensor in tensors:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in excluded:
            sizes[storage.data_ptr()] = storage.nbytes()
    return sum(sizes.values())
