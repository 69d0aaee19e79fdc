"""Two costs of the FSDP2 dry run that grow with the square of the model's size, made linear with the same results.

- PyTorch's ``FSDPMemTracker`` updates the peaks after every operator by walking every FSDP module it has seen and
  asking whether it is running (``_update_peak_stats``): an 80-layer model walks 80-odd modules per operator, about
  a fifth of a 70B dry run. :func:`fsdp_mem_tracker` returns a tracker that walks only the running ones (looked up
  by name), and updates each as PyTorch's does: each module's update touches its own peak and snapshots, so the
  order of the walk changes nothing.
- DTensor's sharding propagation of a foreach operator (the optimizer's step over every parameter) calls
  ``_propagate_use_strided_shard_flag`` once per tensor of the list, and each call scans every tensor's placements:
  a 70B model's 723 parameters make 25 million scans per step. The scan's answer depends on the operator's
  arguments alone, and where none of them is a ``_StridedShard`` (FSDP2 over one mesh dimension never makes one)
  the function returns without doing anything; :func:`strided_flag_once` scans once per operator and skips the
  calls that would have returned, calling PyTorch's own otherwise.

Both hold PyTorch's private names: where this torch lacks one, PyTorch's own code runs unchanged.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from copy import deepcopy
from typing import Any

__all__ = ["fsdp_mem_tracker", "strided_flag_once", "tracker_class"]


def fsdp_mem_tracker(model: Any, optimizer: Any) -> Any:
    """PyTorch's ``FSDPMemTracker`` of ``model`` (sharded with ``fully_shard``) and ``optimizer``, of the class
    :func:`tracker_class` returns."""
    return tracker_class()(model, optimizer)


@functools.cache
def tracker_class() -> type:
    """PyTorch's ``FSDPMemTracker`` with a per-operator peak update that walks only the modules that are running
    (the module docstring says why the result is PyTorch's); PyTorch's own class where its names are not there.

    Example:
        >>> from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
        >>> issubclass(tracker_class(), FSDPMemTracker), tracker_class() is tracker_class()
        (True, True)
    """
    from torch.distributed._tools import mem_tracker
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

    if not hasattr(FSDPMemTracker, "_update_peak_stats") or not hasattr(mem_tracker, "_TOTAL_KEY"):
        return FSDPMemTracker
    total = mem_tracker._TOTAL_KEY

    class RunningModulesTracker(FSDPMemTracker):  # type: ignore[misc]
        _running_index: tuple[int, dict[str, list[Any]]] = (-1, {})

        def _update_peak_stats(self, peak_state: Any) -> None:
            # PyTorch's own (torch/distributed/_tools/mem_tracker.py), the walk over memory_tracking replaced by a
            # look-up of the running modules' names (memory_tracking only grows while a step runs)
            curr_snap = self._curr_mem_snap
            tracking = self.memory_tracking
            if self._running_index[0] != len(tracking):
                by_name: dict[str, list[Any]] = {}
                for stats in tracking.values():
                    by_name.setdefault(stats.mod_fqn, []).append(stats)
                self._running_index = (len(tracking), by_name)
            by_name = self._running_index[1]
            for name in self._mod_tracker.parents:
                for mod_stats in by_name.get(name, ()):
                    if peak_state in mod_stats.snapshots:
                        for dev, dev_snap in curr_snap.items():
                            if mod_stats.local_peak.get(dev, 0) < dev_snap[total]:
                                mod_stats.local_peak[dev] = dev_snap[total]
                                mod_stats.snapshots[peak_state][-1][dev] = deepcopy(dev_snap)
            for dev, dev_snap in curr_snap.items():
                if self._peak_mem.get(dev, 0) < dev_snap[total]:
                    self._peak_mem[dev] = dev_snap[total]
                    self._peak_mem_snap[dev] = deepcopy(dev_snap)

    return RunningModulesTracker


@contextlib.contextmanager
def strided_flag_once() -> Iterator[None]:
    """For the block, DTensor's ``_propagate_use_strided_shard_flag`` scans an operator's arguments once, not once
    per tensor of a foreach operator's lists (the module docstring says why the result is PyTorch's).

    Example:
        >>> from torch.distributed.tensor import _sharding_prop
        >>> before = _sharding_prop._propagate_use_strided_shard_flag
        >>> with strided_flag_once():
        ...     _sharding_prop._propagate_use_strided_shard_flag is before
        False
        >>> _sharding_prop._propagate_use_strided_shard_flag is before
        True
    """
    from torch.distributed.tensor import _sharding_prop

    original = getattr(_sharding_prop, "_propagate_use_strided_shard_flag", None)
    strided_type = getattr(_sharding_prop, "_StridedShard", None)
    if original is None or strided_type is None:
        yield
        return
    last: list[Any] = [None, True]  # the last schema scanned (held, so that its id is not reused) and its answer

    def once(op_strategy: Any, op_schema: Any) -> None:
        if last[0] is not op_schema:
            last[0] = op_schema
            last[1] = any(isinstance(p, strided_type) for spec in op_schema.args_spec for p in spec.placements)
        if last[1]:  # PyTorch's own returns at once where no argument is strided
            original(op_strategy, op_schema)

    _sharding_prop._propagate_use_strided_shard_flag = once
    try:
        yield
    finally:
        _sharding_prop._propagate_use_strided_shard_flag = original
        last.clear()
