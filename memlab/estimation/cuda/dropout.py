"""CUDA's dropout on a machine without CUDA: a one-byte mask kept for backward, not a float32 noise tensor.

``torch.dropout`` picks its kernel by device (``aten/src/ATen/native/Dropout.cpp``): where
``is_fused_kernel_acceptable`` holds (a CUDA tensor, ``0 < p < 1``, training, not in place) it runs
``native_dropout``, which keeps a boolean mask for backward; elsewhere, the CPU included, it multiplies by a noise
tensor of the input's dtype and keeps that. A dry run for ``device="cuda"`` on CPU kernels therefore keeps four bytes
per element where the GPU keeps one, for every dropout of the model (two per layer in BERT and GPT-2).
:class:`CudaDropout`, a ``TorchFunctionMode``, sends the calls CUDA would fuse to ``native_dropout`` during the fake
step. In-place dropout (``F.dropout(..., inplace=True)``) is not fused on CUDA either and is left alone.

Example:
    >>> from memlab.estimation.dryrun.fake import FakeMode
    >>> kept = []
    >>> with FakeMode(), CudaDropout(), torch.autograd.graph.saved_tensors_hooks(kept.append, lambda t: t):
    ...     x = torch.empty(4, 8, requires_grad=True)
    ...     y = torch.nn.functional.dropout(x, 0.1, training=True)
    >>> [t.dtype for t in kept]
    [torch.bool]
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch.nn import functional
from torch.overrides import TorchFunctionMode

__all__ = ["CudaDropout"]

# The two ways into the composite dropout: F.dropout (modules and most models) and torch.dropout (some models call
# it directly). F.dropout reaches torch.dropout below the mode, so each call is seen once.
_SIGNATURES: dict[Callable[..., Any], tuple[tuple[str, Any], ...]] = {
    functional.dropout: (("input", None), ("p", 0.5), ("training", True), ("inplace", False)),
    torch.dropout: (("input", None), ("p", None), ("train", None)),
}


class CudaDropout(TorchFunctionMode):
    """Dropout as CUDA runs it (see the module's docstring), while active."""

    def __torch_function__(
        self, func: Callable[..., Any], types: Sequence[type], args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
    ) -> Any:
        kwargs = dict(kwargs or {})
        signature = _SIGNATURES.get(func)
        if signature is None:
            return func(*args, **kwargs)
        bound = {name: default for name, default in signature}
        bound.update(zip((name for name, _ in signature), args, strict=False))
        bound.update(kwargs)
        tensor, p = bound["input"], bound["p"]
        training = bound.get("training", bound.get("train"))
        # torch takes any real number for p (a numpy float too), and only a bool for training: anything else is
        # left to torch, which refuses it as a CUDA run would.
        fused = (isinstance(tensor, torch.Tensor) and isinstance(p, numbers.Real) and not isinstance(p, bool)
                 and 0 < float(p) < 1 and training is True and not bound.get("inplace", False) and tensor.numel() > 0)
        if not fused:
            return func(*args, **kwargs)  # torch's own path, and its own error for a bad p
        return torch.ops.aten.native_dropout(tensor, float(p), True)[0]
