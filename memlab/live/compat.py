"""The installed stack: the versions memlab needs (checked once, as ``import memlab`` starts), and every private
PyTorch name memlab relies on, looked up here and nowhere else.

memlab's dry runs reach into PyTorch's internals where no public interface says what they need: the fake mode's
metadata handlers and its dispatch cache key, the ``_grouped_mm`` operator, FSDP2's ``fully_shard`` and
``MixedPrecisionPolicy``, ``FSDPMemTracker`` and DTensor's sharding strategies. Each is found by one function here,
which answers None (or PyTorch's own, unchanged) where the installed torch lacks it, so that a torch without it
runs PyTorch's own code instead of failing with an ``AttributeError`` deep inside an estimate.
``tests/live/test_compat.py`` checks each one against the torch it runs on; CI runs it on every stack
CONTRIBUTING's table lists.

Torch-free at import (this module is imported before torch): each look-up imports what it reads.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import sys
from collections.abc import Callable, Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

from memlab.errors import MemlabError
from memlab.live.patching import patched

__all__ = [
    "FLOORS",
    "UnsupportedStack",
    "allocator_settings",
    "check_stack",
    "checkpoint_recomputations",
    "checkpoint_traced",
    "current_autograd_node",
    "dtensor_single_dim_strategy",
    "fake_cache_key_matches",
    "fake_rules_for_higher_order_operators",
    "fake_meta_handlers",
    "fsdp2_api",
    "fsdp_mem_tracker_class",
    "grouped_mm",
    "installed_version",
    "mem_tracker_total_key",
    "propagation_apart",
    "set_allocator_settings",
    "sharding_prop_strided_flag",
    "tensor_use_counts",
    "profiled_allocations",
    "unsupported",
]

FLOORS: dict[str, str] = {
    "torch": "2.11",
    "transformers": "5.17",
    "peft": "0.21.2",
    "bitsandbytes": "0.50.2",
}
"""The oldest release of each package memlab runs on: what CI's floor stack tests (CONTRIBUTING says what each
floor buys); ``pyproject.toml`` declares the same. ``trl`` and ``accelerate`` are optional (the Trainer's
packages) and are not checked at import."""


class UnsupportedStack(MemlabError, ImportError):
    """``import memlab`` on a stack below :data:`FLOORS`: the message names every package that is too old and the
    one command that installs what memlab needs.

    Example:
        >>> raise UnsupportedStack("memlab needs torch>=2.11 (installed: torch 2.8.0); write: pip install ...")
        Traceback (most recent call last):
        ...
        memlab.live.compat.UnsupportedStack: memlab needs torch>=2.11 (installed: torch 2.8.0); write: pip install ...
    """


def installed_version(package: str) -> str | None:
    """The installed release of ``package`` as its distribution's metadata says (None where it is not installed),
    read without importing it; torch's is ``torch.__version__``, the one this process runs.

    Example:
        >>> installed_version("torch") is not None, installed_version("no-such-package-memlab")
        (True, None)
    """
    if package == "torch":
        loaded = sys.modules.get("torch")
        if loaded is None:  # torch's own version.py, where the import would find it: ``import memlab`` stays quick
            found = _unimported_torch_version()
            if found is not None:
                return found
        import torch

        return str(torch.__version__)
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _unimported_torch_version() -> str | None:
    """``torch.__version__`` read from the ``torch/version.py`` that ``import torch`` would run, without importing
    torch (None where it cannot be read so)."""
    import importlib.util
    import re

    try:
        spec = importlib.util.find_spec("torch")
        folders = list(spec.submodule_search_locations or []) if spec is not None else []
        text = (Path(folders[0]) / "version.py").read_text() if folders else ""
    except (ImportError, OSError, ValueError):
        return None
    found = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", text, re.MULTILINE)
    return found.group(1) if found else None


def _release(version: str) -> tuple[int, ...]:
    """``"2.11.0+cu130"`` -> ``(2, 11, 0)``; a pre-release counts as its release (``2.12.0.dev2026`` -> 2.12.0)."""
    from packaging.version import InvalidVersion, Version

    try:
        return Version(version).release
    except InvalidVersion:
        return tuple(int(part) for part in version.split("+")[0].split(".")[:3] if part.isdigit())


def unsupported() -> dict[str, str]:
    """Each installed package of :data:`FLOORS` older than its floor, with its installed release (a package that is
    not installed is left to the import that needs it).

    Example:
        >>> unsupported()
        {}
    """
    old = {}
    for package, floor in FLOORS.items():
        version = installed_version(package)
        if version is not None and _release(version) < _release(floor):
            old[package] = version
    return old


def check_stack() -> None:
    """Raise :class:`UnsupportedStack` where an installed package is older than memlab's floor, naming each and the
    command that installs what memlab needs; ``import memlab`` calls it first, so that an old stack is said once,
    at import, rather than as a traceback from deep inside a later estimate.

    Example:
        >>> check_stack()  # this stack is supported: nothing is raised
    """
    old = unsupported()
    if not old:
        return
    needs = " ".join(f"'{package}>={FLOORS[package]}'" for package in old)
    installed = ", ".join(f"{package} {version}" for package, version in old.items())
    raise UnsupportedStack(
        f"memlab needs {', '.join(f'{p}>={FLOORS[p]}' for p in old)} (installed: {installed}); "
        f"write: pip install --upgrade {needs}"
    )


# --- private PyTorch names, each looked up once -----------------------------------------------------------------------


@functools.cache
def grouped_mm() -> Any:
    """``torch.ops.aten._grouped_mm.default`` (mixture-of-experts layers; torch >= 2.8), or None where this torch
    has no such operator.

    Example:
        >>> import torch
        >>> grouped_mm() is torch.ops.aten._grouped_mm.default
        True
    """
    import torch

    packet = getattr(torch.ops.aten, "_grouped_mm", None)
    return None if packet is None else packet.default


@functools.cache
def fake_meta_handlers() -> dict[Any, Any]:
    """``FakeTensorMode``'s handlers of metadata queries (``prim.device`` and the like) by operator, which the dry
    run's fake mode calls directly; empty where this torch has none (every query then goes through the fake mode's
    dispatch, as PyTorch's own does).

    Example:
        >>> import torch
        >>> torch.ops.prim.device.default in fake_meta_handlers()
        True
    """
    from torch._subclasses import fake_tensor

    return dict(getattr(fake_tensor, "_DISPATCH_META_HANDLERS", {}))


def checkpoint_traced() -> bool:
    """Whether ``torch.utils.checkpoint`` takes the call being made now as traced for ``torch.compile``
    (AOTAutograd's proxy mode active: its private ``_is_compiling``, which decides that a ``context_fn`` must give
    selective-checkpointing modes; ``torch.compiler.is_compiling()`` is False there on torch 2.11).

    Example:
        >>> checkpoint_traced()
        False
    """
    import torch
    import torch.utils.checkpoint

    traced = getattr(torch.utils.checkpoint, "_is_compiling", None)
    return bool(traced(None, (), {})) if traced is not None else torch.compiler.is_compiling()


@contextlib.contextmanager
def checkpoint_recomputations(wrap: Callable[[Callable[..., Any]], Callable[..., Any]]) -> Iterator[None]:
    """While active, each ``torch.utils.checkpoint`` whose forward runs recomputes in backward with ``wrap(function)``
    instead of ``function``, ``wrap`` called as the forward runs: the non-reentrant checkpoint's ``recompute_fn``
    (what its private ``_CheckpointFrame`` calls from the saved tensors' unpack hook, whoever made the checkpoint and
    whatever its ``context_fn``) and the reentrant one's ``run_function`` (its private ``CheckpointFunction``, whose
    forward still calls the function unwrapped). A torch without them keeps its own checkpoint: the recompute is
    not wrapped.

    Example:
        >>> import torch
        >>> calls = []
        >>> def wrap(function):
        ...     def recompute(*args, **kwargs):
        ...         calls.append("recompute")
        ...         return function(*args, **kwargs)
        ...     return recompute
        >>> x = torch.ones(2, requires_grad=True)
        >>> with checkpoint_recomputations(wrap):
        ...     y = torch.utils.checkpoint.checkpoint(torch.sin, x, use_reentrant=False)
        >>> y.sum().backward(); calls
        ['recompute']
    """
    import torch.utils.checkpoint as checkpoint

    frame: Any = getattr(checkpoint, "_CheckpointFrame", None)
    function: Any = getattr(checkpoint, "CheckpointFunction", None)
    patches: dict[str, Any] = {}
    if isinstance(frame, type):
        class WrappedFrame(frame):  # type: ignore[misc, valid-type]
            def __init__(self, recompute_fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
                super().__init__(wrap(recompute_fn), *args, **kwargs)

        patches["_CheckpointFrame"] = WrappedFrame
    if isinstance(function, type) and hasattr(function, "apply"):
        class WrappedFunction(function):  # type: ignore[misc, valid-type]
            @staticmethod
            def forward(ctx: Any, run_function: Callable[..., Any], preserve_rng_state: bool, *args: Any) -> Any:
                outputs = function.forward(ctx, run_function, preserve_rng_state, *args)
                ctx.run_function = wrap(run_function)  # what its backward recomputes with
                return outputs

        patches["CheckpointFunction"] = WrappedFunction
    with patched(checkpoint, **patches):
        yield


def fake_rules_for_higher_order_operators(mode_type: type) -> None:
    """Give ``mode_type`` (a ``FakeTensorMode`` subclass) every higher-order operator's rule for ``FakeTensorMode``
    that it lacks: their dispatch looks a mode's rule up by its exact type (``HigherOrderOperator.python_key_table``,
    private), so a subclass has none, and an operator such as ``run_and_save_rng_state``, which a compiled step
    with checkpointing runs, failed in the dry run. Operators made later get theirs at the next call.

    Example:
        >>> import torch
        >>> from torch._subclasses.fake_tensor import FakeTensorMode
        >>> class Mode(FakeTensorMode):
        ...     pass
        >>> fake_rules_for_higher_order_operators(Mode)
        >>> Mode in torch.ops.higher_order.run_and_save_rng_state.python_key_table
        True
    """
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    for operator in list(getattr(torch._ops, "_higher_order_ops", {}).values()):
        table = getattr(operator, "python_key_table", {})
        if FakeTensorMode in table and mode_type not in table:
            operator.py_impl(mode_type)(table[FakeTensorMode])


_CACHE_KEY_PARAMETERS = ("self", "result", "args", "state", "id_hashed_objects")


@functools.cache
def fake_cache_key_matches() -> bool:
    """Whether ``FakeTensorMode._prep_args_for_hash`` (its dispatch cache key) takes the arguments memlab's faster
    copy of it takes (:class:`memlab.estimation.dryrun.fake.FakeMode`); where it does not, PyTorch's own stays.

    Example:
        >>> fake_cache_key_matches()
        True
    """
    from torch._subclasses.fake_tensor import FakeTensorMode

    method = getattr(FakeTensorMode, "_prep_args_for_hash", None)
    if method is None:
        return False
    try:
        parameters = tuple(inspect.signature(method).parameters)
    except (TypeError, ValueError):
        return False
    return parameters == _CACHE_KEY_PARAMETERS


def fsdp2_api() -> tuple[Any, Any]:
    """FSDP2's ``fully_shard`` and ``MixedPrecisionPolicy`` (public in ``torch.distributed.fsdp`` since torch 2.6,
    in ``torch.distributed._composable.fsdp`` before).

    Example:
        >>> fully_shard, policy = fsdp2_api()
        >>> fully_shard.__name__, policy.__name__
        ('fully_shard', 'MixedPrecisionPolicy')
    """
    try:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    except ImportError:
        from torch.distributed._composable.fsdp import (  # type: ignore[no-redef]
            MixedPrecisionPolicy,
            fully_shard,
        )
    return fully_shard, MixedPrecisionPolicy


def fsdp_mem_tracker_class() -> type:
    """PyTorch's ``FSDPMemTracker`` (``torch.distributed._tools.fsdp2_mem_tracker``).

    Example:
        >>> fsdp_mem_tracker_class().__name__
        'FSDPMemTracker'
    """
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

    return FSDPMemTracker  # type: ignore[no-any-return]


@contextlib.contextmanager
def propagation_apart() -> Iterator[None]:
    """For the block, DTensor's propagation of an output's shape (``ShardingPropagator.
    _propagate_tensor_meta_non_cached``, which builds fake tensors of the operator's global shapes and runs it on
    them) runs with no dispatch mode active, so under a fake mode of its own, as it does in eager mode: there it is
    metadata, never memory. In a dry run it would otherwise run under the dry run's fake mode, in sight of every
    tracker, and a propagation that DTensor did not cache (torch 2.11 caches no foreach operator whose scalars
    change from step to step: AdamW's bias corrections) would be booked as the tracked step's memory: 2.09 GiB of
    "optimizer" per GPU for GPT-2 on 2 GPUs, where a real run holds 475 MiB.

    Example:
        >>> from torch.distributed.tensor._sharding_prop import ShardingPropagator as Propagator
        >>> before = Propagator._propagate_tensor_meta_non_cached
        >>> with propagation_apart():
        ...     inside = Propagator._propagate_tensor_meta_non_cached
        >>> inside is before, Propagator._propagate_tensor_meta_non_cached is before  # replaced, then put back
        (False, True)
    """
    from torch.distributed.tensor._sharding_prop import ShardingPropagator
    from torch.utils._python_dispatch import _disable_current_modes

    original = ShardingPropagator.__dict__.get("_propagate_tensor_meta_non_cached")
    if original is None:
        yield
        return

    def apart(self: Any, op_schema: Any) -> Any:
        with _disable_current_modes():
            return original(self, op_schema)

    with patched(ShardingPropagator, _propagate_tensor_meta_non_cached=apart):
        yield


def mem_tracker_total_key() -> str | None:
    """``MemTracker``'s key of a snapshot's total, or None where this torch names it otherwise.

    Example:
        >>> mem_tracker_total_key()
        'Total'
    """
    from torch.distributed._tools import mem_tracker

    key = getattr(mem_tracker, "_TOTAL_KEY", None)
    return key if isinstance(key, str) else None


def sharding_prop_strided_flag() -> tuple[Any, Any, Any] | None:
    """DTensor's sharding propagation module, its ``_propagate_use_strided_shard_flag`` and its ``_StridedShard``
    placement type, or None where this torch lacks either.

    Example:
        >>> found = sharding_prop_strided_flag()  # torch 2.11 has no such flag
        >>> found is None or found[2].__name__ == "_StridedShard"
        True
    """
    from torch.distributed.tensor import _sharding_prop

    flag = getattr(_sharding_prop, "_propagate_use_strided_shard_flag", None)
    strided = getattr(_sharding_prop, "_StridedShard", None)
    if flag is None or strided is None:
        return None
    return _sharding_prop, flag, strided


def dtensor_single_dim_strategy() -> Any:
    """DTensor's ``torch.distributed.tensor._ops.single_dim_strategy`` module (where a foreach operator's schema is
    split into its elements'), or None where this torch has none or it lacks ``tree_map_only`` or ``TupleStrategy``.

    Example:
        >>> dtensor_single_dim_strategy().__name__
        'torch.distributed.tensor._ops.single_dim_strategy'
    """
    try:
        from torch.distributed.tensor._ops import single_dim_strategy as module
    except ImportError:
        return None
    if getattr(module, "tree_map_only", None) is None or getattr(module, "TupleStrategy", None) is None:
        return None
    return module


def tensor_use_counts(tensor: Any) -> tuple[int, int] | None:
    """How many references hold ``tensor`` and its storage (``Tensor._use_count`` and ``torch._C._storage_Use_Count``,
    both private), or None where this torch has neither: what the autograd engine reads to decide whether it may sum
    gradients in place.

    Example:
        >>> import torch
        >>> tensor_use_counts(torch.ones(2)) is not None
        True
    """
    import torch

    use_count = getattr(tensor, "_use_count", None)
    storage_use_count = getattr(torch._C, "_storage_Use_Count", None)
    if use_count is None or storage_use_count is None:
        return None
    return int(use_count()), int(storage_use_count(tensor.untyped_storage()._cdata))


def current_autograd_node() -> Any:
    """The autograd node whose backward this thread is running now (``torch._C._current_autograd_node``, private),
    or None outside backward and where this torch has no such function: its ``name()`` (``"GatherBackward0"``) says
    which derivative formula runs the operator being dispatched.

    Example:
        >>> current_autograd_node() is None
        True
    """
    import torch

    current = getattr(torch._C, "_current_autograd_node", None)
    return None if current is None else current()


def allocator_settings() -> str | None:
    """The caching allocator's settings string as PyTorch last parsed it (``PYTORCH_ALLOC_CONF`` /
    ``PYTORCH_CUDA_ALLOC_CONF`` at start, or the last :func:`set_allocator_settings`), through
    ``torch._C._accelerator_getAllocatorSettings`` (torch 2.13); None where the installed torch has no getter
    (2.11): the environment then says what the process started with.

    Example:
        >>> allocator_settings() is None or isinstance(allocator_settings(), str)
        True
    """
    import torch

    getter = getattr(torch._C, "_accelerator_getAllocatorSettings", None)
    return None if getter is None else str(getter())


def set_allocator_settings(settings: str) -> None:
    """Change the caching allocator's settings in this process, after CUDA started too (``"expandable_segments:True"``):
    ``torch._C._accelerator_setAllocatorSettings`` where torch has it (2.11 and later; 2.13 deprecates
    ``torch.cuda.memory._set_allocator_settings``, which calls it), else that older name. Keys not named keep their
    value. The allocator reads ``expandable_segments`` each time it maps a new segment, so the setting decides the
    segments made after it; segments already made stay as they are.

    Example:
        >>> set_allocator_settings("expandable_segments:False")  # PyTorch's default
    """
    import torch

    setter = getattr(torch._C, "_accelerator_setAllocatorSettings", None)
    if setter is None:
        setter = torch.cuda.memory._set_allocator_settings
    setter(settings)
def profiled_allocations(profile: Any) -> list[tuple[int, int]] | None:
    """Every allocation and free a ``torch.profiler.profile(profile_memory=True)`` recorded, as ``(time in ns, bytes)``
    in time order (frees negative), from its event tree (``kineto_results.experimental_event_tree`` and
    ``torch._C._profiler._EventType``, both private); None where this torch has neither. What a compiled step's
    kernels allocate passes no dispatch mode, but the CPU allocator reports it to the profiler.

    Example:
        >>> import torch
        >>> with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as p:
        ...     x = torch.ones(256)
        >>> [size for _, size in profiled_allocations(p) or []][:1]
        [1024]
    """
    import torch

    event_type = getattr(getattr(torch._C, "_profiler", None), "_EventType", None)
    results = getattr(getattr(profile, "profiler", None), "kineto_results", None)
    if event_type is None or results is None or not hasattr(results, "experimental_event_tree"):
        return None
    found: list[tuple[int, int]] = []
    stack = list(results.experimental_event_tree())
    while stack:
        node = stack.pop()
        stack.extend(node.children)
        if node.tag == event_type.Allocation:
            found.append((int(node.start_time_ns), int(node.extra_fields.alloc_size)))
    return sorted(found)
