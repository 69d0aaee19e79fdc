"""The fake side of every dry run: one fake mode, one fake copy of a model, one fake batch, on the device an estimate
answers for (:mod:`memlab.estimation.cuda.devices`). Single-GPU estimates (:mod:`memlab.estimation.dryrun.single_gpu`)
and the FSDP2 dry run (:mod:`memlab.estimation.sharded.fsdp2`) build their model and batch here.

Tensors of PyTorch's ``FakeTensorMode`` have shapes, dtypes, devices and storages, and no data: nothing is computed,
no memory is taken. A live ``nn.Module`` is copied with ``copy.deepcopy`` whose memo already maps every parameter,
buffer and tensor attribute to a fake twin (``FakeTensorMode.from_tensor``: no data is copied; tied weights and
views stay shared), so the live model, its gradients, hooks and flags are never touched. A transformers config (or a
name of one) is built on the ``meta`` device (:func:`memlab.estimation.configs.meta_model`) and copied the same way.
"""

from __future__ import annotations

import contextlib
import copy
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch._prims_common import suggest_memory_format
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from memlab.errors import MemlabError
from memlab.estimation.configs import is_transformers_config, load_config, meta_model, one_line
from memlab.estimation.cuda.devices import kernels_device, target_device
from memlab.estimation.dryrun.fake_values import constant_step, on_cpu, placed
from memlab.estimation.dryrun.triton_guard import start_skipping, stop_skipping
from memlab.estimation.dryrun.triton_launches import SkippedKernels
from memlab.estimation.dryrun.unknown import assume_sdpa, attention_implementation_note, is_foreign, unknown_attention
from memlab.live.batch import Batch, StepBatches, map_tensors
from memlab.live.compat import (
    fake_cache_key_matches,
    fake_meta_handlers,
    fake_rules_for_higher_order_operators,
    grouped_mm,
)
from memlab.live.patching import patched
from memlab.live.quiet import quiet
from memlab.live.rebind import rebind_forwards
from memlab.live.sharding import whole_shape
from memlab.measure.tracker import FILLS, FormulaFills

__all__ = [
    "BLIND_SPOTS",
    "FakeMode",
    "FakeSetup",
    "fake_batch",
    "fake_copy",
    "fake_model",
    "fake_setup",
    "one_thread",
]

BLIND_SPOTS = (
    "estimated on fake tensors: peak_bytes is the allocated peak (memory an operator takes and gives back inside "
    "itself is not in it)"
)
"""The note every estimate carries: what no fake-tensor run can see."""

_INTEGER_NAMES = ("input_ids", "labels", "decoder_input_ids", "attention_mask", "token_type_ids", "position_ids")

VALUE_LIMIT = 1 << 24
"""Elements a result computed from values alone may have and still keep its values (image batches only)."""

IMAGE_INPUTS = ("pixel_values", "pixel_values_videos")
"""Keys that make a batch an image batch, whose integer tensors keep their values in a dry run (:func:`fake_batch`)."""

_META_HANDLERS = fake_meta_handlers()
_GROUPED_MM = grouped_mm()  # None before torch 2.8
_ADDMM_OUT_DTYPE = frozenset(getattr(torch.ops.aten.addmm, name) for name in ("dtype", "dtype_out")
                             if name in torch.ops.aten.addmm.overloads())
_ONEDNN_LSTM = 2  # mkldnn_rnn_layer's mode for an LSTM
_ONEDNN_LSTM_WORKSPACE_FLOATS = 15.6
"""Floats of oneDNN's LSTM training workspace per hidden unit, time step and row (the upper end measured)."""


