"""MemoryTracker: live tensor-storage bytes by category, and their peak, on any device (CPU, meta, fake).

The tracker is a ``TorchDispatchMode``. After every operator it looks at the storages of the outputs: a
storage it has not seen before is a new allocation and is charged to the current phase's category; a weak
reference with a callback takes the bytes off again when the storage is freed. Views share their base's
storage and so are never counted twice. Storages that existed before tracking started are only counted when
they are given as ``baseline`` or passed to :meth:`MemoryTracker.mark`: an aliasing operator (a view, an
in-place or ``out=`` op) that hands back such a storage does not allocate it.

Storages the offload keeps in host memory (:data:`memlab.live.host.HOST`: made inside
``host_side()`` or marked by it) are never counted: they are not the device's, even where a dry run's device and
host are the same fake CPU. Nor are those made inside :func:`memlab.techniques.compile.inlined`: the dry run of a
compiled step makes there what inductor computes inside a fused kernel and never allocates.

What it cannot see: memory an operator allocates and frees inside its kernel (workspaces), memory that
never becomes a tensor (allocator caches, CUDA context), and storage-less tensors (sparse ones). On CUDA
the allocator's own statistics (:mod:`memlab.measure.cuda`) are the reference; the tracker provides the
breakdown by category.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_leaves

from memlab.errors import MemlabError
from memlab.live.compat import current_autograd_node
from memlab.live.host import HOST
from memlab.live.patching import patched
from memlab.measure.ledger import CATEGORIES, Ledger
from memlab.plan import format_bytes
from memlab.techniques.compile import INLINED

__all__ = ["CATEGORIES", "FILLED_IN_PLACE", "FILLS", "INFERENCE_CATEGORIES", "FormulaFills", "MemoryTracker"]

INFERENCE_CATEGORIES = ("params", "activations", "kv_cache", "other")
"""Where the memory of an inference step goes (:mod:`memlab.inference`): no gradients or optimizer state, and the
KV cache of generation on its own."""

_SAMPLE_INTERVAL_S = 1e-3

# ``lift_fresh`` is declared as aliasing its input, but that input is the tensor ``torch.tensor(...)`` has
# just built outside the dispatcher: its storage is a new allocation.
_FRESH_DESPITE_ALIASING = frozenset({torch.ops.aten.lift_fresh.default})

_aliasing_cache: dict[Any, bool] = {}

_aten = torch.ops.aten
FILLED_IN_PLACE: dict[Any, tuple[Any, frozenset[str]]] = {
    _aten.scatter_add.default: (_aten.scatter_add_.default,
                                frozenset({"GatherBackward0", "CummaxBackward0", "CumminBackward0"})),
    _aten.index_add.default: (_aten.index_add_.default, frozenset({"IndexSelectBackward0"})),
    _aten.masked_scatter.default: (_aten.masked_scatter_.default, frozenset({"MaskedSelectBackward0"})),
    _aten.index_put.default: (_aten.index_put_.default, frozenset({"IndexBackward0"})),
}
"""Derivative formulas that make a gradient as zeros and fill them in place, except where a tensor is "subclass-like"
(PyTorch's ``areAnyTensorSubclassLike``: a fake tensor, or any tensor while a dispatch mode is on the stack, so
every tensor a tracker or a dry run sees), where they fill them out of place and hold the zeros and their filled copy
at once: the out-of-place operator, its in-place twin, and the autograd nodes whose formula calls it so (PyTorch's
``gather_backward``, ``cummaxmin_backward``, ``index_select_backward``, ``masked_select_backward``,
``index_backward``). Left so, a step that gathers from the float32 logits over the vocabulary (TRL's log-probs) held
one more copy of them in backward than the unobserved step: 0.43 GiB in a GRPO step of 8 x 96 tokens of Qwen3."""
_ZEROS = frozenset({_aten.new_zeros.default, _aten.zeros.default, _aten.zeros_like.default})
_FILLING_NODES = frozenset().union(*(names for _, names in FILLED_IN_PLACE.values()))
FILLS = _ZEROS | FILLED_IN_PLACE.keys()
"""The operators a mode hands to :meth:`FormulaFills.run`: the zeros factories and the out-of-place fills."""


class FormulaFills:
    """The fills of :data:`FILLED_IN_PLACE` made in place, as the unobserved step makes them, by a dispatch mode (the
    tracker, the dry run's fake mode): the zeros a filling formula makes are remembered (their storage, with their
    autograd node), and that formula's out-of-place fill of those very zeros runs as its in-place twin and returns
    them. Any other call of these operators (a model's own ``scatter_add``) runs as it was called.

    Example:
        >>> x = torch.ones(256, 256, requires_grad=True)
        >>> picked = x.gather(1, torch.zeros(256, 1, dtype=torch.long))
        >>> with MemoryTracker() as tracker:
        ...     picked.sum().backward()
        >>> tracker.peak_bytes // 1024  # x's gradient, 256 KiB: its zeros filled in place, as without the tracker
        256
    """

    __slots__ = ("_fresh",)

    def __init__(self) -> None:
        # the node itself, held: torch 2.11 wraps a node anew once its last wrapper is gone, so ids do not match
        self._fresh: tuple[Any, int] | None = None

    def run(self, func: Any, args: Sequence[Any], kwargs: Mapping[str, Any],
            call: Callable[[Any, Sequence[Any], Mapping[str, Any]], Any]) -> Any:
        """``func`` (one of :data:`FILLS`) on ``args``, run through ``call(operator, args, kwargs)``: in place where
        it fills the zeros its derivative formula has just made."""
        node = current_autograd_node()
        if func in _ZEROS:
            out = call(func, args, kwargs)
            if node is not None and node.name() in _FILLING_NODES:
                self._fresh = (node, _storage_key(out))
            return out
        fresh, self._fresh = self._fresh, None
        in_place, names = FILLED_IN_PLACE[func]
        if (node is None or fresh is None or fresh[0] is not node or fresh[1] != _storage_key(args[0])
                or node.name() not in names):
            return call(func, args, kwargs)
        call(in_place, args, kwargs)
        return args[0]


def _storage_key(tensor: Any) -> int:
    """The storage a tensor views, by its C++ address: the same zeros, whether the Python object the formula hands on is
    the one the mode returned (torch 2.13) or a new wrapper of them (torch 2.11)."""
    return int(tensor.untyped_storage()._cdata) if isinstance(tensor, torch.Tensor) else -1


def _returns_alias(func: Any) -> bool:
    """True when every tensor the operator returns aliases an input (views, in-place, ``out=``)."""
    try:
        return _aliasing_cache[func]
    except KeyError:
        pass
    if func in _FRESH_DESPITE_ALIASING:
        result = False
    else:
        try:
            returns = func._schema.returns
            result = bool(returns) and all(r.alias_info is not None for r in returns)
        except AttributeError:  # not an OpOverload (a higher-order operator, say): treat outputs as fresh
            result = False
    _aliasing_cache[func] = result
    return result


def _following_host() -> Any:
    """The fake mode of a dry run (:class:`memlab.estimation.dryrun.fake.FakeMode`) that takes ``followers``, where it
    is the only mode on the stack, else None. A tracker entered then would be the next mode above it and see exactly
    the operators that reach it; following it sees the same, without one more Python mode per operator."""
    if torch._C._len_torch_dispatch_stack() != 1:
        return None
    mode = torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE)
    return mode if getattr(mode, "followable", False) is True else None


def _call(func: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
    return func(*args, **kwargs)


def _check_category(category: str, categories: tuple[str, ...] = CATEGORIES) -> str:
    if category not in categories:
        raise MemlabError(f"unknown memory category {category!r}; write one of {', '.join(categories)}")
    return category


class MemoryTracker(TorchDispatchMode):
    """Counts live tensor-storage bytes by category while active, and their peak (a ``TorchDispatchMode``).

    Args:
        baseline: category -> tensors already alive when tracking starts (parameters and buffers under
            ``"params"``, optimizer state under ``"optimizer"``, the batch under ``"other"``...). Each storage
            is counted once, under the first category that names it; ``None`` entries are ignored.
        budget: bytes; when an operator makes ``live_bytes`` exceed it, the operator raises
            ``torch.OutOfMemoryError`` (after its allocation was counted in ``peak_bytes``), exactly like a
            real out-of-memory. ``None``: no limit.
        device: only storages on this device count. ``"cuda"`` without an index means the current CUDA device
            (device 0 when CUDA is not initialised, as for fake tensors). ``"meta"`` counts meta tensors and
            fake tensors (``FakeTensorMode``) of any fake device, which is what a dry run needs.
        on_sample: called with ``live_bytes`` on each new peak and otherwise at most once a millisecond, from
            inside the operator that changed it: keep it cheap and do not run tensor operations in it.
        categories: the categories to count under (default :data:`CATEGORIES`, a training step's;
            :data:`INFERENCE_CATEGORIES` for inference). Breakdowns have exactly these keys.
        on_storage: called with ``(key, bytes)`` on every change to a tracked storage, in order: a new key is an
            allocation, a known key with other bytes a resize, ``0`` a free (a dry run replays these through a
            model of the CUDA caching allocator). Keys are storage ids, so a key can come back after its free.
            Same rules as ``on_sample``: keep it cheap, no tensor operations.

    Allocations made inside :meth:`phase` count under its category, elsewhere under ``"other"``. Frees are
    counted whenever they happen, after ``__exit__`` too, so ``live_bytes`` stays true for what was
    tracked. The tracker is meant for one thread at a time (the autograd engine's hand-off to its device
    threads is fine).

    Example:
        >>> import torch
        >>> model = torch.nn.Linear(8, 8)
        >>> tracker = MemoryTracker(baseline={"params": model.parameters()})
        >>> with tracker:
        ...     with tracker.phase("activations"):
        ...         model(torch.ones(4, 8)).sum().backward()
        ...     tracker.mark([p.grad for p in model.parameters()], "grads")
        >>> tracker.breakdown["params"]
        288
        >>> sum(tracker.breakdown.values()) == tracker.peak_bytes
        True
    """

    def __init__(
        self,
        *,
        baseline: Mapping[str, Iterable[torch.Tensor | None]] | None = None,
        budget: int | None = None,
        device: torch.device | str = "cpu",
        on_sample: Callable[[int], None] | None = None,
        categories: tuple[str, ...] = CATEGORIES,
        on_storage: Callable[[int, int], None] | None = None,
    ) -> None:
        super().__init__()
        if "other" not in categories:
            raise MemlabError(f"categories {categories} lack 'other'; write them with 'other' among them")
        self.categories = tuple(categories)
        if budget is not None and budget < 0:
            raise MemlabError(f"budget {budget} is negative; write a number of bytes >= 0 or None")
        self.budget = budget
        self.device = torch.device(device)
        self._device_type = self.device.type
        self._device_index = self.device.index
        if self._device_type == "cuda" and self._device_index is None:
            self._device_index = torch.cuda.current_device() if torch.cuda.is_initialized() else 0
        self._on_sample = on_sample
        self._last_sample = 0.0
        self._category = "other"
        self._active = False
        self._unpatch_resize: Callable[[], None] | None = None
        self._host: Any = None  # the fake mode this tracker follows instead of being a mode (see _following_host)
        self._fills = FormulaFills()
        self._ledger = Ledger(self.categories)
        self._ledger.listener = on_storage
        if baseline:
            for category, tensors in baseline.items():
                _check_category(category, self.categories)
                self._register(tensors, category, move=False)
        self._ledger.note_peak()

    # ----------------------------------------------------------------------------------------------- results
    @property
    def live_bytes(self) -> int:
        """Bytes of the tracked storages alive now."""
        self._ledger.flush()
        return self._ledger.live

    @property
    def peak_bytes(self) -> int:
        """The largest ``live_bytes`` seen so far, baseline included."""
        return self._ledger.peak

    @property
    def breakdown(self) -> dict[str, int]:
        """Bytes by category at the moment of the peak (all categories; the values sum to the peak)."""
        return dict(self._ledger.peak_totals)

    def tracks(self, key: int) -> bool:
        """Whether the storage ``key`` (a key the tracker's listeners were told) is tracked now: a change to 0 bytes
        of one it still tracks is a resize, not a free.

        Example:
            >>> tracker, ones = MemoryTracker(), torch.ones(2)
            >>> tracker.observe(torch.ops.aten.ones.default, ones)
            >>> tracker.tracks(id(ones.untyped_storage()))
            True
        """
        return key in self._ledger.entries

    def live_breakdown(self) -> dict[str, int]:
        """Bytes by category now.

        Example:
            >>> MemoryTracker().live_breakdown()
            {'params': 0, 'grads': 0, 'optimizer': 0, 'activations': 0, 'other': 0}
        """
        self._ledger.flush()
        return dict(self._ledger.totals)

    def reset_peak(self) -> None:
        """Start the peak again from what is live now (for measuring a second step with the same tracker).

        Example:
            >>> tracker = MemoryTracker()
            >>> tracker.reset_peak()
            >>> tracker.peak_bytes
            0
        """
        ledger = self._ledger
        ledger.flush()
        ledger.peak = ledger.live
        ledger.peak_totals = dict(ledger.totals)
        if ledger.recorder is not None:
            ledger.recorder.peaked()

    # ---------------------------------------------------------------------------------------------- controls
    def __enter__(self) -> MemoryTracker:
        if self.budget is not None and self.live_bytes > self.budget:
            self._raise_over_budget(self.live_bytes)
        host = _following_host()
        if host is not None:  # the same operators, seen without one more mode on the stack (cheaper)
            host.followers.append(self.observe)
            self._host = host
        else:
            super().__enter__()
        self._active = True
        self._follow_resizes()
        return self

    def __exit__(self, *exc: object) -> None:
        self._active = False
        if self._unpatch_resize is not None:
            self._unpatch_resize()
            self._unpatch_resize = None
        host, self._host = self._host, None
        if host is not None:
            host.followers.remove(self.observe)
        else:
            super().__exit__(*exc)

    def _follow_resizes(self) -> None:
        """Follow ``UntypedStorage.resize_`` while active: it bypasses the dispatcher, and FSDP2 frees and
        re-allocates its unsharded parameters with it (``resize_(0)``, then back to full size)."""
        original = torch.UntypedStorage.resize_

        def resize_(storage: Any, size: Any) -> Any:
            result = original(storage, size)
            if self._active:
                self._resized(storage)
            return result

        torch.UntypedStorage.resize_ = resize_  # type: ignore[method-assign, assignment]

        def unpatch() -> None:
            torch.UntypedStorage.resize_ = original  # type: ignore[method-assign]

        self._unpatch_resize = unpatch

    def _resized(self, storage: Any) -> None:
        # A fake tensor keeps its storage on meta: follow such a storage where it is tracked (FSDP2 on fake tensors).
        if storage.device.type != self._device_type and not (
            storage.device.type == "meta" and self._ledger.lookup(storage) is not None
        ) or HOST.holds(storage):
            return
        ledger = self._ledger
        ledger.flush()
        ledger.busy = True
        try:
            entry = ledger.lookup(storage)
            change = ledger.resize(entry, storage) if entry is not None else ledger.add(storage, self._category)
        finally:
            ledger.busy = False
        ledger.flush()
        if change > 0:
            new_peak = ledger.note_peak()
            if self.budget is not None and ledger.live > self.budget:
                self._raise_over_budget(ledger.live)
            if self._on_sample is not None:
                self._maybe_sample(new_peak)

    @contextlib.contextmanager
    def phase(self, category: str) -> Iterator[None]:
        """Charge the allocations made inside to ``category``; the previous category comes back afterwards.

        Example:
            >>> tracker = MemoryTracker()
            >>> with tracker, tracker.phase("activations"):
            ...     x = torch.empty(1000)
            >>> tracker.live_breakdown()["activations"]
            4000
        """
        with patched(self, _category=_check_category(category, self.categories)):
            yield

    def mark(self, tensors: Iterable[torch.Tensor | None], category: str) -> None:
        """Move the storages of ``tensors`` (``None`` ignored) to ``category``, adding those not yet tracked.

        Called from ``register_post_accumulate_grad_hook`` hooks it files gradients under ``"grads"`` as
        soon as they exist, so the breakdown at a peak inside ``backward`` shows them there.

        Example:
            >>> tracker = MemoryTracker()
            >>> weight = torch.empty(10)
            >>> tracker.mark([weight, None], "params")
            >>> tracker.live_breakdown()["params"]
            40
        """
        added = self._register(tensors, _check_category(category, self.categories), move=True)
        if added:
            new_peak = self._ledger.note_peak()
            if self._active and self.budget is not None and self._ledger.live > self.budget:
                self._raise_over_budget(self._ledger.live)
            if self._on_sample is not None:
                self._maybe_sample(new_peak)

    def section(self, name: str) -> contextlib.AbstractContextManager[Any]:
        """Mark a part of the step (``"forward"``, ``"backward"``, ``"optimizer"``, ``"prefill"``, ``"decode"``) for the
        timeline recorder listening (:class:`memlab.measure.timeline.StepRecorder`); nothing without one.

        Example:
            >>> with MemoryTracker().section("forward"):
            ...     pass
        """
        recorder = self._ledger.recorder
        return recorder.section(name) if recorder is not None else contextlib.nullcontext()

    def listen(self, recorder: Any) -> Callable[[], None]:
        """Tell ``recorder`` (``changed(key, bytes, category)``, ``peaked()``, ``section(name)``, ``start(entries)``,
        and ``checked()`` where it has one: each check of the peak) every change from now on, after the storages
        live now; returns what stops it.

        Example:
            >>> MemoryTracker().listen(None)()
        """
        ledger = self._ledger
        ledger.flush()
        if recorder is not None:
            recorder.start([(key, entry[2], entry[1]) for key, entry in ledger.entries.items()])
        ledger.recorder = recorder
        ledger.checker = getattr(recorder, "checked", None)

        def stop() -> None:
            ledger.recorder = None
            ledger.checker = None

        return stop

    # ------------------------------------------------------------------------------------------- internals
    def _storages(self, tensor: torch.Tensor) -> tuple[Any, ...]:
        """The storages behind ``tensor`` on this tracker's device (none for storage-less tensors)."""
        if type(tensor) is not torch.Tensor and is_traceable_wrapper_subclass(tensor):
            names, _ = tensor.__tensor_flatten__()  # type: ignore[attr-defined]
            # DTensor also names its device mesh among the flattened attributes: only tensors have storages.
            inner = (getattr(tensor, name) for name in names)
            return tuple(s for t in inner if isinstance(t, torch.Tensor) for s in self._storages(t))
        if self._device_type == "meta":
            try:
                storage = tensor.untyped_storage()
            except Exception:  # sparse and other storage-less layouts
                return ()
            # Fake tensors report their fake device but keep their storage on meta.
            return (storage,) if storage.device.type == "meta" and not HOST.holds(storage) else ()
        device = tensor.device
        if device.type != self._device_type:
            return ()
        if self._device_index is not None and device.index is not None and device.index != self._device_index:
            return ()
        try:
            storage = tensor.untyped_storage()
        except Exception:
            return ()
        return () if HOST.holds(storage) else (storage,)

    def _register(self, tensors: Iterable[torch.Tensor | None], category: str, *, move: bool) -> int:
        ledger = self._ledger
        added = 0
        ledger.flush()
        ledger.busy = True
        try:
            for tensor in tensors:
                if tensor is None:
                    continue
                for storage in self._storages(tensor):
                    entry = ledger.lookup(storage)
                    if entry is None:
                        added += ledger.add(storage, category)
                    elif move:
                        ledger.move(entry, category)
        finally:
            ledger.busy = False
        ledger.flush()
        return added

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        if func in FILLS:
            out = self._fills.run(func, args, kwargs or {}, _call)
        else:
            out = func(*args, **(kwargs or {}))
        try:
            self.observe(func, out)
        except torch.OutOfMemoryError:
            del out  # the error's traceback must not keep this operator's outputs alive
            raise
        return out

    def observe(self, func: Any, out: Any) -> None:
        """Account for ``out``, what the operator ``func`` returned: what the tracker does after each operator while
        it is the active mode. A mode that already runs every operator (a dry run's fake mode) calls it instead, so
        that one more mode on the stack does not slow every operator down.

        Example:
            >>> tracker, ones = MemoryTracker(), torch.ones(8)
            >>> tracker.observe(torch.ops.aten.ones.default, ones)
            >>> tracker.live_bytes
            32
        """
        if isinstance(out, torch.Tensor):
            outputs: Iterable[Any] = (out,)
        elif isinstance(out, (tuple, list)):
            outputs = out if all(not isinstance(o, (tuple, list, dict)) for o in out) else tree_leaves(out)
        elif out is None:
            return
        else:
            outputs = tree_leaves(out)
        aliasing = _returns_alias(func)
        ledger = self._ledger
        category = self._category
        added = 0
        ledger.busy = True
        try:
            for tensor in outputs:
                if not isinstance(tensor, torch.Tensor):
                    continue
                for storage in self._storages(tensor):
                    entry = ledger.lookup(storage)
                    if entry is not None:
                        if aliasing:
                            added += ledger.resize(entry, storage)
                    elif HOST.depth:  # made on the host by the offload (its host_side): marked, never counted
                        if not aliasing:
                            HOST.hold(storage)
                    elif INLINED.depth:
                        continue
                    elif not aliasing:
                        added += ledger.add(storage, category)
        finally:
            ledger.busy = False
        if ledger.pending:
            ledger.flush()
        if added > 0:
            new_peak = ledger.note_peak()
            if self._active and self.budget is not None and ledger.live > self.budget:
                live = ledger.live
                # Drop this frame's references to the outputs: the error's traceback must not keep them alive.
                del out, outputs, tensor, storage
                self._raise_over_budget(live)
            if self._on_sample is not None:
                self._maybe_sample(new_peak)
        elif self._on_sample is not None:
            self._maybe_sample(False)

    def _raise_over_budget(self, live: int) -> None:
        budget = self.budget
        raise torch.OutOfMemoryError(
            f"memlab budget: out of memory: the step needs more than {format_bytes(budget)} "
            f"({budget} bytes; tried to hold {format_bytes(live)}, {live} bytes)"
        )

    def _maybe_sample(self, new_peak: bool) -> None:
        now = time.perf_counter()
        if new_peak or now - self._last_sample >= _SAMPLE_INTERVAL_S:
            self._last_sample = now
            assert self._on_sample is not None
            self._on_sample(self._ledger.live)
