"""CUDA's fused attention on a machine without CUDA: the backend a GPU's ``scaled_dot_product_attention`` picks, and
what it keeps.

A dry run for ``device="cuda"`` on a CPU-only machine runs the CPU's kernels, and the CPU's attention differs most:
with dropout it takes the math path, which keeps the whole attention matrix (and its dropout mask) for backward,
where CUDA's fused kernels keep a few vectors. Fake CUDA tensors cannot stand in (a CPU build of PyTorch aborts
on CUDA's attention operators, and its ``torch.backends.cuda.can_use_flash_attention`` /
``can_use_efficient_attention`` answer False without checking anything: the kernels are not compiled in), so the
fake tensors stay on the CPU and :class:`CudaAttention`, a ``TorchFunctionMode``, replaces
``torch.nn.functional.scaled_dot_product_attention`` during the fake step by what the CUDA backend allocates:

- the backend by PyTorch's own rules (:func:`flash_refusals`, :func:`efficient_refusals`: the ``check_*`` filters
  of ``can_use_flash_attention`` and ``can_use_mem_efficient_attention`` in
  ``aten/src/ATen/native/transformers/cuda/sdp_utils.cpp`` and ``sdp_utils_cpp.h``, in the default priority flash,
  memory-efficient, math, each skipped where ``sdpa_kernel`` or ``torch.backends.cuda.enable_*_sdp`` switched it
  off) for the GPU kind assumed (:mod:`memlab.estimation.cuda.gpus`, default an 80 GB H100, sm90). The rules that decide
  the common cases: flash takes no ``attn_mask``, fp16/bf16 only, head dims equal and at most 256, sm80+; the
  memory-efficient kernel takes fp32 and a mask but needs head dims aligned (8 elements in half precision, 4 in
  float32 on sm80+) and the mask's last dimension contiguous (``check_last_dim_stride_equals_1_dense``: a position
  bias made by ``permute``, as T5's, sends the call to math); neither takes grouped-query heads in a mask's company
  (flash takes ``enable_gqa``, the memory-efficient kernel does not);
- what each backend keeps and allocates, made with the same operators ``aten/src/ATen/native/transformers/
  attention.cpp`` runs before its kernel: a boolean mask turned into an additive float one
  (``convert_boolean_attn_mask``); for memory-efficient, the mask expanded to (B, H, L, S), padded to a multiple of
  16 along its last dimension where it is not one (``preprocess_mask``, ``pad_bias``: a copy, kept for backward),
  and in backward a gradient of the whole expanded mask where the mask requires grad (``_efficient_attention_
  backward``'s ``grad_bias``: a position bias that trains, as T5's); for flash, head dims padded to a multiple of 8
  (``pad_last_dim``); for math, ``_scaled_dot_product_attention_math`` itself, operator by operator: half-precision
  inputs upcast to float32 (unless ``allow_fp16_bf16_reduction_math_sdp``), the float32 probabilities, and with
  dropout CUDA's one-byte dropout mask and the dropped probabilities;
- the fused kernels: flash keeps q, k, v, the output and a float32 logsumexp (B, H, L); memory-efficient the same
  with the logsumexp padded to a multiple of 32 and the mask; backward allocates the three gradients and the
  kernel's own workspace (flash: a float32 dq accumulator and a float32 (B, H, L) row sum; memory-efficient: the
  float32 row sum);
- under autocast, q, k, v (and a float mask) are cast to the autocast dtype first, as CUDA autocast does.

Not modelled: cuDNN attention, which PyTorch puts first only with cuDNN newer than 9.15 on sm90/sm100
(``check_prefer_cudnn_attention``) and takes only without dropout (or with a multiple of 1/16) and without a mask that
requires grad; where it runs it keeps what flash keeps (the output and float32 softmax statistics). Calls the rules
do not cover (:func:`sdpa_gaps`: inputs that are not 4-D, nested tensors) still get the rules' backend, and the
trial's note names the rule that was missing.

Example:
    >>> from memlab.estimation.dryrun.fake import FakeMode
    >>> with FakeMode() as fake, CudaAttention() as attention:
    ...     q = torch.empty(2, 4, 128, 64, dtype=torch.bfloat16)
    ...     out = torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True, dropout_p=0.1)
    >>> tuple(out.shape), attention.backends
    ((2, 4, 128, 64), {'flash'})
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch.nn import functional
from torch.overrides import TorchFunctionMode

from memlab.estimation.cuda.autocast import autocast_dtype
from memlab.estimation.cuda.gpus import GpuKind, kind_or_default

__all__ = [
    "CudaAttention", "attention_note", "efficient_refusals", "flash_refusals", "sdpa_backend", "sdpa_gaps",
]


_SDPA = torch.nn.functional.scaled_dot_product_attention
_HALF = (torch.float16, torch.bfloat16)


def _requires_grad(*tensors: torch.Tensor) -> bool:
    """``input_requires_grad`` (sdp_utils_cpp.h): q, k or v requires grad and grad mode is on."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def _heads(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, enable_gqa: bool, gqa: bool) -> str | None:
    """``check_batch_size_and_num_heads_dense<supports_gqa>``: the refusal, or None."""
    if not query.shape[0] == key.shape[0] == value.shape[0]:
        return "check_batch_size_and_num_heads_dense"
    heads = (query.shape[-3], key.shape[-3], value.shape[-3])
    if enable_gqa and gqa:  # check_grouped_query_attention
        return None if heads[1] == heads[2] and heads[0] % heads[1] == 0 else "check_grouped_query_attention"
    return None if heads[0] == heads[1] == heads[2] else "check_batch_size_and_num_heads_dense"