class FakeMode(FakeTensorMode):
    """``FakeTensorMode`` that runs what the real kernels run where PyTorch's fake rules are stricter or blind:

    - reading a value that was never computed gives 0 instead of an error (values known to fake tensors, such as
      AdamW's step counter, are read as they are);
    - ``nonzero`` (a data-dependent shape; DeBERTa uses it) answers its largest possible result, every element
      nonzero, so the estimate leans high rather than failing;
    - ``_grouped_mm`` (mixture-of-experts layers) accepts float32, as the CPU kernel does, where its fake rule asks
      for bf16: it is computed on bf16 twins and its result has the inputs' dtype;
    - a derivative formula that fills fresh zeros in place on real tensors (``gather``'s: ``scatter_add_``) and out
      of place on fake ones fills them in place here too (:class:`~memlab.measure.tracker.FormulaFills`), so the dry
      run does not hold the zeros and their filled copy at once;
    - oneDNN's LSTM layer (``mkldnn_rnn_layer``) keeps a workspace for backward that its fake rule leaves empty:
      it is given the size the real kernel takes, :data:`_ONEDNN_LSTM_WORKSPACE_FLOATS` floats per hidden unit,
      time step and row (measured on torch 2.13 from 64 to 1024 hidden units: 15.0 to 15.6).

    ``foreign_ops`` collects the operators outside PyTorch's own it runs (custom ops, extensions' ops: see
    :func:`memlab.estimation.dryrun.unknown.is_foreign`), for the estimate's notes; the caller clears it between steps.

    Example:
        >>> with FakeMode():
        ...     total = torch.ones(3).sum()
        >>> total.item()  # never computed: read as 0
        0.0
    """

    def __init__(self) -> None:
        super().__init__(allow_non_fake_inputs=True)
        self.keeps_values = False
        self._values_modes: list[contextlib.AbstractContextManager[None]] = []
        """Whether results computed from constant inputs alone stay constant (up to :data:`VALUE_LIMIT` elements):
        set by :func:`fake_batch` for a batch with image inputs, whose values it keeps."""
        self.foreign_ops: set[str] = set()
        self.skipped_kernels = SkippedKernels()
        """The Triton kernels a launch of which was skipped because it was given fake tensors
        (:mod:`memlab.estimation.dryrun.triton_guard`), with what each launch took itself
        (:mod:`memlab.estimation.dryrun.triton_launches`)."""
        self._launch_guards = 0
        self._foreign: dict[Any, bool] = {}
        self.observer: Callable[[Any, Any], None] | None = None
        """Called with each operator and what it returned (operators this mode runs inside another one are not
        reported): :meth:`memlab.measure.tracker.MemoryTracker.observe`, without one more mode on the stack."""
        self.followable = False
        """Whether a :class:`~memlab.measure.tracker.MemoryTracker` entered while this mode is the only one on the
        stack follows this mode's operators (``followers``) instead of being one more mode above it: the same
        operators, cheaper. Set by the one-GPU dry run; where a tensor subclass's operator came (this mode answers
        it NotImplemented, and the subclass's own operators would reach a follower but not a tracker mode),
        ``unfollowed`` is set and the dry run runs that trial again without followers."""
        self.followers: list[Callable[[Any, Any], None]] = []
        """Called after the observer, in order, with each operator this mode runs and what it returned."""
        self.unfollowed = False
        self.tagger: Any = None
        """A dry run of a few layers kept to be carried to the full depth
        (:class:`~memlab.estimation.depth.log.DepthLog`): told of each operator before the observer and followers
        (``operator_ran(func, args, kwargs, out)``)."""
        self._depth = 0
        self._fills = FormulaFills()

    @property
    def avoid_device_init(self) -> bool:
        # PyTorch's FakeTensorMode touches the real GPU where the machine has one: a constant moved to it is moved
        # for real, and torch.tensor(..., device="cuda") is made there before it is faked. A dry run never does.
        return True

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # TorchDispatchMode wraps a subclass's __torch_dispatch__ in torch._disable_dynamo (four eval-frame switches a
        # call, which C++ makes for every operator and metadata query of a dry run); FakeTensorMode's own, which
        # this one calls for every operator, stays wrapped, so no Dynamo frame reaches what it runs.
        return False

    def __torch_dispatch__(
        self, func: Any, types: Any, args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None
    ) -> Any:
        # Metadata queries (``prim.device`` above all: C++ asks a fake tensor its device tens of thousands of times a
        # step) are answered as FakeTensorMode answers them, without its dispatch's overhead; they allocate
        # nothing, so the observer has nothing to see.
        meta = _META_HANDLERS.get(func)
        if meta is not None:
            return meta(args)
        tagger = self.tagger
        if self.observer is None and not self.followers and tagger is None:
            return self._dispatch(func, types, args, kwargs)
        self._depth += 1
        try:
            out = self._dispatch(func, types, args, kwargs)
        finally:
            self._depth -= 1
        if self._depth == 0:
            if tagger is not None:
                tagger.operator_ran(func, args, kwargs, out)
            if self.observer is not None:
                self.observer(func, out)
            if out is NotImplemented and self.followers:
                self.unfollowed = True
            try:
                for follow in self.followers:
                    follow(func, out)
            except torch.OutOfMemoryError:
                del out  # the error's traceback must not keep this operator's outputs alive
                raise
        return out

    def __enter__(self) -> Any:
        entered = super().__enter__()
        if not self._launch_guards:  # entered again inside itself (its dispatch does): one guard
            start_skipping(self.skipped_kernels)
            fake_rules_for_higher_order_operators(type(self))
        self._launch_guards += 1
        if self.keeps_values:
            values = _constant_data()
            values.__enter__()
            self._values_modes.append(values)
        return entered

    def __exit__(self, *exc: Any) -> Any:
        if self._values_modes:
            self._values_modes.pop().__exit__(*exc)
        if self._launch_guards:
            self._launch_guards -= 1
            if not self._launch_guards:
                stop_skipping(self.skipped_kernels)
        return super().__exit__(*exc)

    def _prep_args_for_hash(self, result: list[object], args: Any, state: Any, id_hashed_objects: list[object]
                            ) -> None:
        # FakeTensorMode's dispatch cache key, the same list of values, written for speed (a dry run builds one per
        # operator): plain values and our own dense fake tensors inline, anything else by FakeTensorMode's own code.
        if isinstance(args, (list, tuple, dict)):
            result.append(type(args))
            result.append(f"length_{len(args)}")
        if isinstance(args, dict):
            self._prep_args_for_hash(result, args.keys(), state, id_hashed_objects)
            self._prep_args_for_hash(result, args.values(), state, id_hashed_objects)
            return
        append = result.append
        for arg in args:
            kind = type(arg)
            if kind in _PLAIN_KEY_TYPES:
                append(kind)
                append(arg)
            elif kind is FakeTensor and arg.fake_mode is self and arg.constant is None and (
                    arg.layout == torch.strided and not arg._has_symbolic_sizes_strides):
                _tensor_key(arg, result)
            elif kind is list or kind is tuple:
                self._prep_args_for_hash(result, arg, state, id_hashed_objects)
            else:  # FakeTensorMode's own handling of one argument, without the tuple's two entries around it
                mark = len(result)
                super()._prep_args_for_hash(result, (arg,), state, id_hashed_objects)  # type: ignore[misc]
                del result[mark:mark + 2]

    def may_turn_const(self, t: torch.Tensor) -> bool:
        # PyTorch keeps only one-element results constant; image token positions, grids and padding images need
        # whole tensors.
        if self.keeps_values and t.numel() <= VALUE_LIMIT:
            return not t.is_sparse and not self.is_our_fake(t) and t.device.type != "meta"
        return super().may_turn_const(t)

    def _dispatch(
        self, func: Any, types: Any, args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None
    ) -> Any:
        kwargs = kwargs or {}
        foreign = self._foreign.get(func)
        if foreign is None:
            foreign = self._foreign[func] = is_foreign(func)
        if foreign:
            self.foreign_ops.add(func.name().removesuffix(".default"))
        if self.keeps_values:  # made on the CPU, whatever device they are for (memlab.estimation.dryrun.fake_values)
            if func in _VALUE_FACTORIES and _integer_factory(func, args, kwargs):
                device = torch.device(kwargs.get("device") or "cpu")
                if device.type != "meta":
                    made = on_cpu(func, args, kwargs)
                    if made.numel() <= VALUE_LIMIT:
                        return placed(self, made, device)
            else:
                stepped = constant_step(self, func, args, kwargs,
                                        lambda: super(FakeMode, self).__torch_dispatch__(func, types, args, kwargs))
                if stepped is not NotImplemented:
                    return stepped
        if func is torch.ops.aten._local_scalar_dense.default:
            tensor = args[0]
            if not (isinstance(tensor, FakeTensor) and tensor.constant is not None):
                if tensor.dtype == torch.bool:
                    return False
                return 0.0 if tensor.dtype.is_floating_point or tensor.dtype.is_complex else 0
        if func is torch.ops.aten.equal.default:  # values compared, which fakes hide: read as unequal (the branch
            return False  # Liger's cross-entropy backward takes when its grad_output is not 1, in place either way)
        if func is torch.ops.aten.nonzero.default:
            tensor = args[0]
            with self:
                return torch.empty((tensor.numel(), tensor.dim()), dtype=torch.int64, device=tensor.device)
        if func is torch.ops.aten.mkldnn_rnn_layer.default and args[9] == _ONEDNN_LSTM and args[15]:
            results: tuple[torch.Tensor, ...] = super().__torch_dispatch__(func, types, args, kwargs)  # type: ignore[assignment]
            output, hidden, cell, workspace = results
            if workspace.numel() == 0:
                floats = int(_ONEDNN_LSTM_WORKSPACE_FLOATS * args[0].shape[0] * args[0].shape[1] * args[10])
                with self:
                    workspace = torch.empty(floats * 4, dtype=torch.uint8, device=workspace.device)
            return output, hidden, cell, workspace
        if func in FILLS:
            return self._fills.run(func, args, kwargs,
                                   lambda op, a, k: super(FakeMode, self).__torch_dispatch__(op, types, a, k))
        if func in _ADDMM_OUT_DTYPE:
            # torch 2.11's fake mode decomposes addmm's out_dtype overloads as the plain addmm, out_dtype read as beta
            # (a TypeError; TRL's fused LM head calls them on CUDA): the result is made here, as 2.13 makes it.
            out = kwargs.get("out")
            if out is not None:
                return out
            dtype = args[3] if len(args) > 3 else kwargs["out_dtype"]
            with self:
                return torch.empty((args[1].shape[0], args[2].shape[1]), dtype=dtype, device=args[0].device)
        if func is _GROUPED_MM and args[0].dtype != torch.bfloat16:
            dtype = kwargs.get("out_dtype") or args[0].dtype
            with self:
                twins = [a.to(torch.bfloat16) if isinstance(a, torch.Tensor) and a.is_floating_point() else a
                         for a in args]
                return func(*twins, **{**kwargs, "out_dtype": None}).to(dtype)
        return super().__torch_dispatch__(func, types, args, kwargs)


