"""What transformers decides from the values of a batch, which fake tensors hide, decided as a real step would.

transformers skips the attention mask where it can read that nothing is masked, and calls
``scaled_dot_product_attention`` with ``is_causal`` instead (``masking_utils``: ``_ignore_causal_mask_sdpa``,
``find_packed_sequence_indices``). On a fake tensor it cannot read values: it treats the step as traced, builds an
(L, L) boolean mask and takes the slower kernels' paths, on the CPU as on CUDA. Where the values are known without
reading them, a dry run takes the real step's branch:

- :func:`without_full_mask`: an ``attention_mask`` of all ones (given as a shape, or as a real tensor of ones) is left
  out of the batch, as transformers leaves it out;
- :func:`model_made_positions`: where the batch gives no ``position_ids`` (neither a dict batch nor a trainer's
  micro-batches), the model makes them itself, one sequence per row (``arange``), which is never a packed batch: the
  packed-sequence check answers so. Where they are given (TRL's packing and padding-free collators), the check runs
  on the fake ones and answers "packed", as transformers answers a traced step: the block-diagonal (L, L) mask is
  built and attention takes it, as in the real step of a packed batch (a given ``position_ids`` that packs nothing
  is estimated with that mask too: high, never low).

Example:
    >>> without_full_mask({"input_ids": (2, 8), "attention_mask": (2, 8)})
    ({'input_ids': (2, 8)}, True)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch._subclasses.fake_tensor import is_fake

from memlab.live.batch import StepBatches
from memlab.live.patching import patched

__all__ = ["FULL_MASK_DROPPED", "model_made_positions", "without_full_mask"]

FULL_MASK_DROPPED = (
    "attention_mask of all ones (or given as a shape) left out, as transformers leaves it out on real tensors "
    "(is_causal, grouped-query heads in the kernel)"
)
"""The note of a dry run whose batch's all-ones mask was left out."""


def without_full_mask(batch: Any) -> tuple[Any, bool]:
    """``batch`` without an ``attention_mask`` of all ones (a shape counts as all ones: nothing says otherwise),
    and whether one was left out.

    Example:
        >>> padded = torch.tensor([[1] * 8, [1] * 7 + [0]])
        >>> without_full_mask({"input_ids": torch.ones(2, 8), "attention_mask": padded})[1]
        False
    """
    if not isinstance(batch, Mapping) or "attention_mask" not in batch:
        return batch, False
    mask = batch["attention_mask"]
    if isinstance(mask, torch.Tensor) and (is_fake(mask) or mask.device.type == "meta" or not bool(mask.all())):
        return batch, False
    return {key: value for key, value in batch.items() if key != "attention_mask"}, True


@contextlib.contextmanager
def model_made_positions(batch: Any) -> Iterator[bool]:
    """While active, and where ``batch`` gives no ``position_ids``, transformers' packed-sequence check finds no
    packing in fake position ids (the model's own ``arange``); yields whether it is in force.

    Written as a scoped replacement of ``transformers.masking_utils.find_packed_sequence_indices`` because
    transformers has no switch for it: the original is put back on exit, and real tensors still go to it.

    Example:
        >>> with model_made_positions({"input_ids": (1, 4), "position_ids": (1, 4)}) as unpacked:
        ...     unpacked
        False
    """
    if _gives_positions(batch):
        yield False
        return
    try:
        from transformers import masking_utils
    except ImportError:  # a plain PyTorch model: nothing to decide
        yield False
        return
    original = getattr(masking_utils, "find_packed_sequence_indices", None)
    if original is None:  # a transformers without the check
        yield False
        return

    def unpacked(position_ids: torch.Tensor) -> torch.Tensor | None:
        return None if is_fake(position_ids) else original(position_ids)

    with patched(masking_utils, find_packed_sequence_indices=unpacked):
        yield True


def _gives_positions(batch: Any) -> bool:
    """Whether ``batch`` gives ``position_ids``: a batch's own key, or a trainer's micro-batches' (a padding-free or
    packed collator's, which :class:`~memlab.live.batch.StepBatches` makes; the plain micro-batch is made here if
    none was, and kept for the step)."""
    if isinstance(batch, StepBatches):
        try:
            return any(name == repr("position_ids") for name, _ in batch.tensors())
        except Exception:  # noqa: BLE001 - a collator that fails fails in the plan's own trial, said there
            return False
    return isinstance(batch, Mapping) and "position_ids" in batch
