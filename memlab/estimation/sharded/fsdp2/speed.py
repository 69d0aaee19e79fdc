"""Three costs of the FSDP2 dry run that grow with the square of the model's size, made linear with the same results.

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

- DTensor's sharding propagation of a foreach operator then makes one schema per tensor of the lists
  (``_translate_list_op_schema``): it maps the whole argument tree with ``tree_map_only`` to pick each list's
  element, and keeps a list of per-tensor scalars (AdamW's bias corrections) whole in every element's schema, which
  each later step walks again (its hash, ``args_meta``, the placement scans): 723 schemas of 723 scalars each, per
  operator, for a 70B model. :func:`foreach_split_once` picks the elements with a map over plain containers and gives
  each element's schema its own scalar. The strategies do not change: an element's strategy reads its tensor
  arguments alone (DTensor's pointwise rules, the only foreach operators with scalar lists, read ``TensorMeta``
  arguments; the placement scans and counts skip numbers).

All hold PyTorch's private names: where this torch lacks one, PyTorch's own code runs unchanged.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from copy import deepcopy
from typing import Any

from memlab.live.compat import (
    dtensor_single_dim_strategy,
    fsdp_mem_tracker_class,
    mem_tracker_total_key,
    sharding_prop_strided_flag,
)
from memlab.live.patching import patched

__all__ = ["foreach_split_once", "fsdp_mem_tracker", "strided_flag_once", "tracker_class"]


def fsdp_mem_tracker(model: Any, optimizer: Any) -> Any:
    """PyTorch's ``FSDPMemTracker`` of ``model`` (sharded with ``fully_shard``) and ``optimizer``, of the class
    :func:`tracker_class` returns."""
    return tracker_class()(model, optimizer)


@functools.cache
def tracker_class() -> type:
    """PyTorch's ``FSDPMemTracker`` with a per-operator peak update that walks only the modules that are running
    (the module docstring says why the result is PyTorch's), and that follows a group whose member module never runs
    its own forward (:func:`_members_tracker`); PyTorch's own class where its names are not there.

    Example:
        >>> from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
        >>> issubclass(tracker_class(), FSDPMemTracker), tracker_class() is tracker_class()
        (True, True)
    """
    pytorchs: Any = _members_tracker(fsdp_mem_tracker_class())
    total = mem_tracker_total_key()
    if not hasattr(pytorchs, "_update_peak_stats") or total is None:
        return pytorchs  # type: ignore[no-any-return]

    class RunningModulesTracker(pytorchs):  # type: ignore[misc]
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


def _members_tracker(pytorchs: Any) -> Any:
    """``pytorchs`` (PyTorch's ``FSDPMemTracker``), whose backward hooks of an FSDP group pass over a member module
    that never ran its own forward. PyTorch's tracker keys a module's stats at its pre-forward and wraps the group's
    ``pre_backward`` / ``post_backward`` once per member, each wrapper looking its module up: TRL 1.16's fused LM
    head (SFT, DPO and GRPO trainers) reads ``lm_head.weight`` without calling ``lm_head``, which shares a group
    with the final norm (accelerate's layout), so the look-up failed with a ``KeyError`` naming ``FSDPLinear``. The
    group's gathering and gradients are the same; the member that ran records them. PyTorch's class where it lacks
    these names."""
    if not all(hasattr(pytorchs, name) for name in ("_fsdp_param_group_pre_backward",
                                                     "_fsdp_param_group_post_backward")):
        return pytorchs

    class GroupMembersTracker(pytorchs):  # type: ignore[misc]
        def _fsdp_param_group_pre_backward(self, fsdp_mod: Any, original: Any) -> Any:
            return self._if_ran(fsdp_mod, super()._fsdp_param_group_pre_backward(fsdp_mod, original), original)

        def _fsdp_param_group_post_backward(self, fsdp_mod: Any, original: Any) -> Any:
            return self._if_ran(fsdp_mod, super()._fsdp_param_group_post_backward(fsdp_mod, original), original)

        def _if_ran(self, fsdp_mod: Any, tracked: Any, original: Any) -> Any:
            @functools.wraps(original)
            def hook(*args: Any, **kwargs: Any) -> Any:
                return (tracked if fsdp_mod in self.memory_tracking else original)(*args, **kwargs)

            return hook

    return GroupMembersTracker


@contextlib.contextmanager
def strided_flag_once() -> Iterator[None]:
    """For the block, DTensor's ``_propagate_use_strided_shard_flag`` scans an operator's arguments once, not once
    per tensor of a foreach operator's lists (the module docstring says why the result is PyTorch's).

    Example (torch 2.11 has no such function, nor its cost: there the block changes nothing):
        >>> from torch.distributed.tensor import _sharding_prop
        >>> before = getattr(_sharding_prop, "_propagate_use_strided_shard_flag", None)
        >>> with strided_flag_once():
        ...     before is None or _sharding_prop._propagate_use_strided_shard_flag is not before
        True
        >>> getattr(_sharding_prop, "_propagate_use_strided_shard_flag", None) is before
        True
    """
    found = sharding_prop_strided_flag()
    if found is None:
        yield
        return
    _sharding_prop, original, strided_type = found
    last: list[Any] = [None, True]  # the last schema scanned (held, so that its id is not reused) and its answer

    def once(op_strategy: Any, op_schema: Any) -> None:
        if last[0] is not op_schema:
            last[0] = op_schema
            last[1] = any(isinstance(p, strided_type) for spec in op_schema.args_spec for p in spec.placements)
        if last[1]:  # PyTorch's own returns at once where no argument is strided
            original(op_strategy, op_schema)

    try:
        with patched(_sharding_prop, _propagate_use_strided_shard_flag=once):
            yield
    finally:
        last.clear()


_NUMBERS = (int, float, bool)


@contextlib.contextmanager
def foreach_split_once() -> Iterator[None]:
    """For the block, DTensor splits a foreach operator's schema into its elements' schemas in linear time (the
    module docstring says why the strategies are PyTorch's): ``tree_map_only`` as DTensor's ``single_dim_strategy``
    calls it, to pick each ``TupleStrategy``'s element, maps tuples, lists and dicts directly (anything else a
    pytree holds goes to PyTorch's own), and a top-level list of numbers as long as the operator's tensor lists
    becomes the element's number.

    Example:
        >>> from torch.distributed.tensor._ops import single_dim_strategy
        >>> before = single_dim_strategy.tree_map_only
        >>> with foreach_split_once():
        ...     single_dim_strategy.tree_map_only is before
        False
        >>> single_dim_strategy.tree_map_only is before
        True
    """
    module = dtensor_single_dim_strategy()
    if module is None:
        yield
        return
    original, strategy_type = module.tree_map_only, module.TupleStrategy

    last: list[Any] = [None, frozenset()]  # the last operator's arguments (held, so that their id is not reused)
    # and the positions of their per-tensor scalar lists: every element of one operator has the same

    def pick(types: Any, fn: Any, tree: Any, is_leaf: Any = None) -> Any:
        if types is not strategy_type:
            return original(types, fn, tree, is_leaf=is_leaf)
        index = _element_index(fn)
        scalars: frozenset[int] = frozenset()
        if index is not None and type(tree) is tuple and len(tree) == 2 and type(tree[0]) is tuple:
            if last[0] is not tree[0]:
                last[0], last[1] = tree[0], _scalar_lists(tree[0], strategy_type)
            scalars = last[1]
        try:
            if not scalars:
                return _picked(tree, fn, strategy_type)
            args = tuple(arg[index] if position in scalars else _picked(arg, fn, strategy_type)
                         for position, arg in enumerate(tree[0]))
            return args, _picked(tree[1], fn, strategy_type)
        except _NotPlain:
            return original(types, fn, tree, is_leaf=is_leaf)

    try:
        with patched(module, tree_map_only=pick):
            yield
    finally:
        last.clear()


def _scalar_lists(args: tuple[Any, ...], strategy_type: Any) -> frozenset[int]:
    """The positions in a foreach operator's arguments of its lists of numbers, one per tensor of its lists."""
    lengths = {len(arg.children) for arg in args if type(arg) is strategy_type}
    if len(lengths) != 1:
        return frozenset()
    return frozenset(position for position, arg in enumerate(args) if type(arg) is list and len(arg) in lengths
                     and all(type(item) in _NUMBERS for item in arg))


class _NotPlain(Exception):
    """A container other than a tuple, list or dict: PyTorch's own ``tree_map_only`` maps it."""


def _picked(node: Any, fn: Any, strategy_type: type) -> Any:
    """``tree_map_only(strategy_type, fn, node)`` for trees of tuples, lists and dicts (pytree's rebuilt containers:
    new tuples, lists and dicts of the mapped items, in order)."""
    kind = type(node)
    if kind is strategy_type:
        return fn(node)
    if kind is tuple:
        return tuple([_picked(item, fn, strategy_type) for item in node])
    if kind is list:
        return [_picked(item, fn, strategy_type) for item in node]
    if kind is dict:
        return {key: _picked(value, fn, strategy_type) for key, value in node.items()}
    if isinstance(node, (tuple, list, dict)):
        raise _NotPlain
    return node


def _element_index(fn: Any) -> int | None:
    """The element ``_translate_list_op_schema``'s picking function takes (``lambda x: x.children[index]``), read
    from its closure; None for any other function."""
    code, closure = getattr(fn, "__code__", None), getattr(fn, "__closure__", None)
    if code is None or closure is None or code.co_freevars != ("index",):
        return None
    index = closure[0].cell_contents
    return index if type(index) is int else None
