"""Which storages are host memory, whatever device a tensor says: what memlab keeps on the host (the offload's
copies, a trial's saved values) is marked here, and memlab's trackers count no storage :data:`HOST` holds.

A CUDA dry run on the CPU's kernels puts device and host on the same (fake) CPU, so the storages themselves are
marked: each host tensor made inside :func:`host_side` or kept with :func:`keep_on_host`.
"""

from __future__ import annotations

import contextlib
import functools
import weakref
from collections.abc import Iterable, Iterator
from typing import Any

import torch

__all__ = ["HOST", "HostStorages", "host_side", "keep_on_host"]


class HostStorages:
    """The storages memlab keeps in host memory (the offload's, a trial's saved values), which a tracker of device
    memory does not count, and whether the allocations made now are host ones (inside :func:`host_side`).

    Where device and host differ (a live GPU, a dry run on fake CUDA tensors) the tracker tells them apart by device
    already; a CUDA dry run on the CPU's kernels puts both on the (fake) CPU, so the storages themselves are marked.
    Storages are keyed by identity and dropped when they are freed.

    Example:
        >>> host = HostStorages()
        >>> weight = torch.zeros(4)
        >>> host.hold(weight.untyped_storage()); host.holds(weight.untyped_storage()), host.holds(torch.zeros(4))
        (True, False)
    """

    def __init__(self) -> None:
        self.storages: dict[int, weakref.ref[Any]] = {}
        self.depth = 0
        """How many :func:`host_side` blocks are open: above 0, a new storage is a host one."""

    def holds(self, storage: Any) -> bool:
        """Whether ``storage`` (an ``UntypedStorage``) is one the offload keeps in host memory."""
        ref = self.storages.get(id(storage))
        return ref is not None and ref() is storage

    def hold(self, storage: Any) -> None:
        """Mark ``storage`` as kept in host memory, until it is freed."""
        key = id(storage)
        self.storages[key] = weakref.ref(storage, functools.partial(self._freed, key))

    def _freed(self, key: int, ref: weakref.ref[Any]) -> None:
        if self.storages.get(key) is ref:
            del self.storages[key]


HOST = HostStorages()
"""The process's host storages, as memlab marks them (:class:`HostStorages`); memlab's tracker reads them."""


@contextlib.contextmanager
def host_side() -> Iterator[None]:
    """Allocations made inside are host memory: a tracker that sees them marks them so (:data:`HOST`) and counts
    them not, nor any later use of them.

    Example:
        >>> from memlab.measure.tracker import MemoryTracker
        >>> with MemoryTracker() as tracker:
        ...     with host_side():
        ...         on_host = torch.zeros(1000)
        ...     on_device = torch.zeros(10)
        >>> tracker.live_bytes, HOST.holds(on_host.untyped_storage())
        (40, True)
    """
    HOST.depth += 1
    try:
        yield
    finally:
        HOST.depth -= 1


def keep_on_host(tensors: Iterable[torch.Tensor | None]) -> None:
    """Mark the storages of ``tensors`` (None ignored) as host memory (:data:`HOST`), wherever they were made.

    Example:
        >>> copy = torch.zeros(3)
        >>> keep_on_host([copy, None]); HOST.holds(copy.untyped_storage())
        True
    """
    for tensor in tensors:
        if tensor is not None:
            HOST.hold(tensor.untyped_storage())