if not fake_cache_key_matches():  # a torch whose cache key takes other arguments keeps its own
    del FakeMode._prep_args_for_hash


_PLAIN_KEY_TYPES = frozenset({int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout,
                              torch.memory_format})
"""Argument types FakeTensorMode's cache key holds as (type, value)."""


def _tensor_key(tensor: FakeTensor, result: list[object]) -> None:
    """What FakeTensorMode's cache key holds for a dense fake tensor of plain sizes (``extract_tensor_metadata``
    flattened): the same values, in the same order."""
    shape, stride = tensor.shape, tensor.stride()
    suggested = suggest_memory_format(tensor) if len(shape) in (4, 5) else torch.contiguous_format
    memory_format = suggested if tensor.is_contiguous(memory_format=suggested) else None
    append = result.append
    append(tensor.dtype)
    append(torch.Size)
    append(f"length_{len(shape)}")
    for size in shape:
        append(int)
        append(size)
    append(tuple)
    append(f"length_{len(stride)}")
    for step in stride:
        append(int)
        append(step)
    result += (tensor.device, tensor.layout, memory_format, tensor.storage_offset(),
               tensor.untyped_storage().nbytes(), tensor.requires_grad, tensor.is_quantized, tensor.is_conj(),
               tensor.is_neg(), tensor.is_inference(), tensor.is_sparse, None, None, None)