def _strides(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None,
             ignore_singleton: bool) -> bool:
    """``check_last_dim_stride_equals_1_dense<ignore_singleton_dim>``: q, k, v and the mask contiguous along their
    last dimension."""
    qkv = all(t.stride(-1) == 1 for t in (query, key, value)) or (ignore_singleton and query.shape[-1] == 1)
    return qkv and (mask is None or mask.stride(-1) == 1)


def flash_refusals(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: torch.Tensor | None = None, *,
    dropout_p: float = 0.0, is_causal: bool = False, enable_gqa: bool = False, gpu: GpuKind | None = None,
) -> list[str]:
    """The filters of ``can_use_flash_attention`` (sdp_utils.cpp) the call fails on ``gpu``, by their names in
    PyTorch's source; empty where flash attention takes it.

    Example:
        >>> q = torch.empty(1, 2, 8, 64, dtype=torch.bfloat16)
        >>> flash_refusals(q, q, q), flash_refusals(q.float(), q.float(), q.float(), torch.zeros(8, 8))
        ([], ['check_for_attn_mask', 'check_dtypes_flash_attention'])
    """
    gpu = kind_or_default(gpu)
    refused = []
    if not torch.backends.cuda.flash_sdp_enabled():
        refused.append("check_runtime_disabled_flash")
    if not query.dim() == key.dim() == value.dim() == 4:
        return [*refused, "check_tensor_shapes"]
    if attn_mask is not None:
        refused.append("check_for_attn_mask")
    head_dim = query.shape[-1]
    if not (key.shape[-1] == head_dim == value.shape[-1] and head_dim <= 256):
        refused.append("check_head_dim_size_flash")
    if not (8, 0) <= gpu.capability <= (12, 1):
        refused.append("check_flash_attention_hardware_support")
    narrow = (8, 6) <= gpu.capability <= (8, 9) or (12, 0) <= gpu.capability <= (12, 1)
    if narrow and _requires_grad(query, key, value) and not (
            head_dim <= 192 or (dropout_p == 0 and head_dim > 224)):
        refused.append("check_requires_grad_and_head_dim_gt192_constraints_on_sm86_89_or_120")
    if is_causal and query.shape[-2] != key.shape[-2]:
        refused.append("check_flash_causal_non_square_seqlens")
    if not (query.dtype == key.dtype == value.dtype and query.dtype in _HALF
            and (query.dtype == torch.float16 or gpu.bf16)):
        refused.append("check_dtypes_flash_attention")
    heads = _heads(query, key, value, enable_gqa, gqa=True)
    if heads:
        refused.append(heads)
    if query.shape[-2] == 0 or key.shape[-2] == 0:
        refused.append("check_nonzero_sequence_lengths_dense")
    if not _strides(query, key, value, attn_mask, ignore_singleton=True):
        refused.append("check_last_dim_stride_equals_1_dense")
    return refused


