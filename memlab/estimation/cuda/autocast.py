"""CUDA autocast's dtypes on a machine without CUDA: a dry run for ``device="cuda"`` under CPU autocast, corrected.

``torch.autocast("cuda")`` is disabled on a CPU build, so the fake step of a bf16/fp16 plan runs under CPU autocast,
whose op lists differ from CUDA's (``aten/src/ATen/autocast_mode.cpp``): the CPU leaves ``softmax``,
``layer_norm``, ``pow`` or ``exp`` in the input's dtype where CUDA computes them in float32, which changes what the
step keeps for backward (GPT-2's GELU, for one, turns float32 after its ``pow``). :class:`CudaAutocast`, a
``TorchFunctionMode``, runs while CPU autocast is on and makes its dtypes CUDA's:

- the inputs of CUDA's float32 ops (:data:`CUDA_FP32`: its ``fp32`` and ``fp32_set_opt_dtype`` lists, by function
  name, whether called as ``torch.x``, ``Tensor.x`` or ``F.x``) are cast from fp16/bf16 to float32;
- the inputs of CUDA's lower-precision ops that the CPU's list lacks (:data:`CUDA_LOWER_ONLY`: ``einsum``, ``mv``,
  ``addmv``, ``addr``, ``chain_matmul``, ``multi_dot``) are cast to the autocast dtype; the ops both lists share
  (``linear``, ``matmul``, ``mm``, ``bmm``, ``baddbmm``, ``addmm``, convolutions) are left to CPU autocast;
- ``scaled_dot_product_attention`` is cast by :class:`~memlab.estimation.cuda.attention.CudaAttention`.

What it does not cover: CUDA's "promote" list (ops with mixed inputs run in the widest dtype on both devices
already), ops called below the Python API (a C++ extension, a custom kernel), and ops the CPU list casts to float32
where CUDA's does not (CPU autocast's ``cross_entropy`` cast and CUDA's float32 ``log_softmax`` inside it take the
same memory).

Example:
    >>> with torch.autocast("cpu", dtype=torch.bfloat16), CudaAutocast():
    ...     probabilities = torch.randn(2, 4).bfloat16().softmax(-1)
    >>> probabilities.dtype  # CPU autocast alone leaves it bf16
    torch.float32
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_map

__all__ = ["CUDA_FP32", "CUDA_LOWER_ONLY", "CudaAutocast", "autocast_dtype"]

CUDA_FP32 = frozenset({
    # autocast_mode.cpp, CUDA: fp32
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal", "rsqrt",
    "sinh", "tan", "pow", "__pow__", "__rpow__", "softplus", "layer_norm", "group_norm", "frobenius_norm",
    "nuclear_norm",
    "cosine_similarity", "poisson_nll_loss", "cosine_embedding_loss", "nll_loss", "hinge_embedding_loss", "kl_div",
    "l1_loss", "smooth_l1_loss", "huber_loss", "mse_loss", "margin_ranking_loss", "multilabel_margin_loss",
    "soft_margin_loss", "triplet_margin_loss", "multi_margin_loss", "binary_cross_entropy_with_logits", "dist",
    "pdist", "cdist", "renorm", "logsumexp",
    # fp32_set_opt_dtype
    "prod", "softmax", "log_softmax", "cumprod", "cumsum", "linalg_vector_norm", "linalg_matrix_norm", "sum",
})
"""The functions CUDA autocast runs in float32 (by name)."""

CUDA_LOWER_ONLY = frozenset({"einsum", "mv", "addmv", "addr", "chain_matmul", "multi_dot"})
"""The functions CUDA autocast runs in its lower precision and CPU autocast does not (by name)."""

_HALF = (torch.float16, torch.bfloat16)


def _cast(dtype: torch.dtype, only: tuple[torch.dtype, ...]) -> Callable[[Any], Any]:
    def cast(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.is_floating_point() and value.dtype in only:
            return value.to(dtype)
        return value

    return cast


class CudaAutocast(TorchFunctionMode):
    """CUDA autocast's dtypes while CPU autocast is on (see the module's docstring); nothing while it is off."""

    def __torch_function__(
        self, func: Callable[..., Any], types: Sequence[type], args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
    ) -> Any:
        kwargs = dict(kwargs or {})
        if not torch.is_autocast_enabled("cpu"):
            return func(*args, **kwargs)
        name = getattr(func, "__name__", "")
        if name in CUDA_FP32:
            cast = _cast(torch.float32, _HALF)
        elif name in CUDA_LOWER_ONLY:
            cast = _cast(torch.get_autocast_dtype("cpu"), (torch.float32, *_HALF))
        else:
            return func(*args, **kwargs)
        return func(*tree_map(cast, list(args)), **tree_map(cast, kwargs))


def autocast_dtype() -> torch.dtype | None:
    """CPU autocast's dtype where it is on (the dtype a CUDA run would compute in), else None.

    Example:
        >>> with torch.autocast("cpu", dtype=torch.bfloat16):
        ...     autocast_dtype()
        torch.bfloat16
    """
    return torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None
