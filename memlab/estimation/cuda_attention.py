"""CUDA's fused attention on a machine without CUDA: what a GPU's ``scaled_dot_product_attention`` keeps.

A dry run for ``device="cuda"`` on a CPU-only machine runs the CPU's kernels, and the CPU's attention differs most:
with dropout it takes the math path, which keeps the whole attention matrix (and its dropout mask) for backward,
where CUDA's fused kernels keep a few vectors. Fake CUDA tensors cannot stand in (a CPU build of PyTorch aborts
on CUDA's attention operators), so the fake tensors stay on the CPU and :class:`CudaAttention`, a
``TorchFunctionMode``, replaces ``torch.nn.functional.scaled_dot_product_attention`` during the fake step by an
autograd function that allocates what the CUDA backend PyTorch would choose allocates:

- the backend by PyTorch's rules (``sdp_utils.cpp``, default priority flash, memory-efficient, math) for the
  GPU kind assumed (:mod:`memlab.estimation.gpus`, default an 80 GB H100, sm90): flash needs fp16/bf16, a head dim
  of at most 256 and a multiple of 8, equal q/k/v head dims and no explicit ``attn_mask`` (``is_causal`` is fine),
  sm80+; the memory-efficient kernel also takes fp32 and a mask, but not grouped-query heads (``enable_gqa``);
  math otherwise;
- forward: the output; saved for backward: flash keeps q, k, v, the output and a float32 logsumexp (B, H, L);
  memory-efficient the same with the logsumexp padded to a multiple of 32 and the mask; math the attention
  probabilities (B, H, L, S) in the compute dtype, and with dropout the dropout mask and the dropped probabilities;
- under autocast, q, k, v (and a float mask) are cast to the autocast dtype first, as CUDA autocast does;
- backward: the three gradients, and the kernel's own workspace (flash: a float32 dq accumulator and a float32
  (B, H, L) row sum; memory-efficient: the float32 row sum; math: the gradients of the probabilities).

Calls the rules do not cover (:func:`sdpa_gaps`: inputs that are not 4-D, nested or with a strided last dimension,
a boolean mask, backends switched off with ``torch.nn.attention.sdpa_kernel``) still get the rules' backend, and the
trial's note names the rule that was missing.

Example:
    >>> from memlab.estimation.fake import FakeMode
    >>> with FakeMode() as fake, CudaAttention() as attention:
    ...     q = torch.empty(2, 4, 128, 64, dtype=torch.bfloat16)
    ...     out = torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True, dropout_p=0.1)
    >>> tuple(out.shape), attention.backends
    ((2, 4, 128, 64), {'flash'})
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from memlab.estimation.cuda_autocast import autocast_dtype
from memlab.estimation.gpus import GpuKind, gpu_kind

__all__ = [
    "CudaAttention", "attention_note", "sdpa_backend", "sdpa_gaps",
]


_SDPA = torch.nn.functional.scaled_dot_product_attention
_HALF = (torch.float16, torch.bfloat16)


def sdpa_backend(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    *,
    enable_gqa: bool = False,
    gpu: GpuKind | str | None = None,
) -> str:
    """The backend PyTorch's CUDA ``scaled_dot_product_attention`` picks on ``gpu`` (a GPU kind or its name,
    default an H100): ``"flash"``, ``"efficient"`` (memory-efficient) or ``"math"``.

    Example:
        >>> q = torch.empty(1, 2, 8, 64)
        >>> sdpa_backend(q.bfloat16(), q.bfloat16(), q.bfloat16()), sdpa_backend(q, q, q)
        ('flash', 'efficient')
        >>> import dataclasses
        >>> sdpa_backend(q, q, q, gpu=dataclasses.replace(gpu_kind(), capability=(7, 5)))
        'math'
    """
    gpu = gpu_kind(gpu)
    head_dim = query.shape[-1]
    same_dims = key.shape[-1] == head_dim and value.shape[-1] == head_dim
    grouped = enable_gqa and query.shape[-3] != key.shape[-3]
    dtype = query.dtype
    if (gpu.capability >= (8, 0) and dtype in _HALF and attn_mask is None and same_dims and head_dim <= 256
            and head_dim % 8 == 0):
        return "flash"
    alignment = 4 if dtype == torch.float32 else 8
    if (gpu.capability >= (5, 0) and dtype in (torch.float32, *_HALF) and not grouped
            and head_dim % alignment == 0 and value.shape[-1] % alignment == 0
            and (dtype != torch.bfloat16 or gpu.capability >= (8, 0)) and gpu.capability >= (8, 0)):
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
    if any(t.stride(-1) != 1 for t in tensors):
        gaps.append("a query, key or value whose last dimension is strided (no rule for the fused kernels' strides)")
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        gaps.append("a boolean attn_mask (no rule for the float copy CUDA makes of it; the mask itself is counted)")
    switches = (torch.backends.cuda.flash_sdp_enabled(), torch.backends.cuda.mem_efficient_sdp_enabled(),
                torch.backends.cuda.math_sdp_enabled())
    if not all(switches):
        gaps.append("backends switched off (sdpa_kernel or torch.backends.cuda.enable_*_sdp: no rule for them, "
                    "the default priority assumed)")
    return gaps


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


class _FusedAttention(torch.autograd.Function):
    """The memory of one CUDA attention call: what its forward returns and keeps, what its backward allocates."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None,
        backend: str, dropout_p: float,
    ) -> torch.Tensor:
        *batch, length, _ = query.shape
        source = key.shape[-2]
        out = query.new_empty((*batch, length, value.shape[-1]))
        saved: list[torch.Tensor] = [query, key, value, out]
        if backend == "flash":
            saved.append(query.new_empty((*batch, length), dtype=torch.float32))
        elif backend == "efficient":
            saved.append(query.new_empty((*batch, _round_up(length, 32)), dtype=torch.float32))
            if mask is not None:
                saved.append(mask)
        else:
            scores = query.new_empty((*batch, length, source))
            probabilities = torch.empty_like(scores)
            del scores
            saved.append(probabilities)
            if dropout_p > 0:
                saved += [torch.empty_like(probabilities, dtype=torch.bool), torch.empty_like(probabilities)]
        ctx.backend = backend
        ctx.save_for_backward(*saved)
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        query, key, value, *_ = ctx.saved_tensors
        *batch, length, head_dim = query.shape
        workspace: list[torch.Tensor] = []
        if ctx.backend == "flash":
            workspace = [query.new_empty((*batch, _round_up(length, 128), _round_up(head_dim, 32)),
                                         dtype=torch.float32),
                         query.new_empty((*batch, _round_up(length, 128)), dtype=torch.float32)]
        elif ctx.backend == "efficient":
            workspace = [query.new_empty((*batch, length), dtype=torch.float32)]
        else:
            probabilities_grad = query.new_empty((*batch, length, key.shape[-2]))
            workspace = [probabilities_grad, torch.empty_like(probabilities_grad)]
        grads = (torch.empty_like(query), torch.empty_like(key), torch.empty_like(value))
        del workspace
        return (*grads, None, None, None)


class CudaAttention(TorchFunctionMode):
    """``scaled_dot_product_attention`` as CUDA runs it on ``gpu`` (see the module's docstring), while active.

    ``backends`` collects the backends chosen, and ``gaps`` what the rules did not cover (:func:`sdpa_gaps`), for
    the trial's notes.
    """

    def __init__(self, gpu: GpuKind | str | None = None) -> None:
        super().__init__()
        self.gpu = gpu_kind(gpu)
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
        enable_gqa = bool(bound.get("enable_gqa", False))
        backend = sdpa_backend(query, key, value, mask, enable_gqa=enable_gqa, gpu=self.gpu)
        self.backends.add(backend)
        self.gaps.update(sdpa_gaps(query, key, value, mask))
        if backend == "math" and enable_gqa and query.shape[-3] != key.shape[-3]:
            repeats = query.shape[-3] // key.shape[-3]
            key, value = key.repeat_interleave(repeats, -3), value.repeat_interleave(repeats, -3)
        return _FusedAttention.apply(query, key, value, mask, backend, dropout_p)


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