def _gemm_alignment(dtype: torch.dtype, gpu: GpuKind) -> int:
    """``minimum_gemm_alignment`` (sdp_utils.cpp): the elements a head dim must be a multiple of for the
    memory-efficient kernel's GEMMs."""
    half = dtype in _HALF
    tensor_cores = gpu.capability >= (8, 0) or (gpu.capability >= (7, 0) and half)
    alignment = 4 if gpu.capability >= (8, 0) else 1
    return max(alignment, 128 // (16 if half else 32)) if tensor_cores else alignment


def efficient_refusals(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: torch.Tensor | None = None, *,
    enable_gqa: bool = False, gpu: GpuKind | None = None,
) -> list[str]:
    """The filters of ``can_use_mem_efficient_attention`` (sdp_utils.cpp) the call fails on ``gpu``, by their names
    in PyTorch's source; empty where the memory-efficient kernel takes it. Grouped-query heads are refused, as by the
    CUDA builds up to 2.12 (``supports_gqa`` false; pytorch/pytorch#191085 adds them later).

    Example:
        >>> q = torch.empty(1, 2, 8, 64)
        >>> bias = torch.zeros(1, 8, 8, 2).permute(0, 3, 1, 2)  # a (1, 2, 8, 8) bias made by permute
        >>> efficient_refusals(q, q, q, torch.zeros(1, 2, 8, 8)), efficient_refusals(q, q, q, bias)
        ([], ['check_last_dim_stride_equals_1_dense'])
    """
    gpu = kind_or_default(gpu)
    refused = []
    if not torch.backends.cuda.mem_efficient_sdp_enabled():
        refused.append("check_runtime_disabled_mem_efficient")
    if not (5, 0) <= gpu.capability <= (12, 1):
        refused.append("check_mem_efficient_hardware_support")
    if not query.dim() == key.dim() == value.dim() == 4:
        return [*refused, "check_tensor_shapes"]
    alignment = _gemm_alignment(query.dtype, gpu)
    head_dim, value_dim = query.shape[-1], value.shape[-1]
    if not (key.shape[-1] == head_dim and head_dim % alignment == 0 and value_dim % alignment == 0
            and head_dim > 0 and value_dim > 0):
        refused.append("check_head_dim_size_mem_efficient")
    if gpu.capability >= (8, 0) and any(t.numel() and t.storage_offset() % alignment for t in (query, key, value)):
        refused.append("check_data_ptr_alignment_mem_efficient")
    if query.shape[-2] == 0 or key.shape[-2] == 0:
        refused.append("check_nonzero_sequence_lengths_dense")
    if not _strides(query, key, value, attn_mask, ignore_singleton=False):
        refused.append("check_last_dim_stride_equals_1_dense")
    heads = _heads(query, key, value, enable_gqa, gqa=False)
    if heads:
        refused.append(heads)
    allowed = (torch.float16, torch.float32, torch.bfloat16) if gpu.bf16 else (torch.float16, torch.float32)
    if not (query.dtype == key.dtype == value.dtype and query.dtype in allowed):
        refused.append("check_tensor_dtype")
    return refused


def sdpa_backend(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    *,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    enable_gqa: bool = False,
    gpu: GpuKind | None = None,
) -> str:
    """The backend PyTorch's CUDA ``scaled_dot_product_attention`` picks on ``gpu`` (a GPU kind,
    default an H100): ``"flash"``, ``"efficient"`` (memory-efficient) or ``"math"`` (``select_sdp_backend``: the
    first of flash, memory-efficient and math whose filters all pass).

    Example:
        >>> q = torch.empty(1, 2, 8, 64)
        >>> sdpa_backend(q.bfloat16(), q.bfloat16(), q.bfloat16()), sdpa_backend(q, q, q)
        ('flash', 'efficient')
        >>> import dataclasses
        >>> sdpa_backend(q, q, q, gpu=dataclasses.replace(kind_or_default(None), capability=(4, 0)))
        'math'
    """
    if not flash_refusals(query, key, value, attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                          enable_gqa=enable_gqa, gpu=gpu):
        return "flash"
    if not efficient_refusals(query, key, value, attn_mask, enable_gqa=enable_gqa, gpu=gpu):
        return "efficient"
    return "math"


def sdpa_gaps(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: torch.Tensor | None = None
) -> list[str]:
    """What in a ``scaled_dot_product_attention`` call :func:`sdpa_backend`'s rules and the emulated kernels do not
    cover, one phrase per missing rule (empty when they cover it all).

    Example:
        >>> q = torch.empty(2, 4, 8, 64)
        >>> sdpa_gaps(q, q, q), sdpa_gaps(q[0], q[0], q[0])
        ([], ['inputs of 3 dimensions (the rules are for batch, heads, length, head dim)'])
    """
    tensors = (query, key, value)
    if any(t.is_nested for t in tensors):
        return ["nested tensors (no rule for their ragged lengths)"]
    gaps = []
    if any(t.dim() != 4 for t in tensors):
        gaps.append(f"inputs of {query.dim()} dimensions (the rules are for batch, heads, length, head dim)")
    if not torch.backends.cuda.math_sdp_enabled():
        gaps.append("the math backend switched off (no rule for the error CUDA raises where no other backend "
                    "takes the call)")
    return gaps


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def _additive(mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """``convert_boolean_attn_mask``: a boolean mask as an additive one of ``dtype`` (a new tensor); a float mask
    as it is."""
    if mask is None or mask.dtype != torch.bool:
        return mask
    return torch.zeros_like(mask, dtype=dtype).masked_fill_(mask.logical_not(), -math.inf)


def _expanded_mask(mask: torch.Tensor, query: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """``preprocess_mask`` (attention.cpp): the mask expanded to (B, H, L, S); padded to a multiple of 16 along its
    last dimension where it is not one (``pad_bias``: a copy of the whole expanded mask); made contiguous where its
    strides are not multiples of 16."""
    expanded = mask.expand(query.shape[0], query.shape[1], query.shape[2], key.shape[2])
    length = expanded.shape[-1]
    if length % 16:
        return functional.pad(expanded, (0, 16 - length % 16))[..., :length]
    if any(expanded.stride(dim) % 16 for dim in range(3)):
        return expanded.contiguous()
    return expanded


class _FusedKernel(torch.autograd.Function):
    """The memory of one fused CUDA attention kernel (flash or memory-efficient): what its forward returns and
    keeps, what its backward allocates."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None,
        backend: str, logsumexp: bool,
    ) -> torch.Tensor:
        *batch, length, _ = query.shape
        out = query.new_empty((*batch, length, value.shape[-1]))
        saved: list[torch.Tensor] = [query, key, value, out]
        if backend == "flash":
            saved.append(query.new_empty((*batch, length), dtype=torch.float32))
        else:
            rows = _round_up(length, 32) if logsumexp else 0  # compute_logsumexp: only where backward will run
            saved.append(query.new_empty((*batch, rows), dtype=torch.float32))
            if mask is not None:
                saved.append(mask)
        ctx.backend = backend
        ctx.save_for_backward(*saved)
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        query, key, value, *rest = ctx.saved_tensors
        *batch, length, head_dim = query.shape
        workspace: list[torch.Tensor] = []
        if ctx.backend == "flash":
            workspace = [query.new_empty((*batch, _round_up(length, 128), _round_up(head_dim, 32)),
                                         dtype=torch.float32),
                         query.new_empty((*batch, _round_up(length, 128)), dtype=torch.float32)]
        else:
            workspace = [query.new_empty((*batch, length), dtype=torch.float32)]
        grads = (torch.empty_like(query), torch.empty_like(key), torch.empty_like(value))
        mask_grad = None
        if ctx.backend == "efficient" and len(rest) == 3 and ctx.needs_input_grad[3]:
            mask = rest[2]  # _efficient_attention_backward's grad_bias: the expanded mask's size, aligned to 16
            size = mask.shape[-1]
            mask_grad = mask.new_empty((*mask.shape[:-1], _round_up(size, 16)))[..., :size]
        del workspace
        return (*grads, mask_grad, None, None)


def _fused(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None,
           backend: str) -> torch.Tensor:
    """A fused backend's call as attention.cpp makes it: flash's head dims padded to a multiple of 8
    (``pad_last_dim``), the memory-efficient kernel's mask made additive and expanded (``preprocess_mask``)."""
    if backend == "flash":
        head_dim = query.shape[-1]
        pad = -head_dim % 8
        if pad:
            query, key, value = (functional.pad(t, (0, pad)) for t in (query, key, value))
        out = _FusedKernel.apply(query, key, value, None, backend, True)
        return out[..., :head_dim] if pad else out
    mask = _additive(mask, query.dtype)
    if mask is not None:
        mask = _expanded_mask(mask, query, key)
    return _FusedKernel.apply(query, key, value, mask, backend, _requires_grad(query, key, value))


def _math(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None,
          dropout_p: float, is_causal: bool, scale: float | None, enable_gqa: bool) -> torch.Tensor:
    """``_scaled_dot_product_attention_math`` (attention.cpp), operator by operator, with CUDA's fused dropout (a
    one-byte mask kept): what autograd keeps is what it keeps on the GPU."""
    origin = query.dtype
    mask = _additive(mask, origin)
    if origin in _HALF and not torch.backends.cuda.fp16_bf16_reduction_math_sdp_allowed():
        query, key, value = query.float(), key.float(), value.float()
    factor = math.sqrt(scale if scale is not None else 1 / math.sqrt(query.shape[-1]))
    query = query * factor
    if is_causal:
        causal = torch.ones(query.shape[-2], key.shape[-2], dtype=torch.bool, device=query.device).tril()
        mask = _additive(causal, query.dtype)
    if enable_gqa and query.shape[-3] != key.shape[-3]:
        repeats = query.shape[-3] // key.shape[-3]
        key, value = key.repeat_interleave(repeats, -3), value.repeat_interleave(repeats, -3)
    scores = torch.matmul(query, key.transpose(-2, -1) * factor)
    if mask is not None:
        scores = scores.add_(mask)
    probabilities = torch.ops.aten._safe_softmax(scores, -1)
    del scores
    if dropout_p > 0:
        probabilities = torch.ops.aten.native_dropout(probabilities, dropout_p, True)[0]
    out = torch.matmul(probabilities, value)
    if out.dtype == origin:
        return out
    out = out.to(origin)
    weights = probabilities.to(origin)  # the weights in the input's dtype, returned beside the output and dropped
    del weights
    return out


class CudaAttention(TorchFunctionMode):
    """``scaled_dot_product_attention`` as CUDA runs it on ``gpu`` (see the module's docstring), while active.

    ``backends`` collects the backends chosen, and ``gaps`` what the rules did not cover (:func:`sdpa_gaps`), for
    the trial's notes.
    """

    def __init__(self, gpu: GpuKind | None = None) -> None:
        super().__init__()
        self.gpu = kind_or_default(gpu)
        self.backends: set[str] = set()
        self.gaps: set[str] = set()

    def twin(self) -> CudaAttention:
        """A fresh mode for the same GPU that records into the same ``backends`` and ``gaps`` (for checkpointing's
        recompute)."""
        twin = CudaAttention(self.gpu)
        twin.backends, twin.gaps = self.backends, self.gaps
        return twin

    def __torch_function__(
        self, func: Callable[..., Any], types: Sequence[type], args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
    ) -> Any:
        kwargs = dict(kwargs or {})
        if func is not _SDPA:
            return func(*args, **kwargs)
        names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
        bound = {**dict(zip(names, args, strict=False)), **kwargs}
        query, key, value = bound["query"], bound["key"], bound["value"]
        mask = bound.get("attn_mask")
        dtype = autocast_dtype()  # CUDA autocast runs attention in its lower precision
        if dtype is not None:
            query, key, value = (t.to(dtype) if t.is_floating_point() else t for t in (query, key, value))
            if mask is not None and mask.is_floating_point():
                mask = mask.to(dtype)
        dropout_p = float(bound.get("dropout_p") or 0.0)
        is_causal = bool(bound.get("is_causal", False))
        enable_gqa = bool(bound.get("enable_gqa", False))
        backend = sdpa_backend(query, key, value, mask, dropout_p=dropout_p, is_causal=is_causal,
                               enable_gqa=enable_gqa, gpu=self.gpu)
        self.backends.add(backend)
        self.gaps.update(sdpa_gaps(query, key, value, mask))
        with torch.autocast("cpu", enabled=False):  # the op runs outside autocast, as CUDA's autocast calls it
            if backend == "math":
                return _math(query, key, value, mask, dropout_p, is_causal, bound.get("scale"), enable_gqa)
            return _fused(query, key, value, mask, backend)


def attention_note(attention: CudaAttention) -> str | None:
    """The trial's note on the attention kernels assumed, or None when the step called no attention.

    Example:
        >>> attention = CudaAttention()
        >>> attention.backends.add("flash")
        >>> attention_note(attention)
        "CUDA attention emulated for NVIDIA H100 80GB HBM3 (sm90): scaled_dot_product_attention's flash backend"
    """
    if not attention.backends:
        return None
    names = ", ".join(sorted(attention.backends))
    major, minor = attention.gpu.capability
    plural = "s" if len(attention.backends) > 1 else ""
    gaps = f"; what the rules do not cover (their backend assumed): {'; '.join(sorted(attention.gaps))}" if (
        attention.gaps) else ""
    return (f"CUDA attention emulated for {attention.gpu.device_name} (sm{major}{minor}): "
            f"scaled_dot_product_attention's {names} backend{plural}{gaps}")
