"""The transformers code a GPU row was measured with, where it kept different memory from the installed release.

A row of ``benchmarks/results/cuda_truth.json`` records the transformers it ran (``row["transformers"]``); the CPU-made
estimate runs the installed one. Where the two releases' code differs in what a step keeps, the estimate of the row
runs the recorded release's code for that function, so that it estimates the program that was measured:

- ``create_position_bias_mask`` (``transformers.integrations.sdpa_attention``, the SDPA mask of T5, mT5, UMT5, LongT5,
  Switch Transformers, Pop2Piano, UDOP): up to 5.19 it returns the position bias as T5 made it, by ``permute``, so
  its last dimension is strided and CUDA's ``scaled_dot_product_attention`` refuses both fused kernels
  (``check_last_dim_stride_equals_1_dense``) and takes the math backend; from 5.20 it returns
  ``position_bias_mask.contiguous()`` and the memory-efficient kernel takes it. The H200 run of 2026-11-26 had 5.17.

Example:
    >>> with recorded_transformers("5.17.0"):
    ...     from transformers.integrations import sdpa_attention
    ...     sdpa_attention.create_position_bias_mask.__name__
    'create_position_bias_mask_up_to_5_19'
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from packaging.version import Version

CONTIGUOUS_BIAS = Version("5.20")
"""The first transformers whose ``create_position_bias_mask`` returns a contiguous mask."""
READ = Version("5.17")
"""The oldest release whose ``create_position_bias_mask`` was read here (5.17, 5.18, 5.19: the same function)."""


def create_position_bias_mask_up_to_5_19(
    position_bias: torch.Tensor, attention_mask: torch.Tensor | None, is_causal: bool, query: torch.Tensor,
    key: torch.Tensor,
) -> torch.Tensor:
    """transformers 5.17-5.19's ``create_position_bias_mask``, as it was (Apache-2.0, the HuggingFace team): the same
    as the installed one but for the last line's ``.contiguous()``."""
    min_dtype = torch.finfo(key.dtype).min
    if attention_mask is None:
        if is_causal:
            q_length, kv_length = query.shape[2], key.shape[2]
            causal_mask = (torch.arange(q_length, device=key.device)[:, None]
                           >= torch.arange(kv_length, device=key.device)[None, :])
            return torch.where(causal_mask.view(1, 1, q_length, kv_length), position_bias, min_dtype)
        return position_bias
    if attention_mask.dtype == torch.bool:
        return torch.where(attention_mask, position_bias, min_dtype)
    return position_bias + attention_mask


@contextlib.contextmanager
def recorded_transformers(version: str | None) -> Iterator[None]:
    """While active, the installed transformers runs ``version``'s code where the two differ in memory (see the
    module's docstring); nothing changes where ``version`` is None, keeps the same memory, or is older than the
    releases read (5.17)."""
    import transformers
    from transformers.integrations import sdpa_attention

    installed = Version(transformers.__version__)
    if version is None or not (READ <= Version(version) < CONTIGUOUS_BIAS <= installed):
        yield
        return
    original = sdpa_attention.create_position_bias_mask
    sdpa_attention.create_position_bias_mask = create_position_bias_mask_up_to_5_19
    try:
        yield
    finally:
        sdpa_attention.create_position_bias_mask = original