@contextlib.contextmanager
def _constant_data() -> Iterator[None]:
    """While active, ``torch.tensor`` / ``torch.as_tensor`` of a list holding fake tensors with values reads their
    values, as on real tensors (``torch.tensor`` copies its data without dispatch, where a fake tensor has none).
    Written as a scoped replacement because PyTorch has no hook for it; the originals are put back on exit."""
    from torch.utils._pytree import tree_map_only

    originals = torch.tensor, torch.as_tensor

    def reading(make: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        def made(data: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
            if isinstance(data, (list, tuple)):
                data = tree_map_only(FakeTensor, lambda t: t if t.constant is None else t.constant, data)
            return make(data, *args, **kwargs)

        return made

    with patched(torch, tensor=reading(originals[0]), as_tensor=reading(originals[1])):
        yield


_VALUE_FACTORIES = {
    torch.ops.aten.arange.default, torch.ops.aten.arange.start, torch.ops.aten.arange.start_step,
    torch.ops.aten.zeros.default, torch.ops.aten.ones.default, torch.ops.aten.full.default,
}
"""Factories whose integer results keep their values in a dry run that keeps values (positions, index tensors)."""


def _integer_factory(func: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> bool:
    """Whether a factory call of :data:`_VALUE_FACTORIES` makes an integer or boolean tensor."""
    dtype = kwargs.get("dtype")
    if dtype is None:
        if func is torch.ops.aten.full.default:
            return isinstance(args[1], (bool, int))
        if func in (torch.ops.aten.zeros.default, torch.ops.aten.ones.default):
            return False
        return all(isinstance(arg, int) for arg in args)
    return not (dtype.is_floating_point or dtype.is_complex)


# --- the fake model and batch ----------------------------------------------------------------------------------------


def fake_model(model_or_config: Any, mode: FakeTensorMode, device: torch.device) -> nn.Module:
    """The model of a dry run on fake tensors of ``mode`` on ``device``: a live model copied (:func:`fake_copy`), a
    transformers config or a name built on the meta device first.

    Example:
        >>> model = fake_model("gpt2", FakeMode(), torch.device("cpu"))
        >>> type(model).__name__, isinstance(model.lm_head.weight, FakeTensor)
        ('GPT2LMHeadModel', True)
    """
    if isinstance(model_or_config, nn.Module):
        from memlab.estimation.dryrun.adapters import fake_quantized_layers  # here: it builds on the techniques

        try:
            copied = fake_copy(model_or_config, mode, device)
            fake_quantized_layers(copied, mode, device, model_or_config)  # a model loaded in 4-bit or 8-bit
            return copied
        except MemlabError:
            raise
        except Exception as error:  # noqa: BLE001 - tensor subclasses, objects deepcopy cannot copy...
            raise MemlabError(
                f"could not copy the {type(model_or_config).__name__} onto fake tensors ({one_line(error)}); "
                "pass its transformers config (model.config) instead"
            ) from None
    if isinstance(model_or_config, (str, os.PathLike)):
        model_or_config = load_config(model_or_config)
    if is_transformers_config(model_or_config):
        return fake_copy(meta_model(model_or_config), mode, device)
    raise MemlabError(
        f"cannot estimate a {type(model_or_config).__name__}; pass an nn.Module, a transformers config, "
        'or a name such as "llama-7b" or a path to a config.json'
    )


def fake_copy(model: nn.Module, mode: FakeTensorMode, device: torch.device) -> nn.Module:
    """A deep copy of ``model`` whose tensors are fake (no data copied); the model itself is not touched.

    Example:
        >>> live = nn.Linear(4, 2)
        >>> copied = fake_copy(live, FakeMode(), torch.device("cpu"))
        >>> isinstance(copied.weight.data, FakeTensor), isinstance(live.weight.data, FakeTensor)
        (True, False)
    """
    memo: dict[int, Any] = {}
    for module in model.modules():
        for tensor in [*module._parameters.values(), *module._buffers.values(), *vars(module).values()]:
            if isinstance(tensor, torch.Tensor) and id(tensor) not in memo:
                fake = _fake_tensor(tensor, mode, device)
                if isinstance(tensor, nn.Parameter):
                    fake = nn.Parameter(fake, requires_grad=tensor.requires_grad)
                memo[id(tensor)] = fake
    with torch.no_grad():
        copied = copy.deepcopy(model, memo)
    rebind_forwards(copied, memo)  # a forward wrapped on the live model (TRL's fused LM head) calls the copy
    return copied


def _fake_tensor(tensor: torch.Tensor, mode: FakeTensorMode, device: torch.device) -> torch.Tensor:
    """A fake twin of ``tensor`` on ``device``: same shape, strides, dtype; no data."""
    if isinstance(tensor, FakeTensor) and tensor.fake_mode is mode and tensor.device == device:
        return tensor
    if getattr(tensor, "ds_shape", None) is not None:  # a ZeRO-3 partition: the whole parameter, as gathered
        with mode:
            return torch.empty(whole_shape(tensor), dtype=tensor.dtype, device=device)
    detached = tensor.detach()
    if detached.device == device and not isinstance(detached, FakeTensor):
        return mode.from_tensor(detached)  # views and tied storages stay shared
    with mode:
        return torch.empty_strided(detached.size(), detached.stride(), dtype=detached.dtype, device=device)


def fake_batch(batch: Any, mode: FakeTensorMode, device: str | torch.device = "cpu") -> Batch:
    """The batch on fake tensors of ``mode`` on ``device``: tensors are faked, shapes become fake tensors.

    A shape is a tuple, list or ``torch.Size`` of ints; its dtype comes from its name (``*_ids``, ``labels``,
    ``attention_mask``: int64; others float32).

    A batch with image inputs (:data:`IMAGE_INPUTS`: a vision-language processor's) keeps the values of its tensors
    (a copy: the image token positions in ``input_ids``, ``image_grid_thw``, the pixels) as the fake tensors'
    constants, and ``mode`` computes what they alone decide as a real step would: how many image tokens each image
    fills, the vision tower's grids and splits, which images are padding. Whatever the model's weights touch (every
    activation) stays without data.

    Example:
        >>> batch = fake_batch({"input_ids": (2, 8), "pixel_values": (2, 3, 4, 4)}, FakeTensorMode())
        >>> batch["input_ids"].dtype, tuple(batch["pixel_values"].shape)
        (torch.int64, (2, 3, 4, 4))
    """
    device = torch.device(device)

    keep = isinstance(batch, Mapping) and any(key in batch for key in IMAGE_INPUTS)
    if keep and isinstance(mode, FakeMode):
        mode.keeps_values = True

    def convert(name: str, value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            if keep and value.device.type != "meta":  # the values on the CPU, for a fake tensor on any device
                return placed(mode, value.detach().to("cpu").clone(), device)
            return _fake_tensor(value, mode, device)
        if _is_shape(value):
            dtype = torch.int64 if _is_integer_name(name) else torch.float32
            with mode:
                return torch.zeros(tuple(int(v) for v in value), dtype=dtype, device=device)
        return value

    if isinstance(batch, StepBatches):  # a trainer's micro-batches, each collated as its loader does
        return StepBatches(lambda rows, steps: [fake_batch(part, mode, device) if isinstance(part, Mapping)
                                                else map_tensors(part, lambda t: _fake_tensor(t, mode, device))
                                                for part in batch.micro_batches(rows, steps)],
                           batch.rows, batch.describe)
    if isinstance(batch, Mapping):
        return {key: convert(str(key), value) for key, value in batch.items()}
    if isinstance(batch, torch.Tensor):
        return _fake_tensor(batch, mode, device)
    if isinstance(batch, (tuple, list)) and not _is_shape(batch):
        values = [convert("", value) for value in batch]
        return type(batch)(*values) if hasattr(batch, "_fields") else type(batch)(values)
    raise MemlabError(
        f"a batch of type {type(batch).__name__} cannot be estimated; pass tensors, or shapes such as "
        '{"input_ids": (1, 512), "labels": (1, 512)}'
    )


def _is_shape(value: Any) -> bool:
    shape = (
        isinstance(value, (tuple, list, torch.Size))
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
        and len(value) > 0
    )
    if shape and min(value) < 1:
        raise MemlabError(f"shape {tuple(value)} has a size below 1; write sizes >= 1, such as (1, 512)")
    return shape


def _is_integer_name(name: str) -> bool:
    name = name.strip("'\"")
    return name in _INTEGER_NAMES or name.endswith("_ids") or name.endswith("labels") or name.endswith("_mask")


# --- a dry run's set-up ----------------------------------------------------------------------------------------------


@dataclass
class FakeSetup:
    """What a dry run runs on: the fake model and batch, the fake mode they live in, the device the estimate
    answers for (``target``), the device whose kernels run the fake step (``kernels``), and what every estimate
    made on them must say (``notes``: an attention implementation without a rule, say)."""

    model: nn.Module
    batch: Batch
    mode: FakeMode
    target: torch.device
    kernels: torch.device
    notes: tuple[str, ...] = ()


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """PyTorch's intra-op threads set to one while a dry run runs, and back after.

    A dry run computes no values, but it builds a few real tensors whose values it throws away (the adapters peft
    makes before their fake twins replace them, for one). Such small operators wake every thread of the pool; on a
    busy machine each wake-up waits for a core, and a 7B adapter's 224 layers took seconds of it. Threads change no
    shape, dtype or device, so no estimate changes.

    Example:
        >>> before = torch.get_num_threads()
        >>> with one_thread():
        ...     torch.get_num_threads()
        1
        >>> torch.get_num_threads() == before
        True
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def fake_setup(
    model_or_config: Any,
    batch: Any,
    device: str | torch.device | None,
    verbose: bool = False,
    *,
    kernels: torch.device | None = None,
) -> FakeSetup:
    """The fake model and batch of a dry run for ``device`` (see
    :func:`~memlab.estimation.cuda.devices.target_device`), on the kernels of
    :func:`~memlab.estimation.cuda.devices.kernels_device` unless ``kernels`` names them (the FSDP2 dry run shards on
    the CPU).

    Example:
        >>> setup = fake_setup(nn.Linear(4, 2), {"x": (3, 4)}, "cuda")
        >>> str(setup.target).startswith("cuda"), tuple(setup.batch["x"].shape), setup.batch["x"].dtype
        (True, (3, 4), torch.float32)
    """
    target = target_device(model_or_config, device)
    kernels = kernels_device(target) if kernels is None else kernels
    mode = FakeMode()
    # The CPU's kernels cannot run an attention implementation without a rule (flash-attention, flex attention...):
    # the fake model says "sdpa" instead. A config is copied first, since building may refuse the implementation.
    replace = kernels.type == "cpu"
    if replace and isinstance(model_or_config, (str, os.PathLike)):
        model_or_config = load_config(model_or_config)
    unknown: list[str] = []
    if replace and is_transformers_config(model_or_config) and unknown_attention(model_or_config):
        model_or_config = copy.deepcopy(model_or_config)
        unknown = assume_sdpa(model_or_config)
    # Quiet from the start: building the model and importing bitsandbytes (for QLoRA) log too, not only the steps.
    with quiet(verbose):
        model = fake_model(model_or_config, mode, kernels)
    unknown += assume_sdpa(model) if replace else unknown_attention(model)
    note = attention_implementation_note(unknown, replaced=replace, cuda=target.type == "cuda")
    return FakeSetup(model, fake_batch(batch, mode, kernels), mode, target, kernels, (note,) if note else ())
